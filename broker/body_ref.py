"""The runtime's handle on a message's header and body in a worker's arena, packed into one int.

The domain never looks inside ``Message.body_ref``; the dispatcher packs it on publish and
unpacks it to free the body or to list the offsets still live in a region.
"""

from __future__ import annotations

from ipc.logfile import BODY_OVERHEAD

# A message's body handle (Message.body_ref, opaque to the domain) packs where its header and
# body sit into one int: ((offset * 2**24 + header_len) * 2**32 + body_len) * 2**16 + region.
# A tuple of four ints cost 104 bytes per queued message, the int costs 36-40 (S8).
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



# A paged-out body's handle (broker.paging) is negative: ~(the fields below, packed), so one
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
    """The body size a handle records, in the arena or paged out (a plain queue keeps a waiting
    message as its handle alone and reads its size back: broker.fifo_entries)."""
    if ref < 0:
        return (~ref >> _P_BODY) & _BODY_MASK
    return (ref >> _BODY_SHIFT) & _BODY_MASK


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
