"""The runtime's handle on a message's header and body in a worker's arena, packed into one int.

The domain never looks inside ``Message.body_ref``; the dispatcher packs it on publish and
unpacks it to free the body or to list the offsets still live in a region.
"""

from __future__ import annotations

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


def paged_body_ref(ref: int) -> int:
    """The handle of a body paged out of its arena (``broker.paging``): negative, so it can be
    told apart with one comparison, and keeping the region and the header and body sizes."""
    region, _, header_len, body_len = unpack_body_ref(ref)
    return ~pack_body_ref(region, 0, header_len, body_len)


def unpack_paged_ref(ref: int) -> tuple[int, int, int]:
    """(region, header_len, body_len) of a paged handle."""
    region, _, header_len, body_len = unpack_body_ref(~ref)
    return region, header_len, body_len
