"""Loss, duplicate and reordering accounting across consumers, and latency percentiles.

A consumer process (see `perf.loadgen`) hands back, per publisher id, a bytearray with one byte per
sequence number: 1 if that message arrived at least once. Consumers that share a queue form a
*group* (S3's 8 competing consumers are one group; S4's 8 fanout queues are 8 groups): every
message a publisher routed to the group's queue must reach exactly one of them, exactly once.

- lost = published - distinct sequences seen by the group;
- duplicates = arrivals of a sequence already seen by the same consumer (counted by the parser)
  plus sequences seen by more than one consumer of the group;
- reordered = arrivals, per consumer and publisher, below the highest sequence that consumer had
  already seen from that publisher (a consumer's share of one queue must stay in order).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any


def bitmap(marks: bytes | bytearray, upto: int) -> int:
    """The first `upto` marks (bytes 0/1) as an int whose set bits are the arrivals.

    OR-ing these merges consumers; `int.bit_count` counts distinct arrivals. Each mark is a whole
    byte (0 or 1), so the OR of byte-wise ints is the byte-wise OR.
    """
    return int.from_bytes(bytes(marks[:upto]), "little")


def merge_group(consumers: Sequence[dict[str, Any]], published: dict[int, int]) -> dict[str, int]:
    """Merge the results of the consumers of one queue against what was published to it.

    `published` maps each publisher id routed to this queue to how many messages it sent.
    """
    expected = sum(published.values())
    distinct = 0
    overlap = 0
    beyond = 0
    for pub, count in published.items():
        union = 0
        marks_total = 0
        for consumer in consumers:
            seen = consumer["seen"][pub] if pub < len(consumer["seen"]) else b""
            upto = min(count, len(seen))
            if not upto and not seen:
                continue
            bits = bitmap(seen, upto)
            union |= bits
            marks_total += bits.bit_count()
            beyond += seen[count:].count(1)
        got = union.bit_count()
        distinct += got
        overlap += marks_total - got
    return {
        "expected": expected,
        "distinct": distinct,
        "lost": expected - distinct,
        "duplicates": overlap + sum(int(c.get("duplicates", 0)) for c in consumers),
        "reordered": sum(int(c.get("reordered", 0)) for c in consumers),
        "redelivered": sum(int(c.get("redelivered", 0)) for c in consumers),
        "foreign": sum(int(c.get("foreign", 0)) for c in consumers) + beyond,
        "received": sum(int(c.get("received", 0)) for c in consumers),
    }


def percentile(sorted_values: Sequence[int], fraction: float) -> int | None:
    """Nearest-rank percentile of already sorted values (None when there are none)."""
    if not sorted_values:
        return None
    rank = max(1, -(-round(fraction * 1_000_000) * len(sorted_values) // 1_000_000))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(chunks: Iterable[bytes | array]) -> dict[str, float | int | None]:
    """p50/p90/p99/p99.9/max (milliseconds) of the microsecond latencies in `chunks`."""
    values: array = array("q")
    for chunk in chunks:
        if isinstance(chunk, array):
            values.extend(chunk)
        else:
            values.frombytes(chunk)
    ordered = sorted(values)
    out: dict[str, float | int | None] = {"count": len(ordered)}
    for label, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("max", 1.0)):
        value = percentile(ordered, fraction)
        out[f"{label}_ms"] = round(value / 1000, 3) if value is not None else None
    return out
