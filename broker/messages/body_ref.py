"""The runtime's handle on a message's header and body in a worker's arena, packed into one int.

The domain never looks inside ``Message.body_ref``; the dispatcher packs it on publish and
unpacks it to free the body or to list the offsets still live in a region.
"""

from __future__ import annotations

from ipc.logfile import BODY_OVERHEAD

# A message's body handle (Message.body_ref, opaque to the domain) packs where its header and
# body sit into one int: ((offset * 2**24 + header_len) * 2**32 + body_len) * 2**16 + region.
# One int per queued message, not a tuple of four: S8's queues hold millions (perf/README.md).
_REGION_BITS, _BODY_BITS, _HEADER_BITS = 16, 32, 24
_REGION_MASK = (1 << _REGION_BITS) - 1
_BODY_MASK = (1 << _BODY_BITS) - 1
_HEADER_MASK = (1 << _HEADER_BITS) - 1
_BODY_SHIFT = _REGION_BITS
_HEADER_SHIFT = _REGION_BITS + _BODY_BITS
_OFFSET_SHIFT = _HEADER_SHIFT + _HEADER_BITS


def pack_body_ref(region: int, offset: int, header_len: int, body_len: int) -> int:
    """The fields fit by construction: at most 256 workers, a content header within
    frame_max (at most 2**24), a body within max_message_size (at most 512 MiB)."""
    return (offset << _OFFSET_SHIFT) | (header_len << _HEADER_SHIFT) | (body_len << _BODY_SHIFT) | region


def unpack_body_ref(ref: int) -> tuple[int, int, int, int]:
    """(region, offset, header_len, body_len) of a packed handle."""
    return (ref & _REGION_MASK, ref >> _OFFSET_SHIFT, (ref >> _HEADER_SHIFT) & _HEADER_MASK,
            (ref >> _BODY_SHIFT) & _BODY_MASK)



# A paged-out body's handle (broker.storage.paging) is negative: ~(the fields below, packed), so one
# comparison tells it apart. It says where the body is in the body log (worker, segment,
# offset of its frame) besides the region and sizes; the frame's length follows from the sizes.
# Bits, low to high: region 16, header_len 24, body_len 32, worker 16, segment 32, offset 32.
_P_HEADER = _REGION_BITS
_P_BODY = _P_HEADER + _HEADER_BITS
_P_WORKER = _P_BODY + _BODY_BITS
_P_SEGMENT = _P_WORKER + 16
_P_OFFSET = _P_SEGMENT + 32
_MASK16 = (1 << 16) - 1
_MASK32 = (1 << 32) - 1


def body_len(ref: int) -> int:
    """The body size a handle records, in the arena or paged out."""
    if ref < 0:
        return (~ref >> _P_BODY) & _BODY_MASK
    return (ref >> _BODY_SHIFT) & _BODY_MASK


# A handle as two unsigned 64-bit words (lo, hi), for storage only: a plain queue keeps a
# waiting message as those alone (broker.queues.fifo_entries; 16 bytes where the int costs 40-48).
# An arena handle is under 2**127: hi's top bit clear, the int split in two. A paged one is
# re-packed -- lo: offset | body_len << 32; hi: header_len | region << 24 | worker << 32 |
# segment << 40 | 1 << 63 -- when region and worker are under 256 (so are --workers) and the
# segment under 2**23 (512 TiB of segments); otherwise it stays an int.
_M64 = (1 << 64) - 1
_WORD_PAGED = 1 << 63
_W_SEGMENT_LIMIT = 1 << 23


def handle_words(ref: int) -> tuple[int, int] | None:
    """``ref`` as (lo, hi), or None when it does not fit (see above)."""
    if ref >= 0:
        return (ref & _M64, ref >> 64) if ref < _WORD_PAGED << 64 else None
    region, header_len, body_len, worker, segment, offset = unpack_paged_ref(ref)
    if region > 255 or worker > 255 or segment >= _W_SEGMENT_LIMIT or offset > _MASK32:
        return None
    return offset | body_len << 32, header_len | region << 24 | worker << 32 | segment << 40 | _WORD_PAGED


def words_handle(lo: int, hi: int) -> int:
    """The handle :func:`handle_words` made (lo, hi) of."""
    if not hi & _WORD_PAGED:
        return hi << 64 | lo
    return paged_body_ref((hi >> 24) & 255, hi & _HEADER_MASK, lo >> 32, (hi >> 32) & 255,
                          (hi >> 40) & (_W_SEGMENT_LIMIT - 1), lo & _MASK32)


class ArenaBodyCodec:
    """What a plain queue may ask of the runtime's body handles (``broker.queues.queue_host.BodyCodec``):
    their size, and the handle as two words and back."""

    size = staticmethod(body_len)
    words = staticmethod(handle_words)
    handle = staticmethod(words_handle)


ARENA_BODY_CODEC = ArenaBodyCodec()


def arena_block(ref: int) -> tuple[int, int] | None:
    """(region, offset) of the arena block a handle names; None for a paged-out body."""
    if ref < 0:
        return None
    return ref & _REGION_MASK, ref >> _OFFSET_SHIFT


def paged_body_ref(region: int, header_len: int, body_len: int, worker: int, segment: int,
                   offset: int) -> int:
    """The handle of a body paged out to ``worker``'s body log, segment ``segment``, frame at
    ``offset`` (``ipc.logfile.BodyLog.append``'s answer)."""
    return ~(region | header_len << _P_HEADER | body_len << _P_BODY | worker << _P_WORKER
             | segment << _P_SEGMENT | offset << _P_OFFSET)


def unpack_paged_ref(ref: int) -> tuple[int, int, int, int, int, int]:
    """(region, header_len, body_len, worker, segment, offset) of a paged handle."""
    p = ~ref
    return (p & _REGION_MASK, (p >> _P_HEADER) & _HEADER_MASK, (p >> _P_BODY) & _BODY_MASK,
            (p >> _P_WORKER) & _MASK16, (p >> _P_SEGMENT) & _MASK32, p >> _P_OFFSET)


def body_log_at(ref: int) -> tuple[int, int, int, int]:
    """(worker, segment, offset, length) of a paged body's frame in the body log."""
    _, header_len, body_len, worker, segment, offset = unpack_paged_ref(ref)
    return worker, segment, offset, header_len + body_len + BODY_OVERHEAD
