"""Every worker's arena as one worker sees it (workers.arenas)."""

from __future__ import annotations

from ipc.region import Region
from tests.ipc.test_region import mapped_rss_kb, unique_name
from workers.arenas import Arenas


def test_forget_foreign_pages_unmaps_the_other_arenas_read_and_keeps_its_own() -> None:
    """A consumer's worker reads bodies another worker's publisher stored; once a second it
    drops those pages from its RSS. Its own arena stays mapped, and a foreign body still reads."""
    names = [unique_name(worker=0), unique_name(worker=1)]
    sizes = {"ring_bytes": 4096, "slots": 16, "arena_bytes": 8 << 20}
    own, other = (Region.create(name, **sizes) for name in names)
    arenas = Arenas(own, 0, names)
    try:
        stored = []
        for region in (own, other):
            offsets = [region.arena.alloc(4000) for _ in range(1000)]
            for i, at in enumerate(offsets):
                region.arena.view(at, 4000)[:4] = i.to_bytes(4, "little")
            stored.append(offsets)
        for at in stored[1]:  # deliveries of the other worker's bodies
            assert len(bytes(arenas.region(1).arena.view(at, 4000))) == 4000
        own_before, other_before = mapped_rss_kb(names[0]), mapped_rss_kb(names[1])
        arenas.forget_foreign_pages()
        assert mapped_rss_kb(names[0]) == own_before
        assert other_before - mapped_rss_kb(names[1]) > 3 << 10  # this worker's mapping of it
        assert bytes(arenas.region(1).arena.view(stored[1][7], 4)) == (7).to_bytes(4, "little")
    finally:
        arenas.region(1).close()
        for region in (own, other):
            region.close()
            region.unlink()
