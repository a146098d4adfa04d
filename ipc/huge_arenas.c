/* Python's small-object arenas on transparent huge pages (ipc/huge_pages.py loads this with
 * ctypes and hands these two functions to PyObject_SetArenaAllocator).
 *
 * pymalloc takes its memory in arenas of 1 MiB, each its own mmap, which the kernel cannot
 * back with 2 MiB pages. Here they are carved, one after the other, from one region reserved
 * at start: 2 MiB-aligned, advised MADV_HUGEPAGE, PROT_NONE until used and then opened 2 MiB
 * at a time (not charged to the commit limit before it is used), so each 2 MiB of arenas is
 * one page and one TLB entry. A freed arena of the region goes on a free list for the next;
 * past KEEP_FREE of them its memory goes back to the system (MADV_DONTNEED). When the region
 * is used up, or an arena of another size is asked for, arenas are plain mmaps again; an arena
 * that is not the region's (made before the switch, or one of those) is unmapped as CPython's
 * default allocator does.
 *
 * Called only by pymalloc, under the GIL: no locking. */

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define KEEP_FREE 16

static char *region_start, *region_next, *region_end;
static char *region_open; /* readable and writable up to here: whole 2 MiB pages, so that the
                             first touch of each faults in a huge page, not a 4 KiB one */
static void *free_arenas; /* each freed arena's first word points to the next */
static size_t arena_size, free_count;

/* Reserve `bytes` (a multiple of 2 MiB) of address space: 0, or -1 when it cannot be had,
 * -2 when the kernel refuses MADV_HUGEPAGE (no transparent huge pages). */
int huge_arenas_reserve(size_t bytes)
{
    size_t len = bytes + HUGE_PAGE;
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    char *start = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    char *end = start + bytes;
    if (start > p)
        munmap(p, (size_t)(start - p));
    if (p + len > end)
        munmap(end, (size_t)(p + len - end));
    if (madvise(start, bytes, MADV_HUGEPAGE) != 0) {
        munmap(start, bytes);
        return -2;
    }
    region_start = region_next = region_open = start;
    region_end = end;
    return 0;
}

/* Make the region usable up to `end`, in whole 2 MiB pages: 1, or 0 when mprotect fails. */
static int open_to(char *end)
{
    if (end <= region_open)
        return 1;
    size_t more = ((size_t)(end - region_open) + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    if (region_open + more > region_end)
        more = (size_t)(region_end - region_open);
    if (mprotect(region_open, more, PROT_READ | PROT_WRITE) != 0)
        return 0;
    region_open += more;
    return 1;
}

void *huge_arenas_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (free_arenas != NULL && size == arena_size) {
        void *arena = free_arenas;
        free_arenas = *(void **)arena;
        free_count--;
        return arena;
    }
    if (region_start != NULL && (arena_size == 0 || size == arena_size)
            && (size_t)(region_end - region_next) >= size && open_to(region_next + size)) {
        void *arena = region_next;
        arena_size = size;
        region_next += size;
        return arena;
    }
    void *arena = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return arena == MAP_FAILED ? NULL : arena;
}

void huge_arenas_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if ((char *)ptr >= region_start && (char *)ptr < region_end) {
        if (free_count >= KEEP_FREE)
            madvise(ptr, size, MADV_DONTNEED); /* zero-filled when next touched */
        *(void **)ptr = free_arenas;
        free_arenas = ptr;
        free_count++;
        return;
    }
    munmap(ptr, size);
}

/* For the tests: arenas handed out from the region so far, and freed ones kept. */
size_t huge_arenas_used(void) { return (size_t)(region_next - region_start); }
size_t huge_arenas_free_count(void) { return free_count; }
