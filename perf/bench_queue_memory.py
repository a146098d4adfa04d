"""What the supervisor holds per queued message: bytes per message, by tracemalloc.

In-process: a :class:`broker.runtime.dispatch.Dispatcher` is fed publish records the way the runtime
feeds it (batches of 1,024, 128-byte bodies, one queue, default exchange), and tracemalloc
counts what the supervisor's Python heap grew by, divided by the messages queued. Two shapes:

- ``in-arena``: bodies stay in the workers' arenas (no paging: the arena holds them all);
- ``paged``: paging on with a small mark, so nearly every body is paged out (the bench answers
  each ``PageOut`` as a worker does, with a ``PagedOut`` naming a place in its body log) --
  the shape of a queue far longer than memory (Durability: 10,000,000 queued messages).

The arenas themselves (the bodies) are not the supervisor's and are not counted here; ``python
-m perf --scenarios S8`` measures the whole broker.

    .venv/bin/python -m perf.bench_queue_memory               # 1,000,000 messages each
    .venv/bin/python -m perf.bench_queue_memory -n 200000

Figures to read, never assertions.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from broker.runtime.dispatch import Dispatcher
from ipc import records as r

W = 0
CONN, CH = 1, 1
BATCH = 1024  # records per ring batch, as broker.runtime.supervisor.BATCH
SIZE = 16 + 128  # content header + body


def run(n: int, *, paged: bool) -> float:
    d = Dispatcher(1, lambda region, offset: None, now=time.monotonic())
    if paged:
        d.pager.set_marks(high_watermark=4096 * SIZE)  # page past 2,048 messages
    d.begin_batch(time.monotonic())
    d.handle(W, r.QueueDeclare(CONN, CH, "q", False, False, False, False, {}, False))
    d.end_batch()
    d.outbox[W].clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    segment_at = 0
    for start in range(0, n, BATCH):
        d.begin_batch(time.monotonic())
        for i in range(start, min(n, start + BATCH)):
            d.handle(W, r.Publish(CONN, CH, "", "q", False, False, (i + 1) * 256, 16, 128, None))
        d.end_batch()
        d.notify[W].clear()
        # The worker's answers (appended to segment 1 of its body log), until the pager is
        # under its mark again: a real publisher would wait for room in the arena meanwhile.
        while pageouts := [e for e in d.outbox[W] if isinstance(e, r.PageOut)]:
            d.outbox[W].clear()
            d.begin_batch(time.monotonic())
            for request in pageouts:
                written = []
                for offset, header_len, body_len in request.bodies:
                    written.append((offset, 1, segment_at))
                    segment_at += header_len + body_len + 12
                d.handle(W, r.PagedOut(written))
            d.end_batch()
        d.outbox[W].clear()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    queued = d.vhost.queues["q"].message_count
    assert queued == n, (queued, n)
    return (after - before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="messages per shape")
    args = parser.parse_args()
    print(f"{'shape':<10} {'messages':>10} {'bytes/message':>14}")
    for name, paged in (("in-arena", False), ("paged", True)):
        print(f"{name:<10} {args.n:>10,} {run(args.n, paged=paged):>14.1f}")


if __name__ == "__main__":
    main()
