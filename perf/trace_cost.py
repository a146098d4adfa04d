"""What tracing costs the broker: ns per traced row of each hot hook, and bytes per message.

    python -m perf.trace_cost

prints the cost per row of each :class:`tracing.writer.ArrowTraceWriter` method on this machine
(0.25–1 µs, flushing included) and the disk one message's rows take (about 300 bytes).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tracing import schema as ts
from tracing.writer import ArrowTraceWriter

# Names as a real run has them (perf.quick's queue through the default exchange, pika's consumer
# tag): the strings are most of a row, so the bytes per message depend on them.
_BENCH_QUEUE = "perf.quick.3239"
_BENCH_TAG = "ctag1.0c7092bd635d49cca9636015dc555be8"


def bench(rows: int = 200_000, directory: str | None = None) -> dict[str, float]:
    """Cost per traced row of each hot method, flushing included (ns/row), in this process; and
    ``bytes_per_message``: the disk taken by one message's rows (publish, deliver, ack, settle)."""
    import tempfile

    results: dict[str, float] = {}
    q, tag = _BENCH_QUEUE, _BENCH_TAG
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        w = ArrowTraceWriter(tmp, "bench", worker=0)
        calls: dict[str, Callable[[int], object]] = {
            "published": lambda i: w.published(i, 1, 1, "", q, 128),
            "delivered": lambda i: w.delivered(i, i, q, 7, tag, False),
            "acked": lambda i: w.acked(i, i),
            "settled": lambda i: w.settled(i, ts.ACKED, i, i, q, 0, 1, i, 0, 7, 0, i, None, i),
            "notify_event": lambda i: w.notify_event(i, q, 0, 7),
        }
        loop = time.perf_counter()
        for _ in range(rows):
            pass
        empty = time.perf_counter() - loop
        for name, call in calls.items():
            w.flush_seconds = 0.0
            started = time.perf_counter()
            maybe_flush = w.maybe_flush
            for i in range(rows):
                call(i)
                if not i & 63:  # the runtime calls maybe_flush once per loop pass, not per row
                    maybe_flush(i * 1000)
            w.flush()
            total = time.perf_counter() - started - empty
            results[name] = total / rows * 1e9
            results[name + ".flush_share"] = w.flush_seconds / total
        w.close()
        per_message = sum(p.stat().st_size for p in w.paths if p.name.startswith(ts.MESSAGES + "-"))
        results["bytes_per_message"] = per_message / rows
    return results


if __name__ == "__main__":
    for key, value in bench().items():
        unit = {"share": "", "message": " bytes"}.get(key.rpartition("_")[2], " ns/row")
        print(f"{key:28s} {value:8.3f}{unit}")
