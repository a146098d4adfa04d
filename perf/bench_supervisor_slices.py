"""How long one supervisor operation can hold the supervisor: purge, delete, a TTL burst.

In-process: a :class:`broker.runtime.dispatch.Dispatcher` is fed records the way the runtime feeds it
(``begin_batch`` / ``handle`` / ``end_batch`` for requests, ``tick`` for the timer), with a
fake arena that counts frees (and raises on a double free). For each scenario it prints the
longest single call -- the request that starts the work, or one timer tick finishing it -- the
number of calls, their total, and checks that every body was freed exactly once.

The objects made while filling the queue are frozen out of the cyclic garbage collector
(``gc.freeze``) and automatic collection is off during the timed calls: a full collection of a
few million objects -- which any allocation may trigger in the supervisor, and which costs
hundreds of milliseconds -- would otherwise land in whichever call happens to run then and
hide what the call itself costs. ``--keep-gc`` leaves the collector as it is, to see that.

    .venv/bin/python -m perf.bench_supervisor_slices                 # 1,000,000 messages each
    .venv/bin/python -m perf.bench_supervisor_slices -n 200000 -s purge-plain,ttl-burst

Timings are figures to read, never assertions.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Iterable

from broker.runtime.dispatch import Dispatcher
from broker.runtime.supervisor import STEP_WORK
from ipc import records as r

W = 0
CONN, CH = 1, 1
PUBLISH_BATCH = 1024  # records per ring batch, as broker.runtime.supervisor.BATCH
FREEZE = True  # --keep-gc: False


class Arena:
    """Counts frees per block; a second free of the same block is an error, as in ipc.arena."""

    def __init__(self, n: int) -> None:
        self.freed = bytearray(n + 1)
        self.count = 0

    def free(self, region: int, offset: int) -> None:
        index = offset >> 8
        if self.freed[index]:
            raise AssertionError(f"block {offset} freed twice")
        self.freed[index] = 1
        self.count += 1


class Bench:
    def __init__(self, n: int) -> None:
        self.n = n
        self.arena = Arena(n)
        self.t0 = time.monotonic()
        self.d = Dispatcher(1, self.arena.free, now=self.t0)
        self.calls: list[float] = []

    def batch(self, records: list[r.Request], now: float) -> None:
        d = self.d
        d.begin_batch(now)
        for rec in records:
            d.handle(W, rec)
        d.end_batch()
        d.outbox[W].clear()
        d.notify[W].clear()

    def set_up(self, records: Iterable[r.Request]) -> None:
        """Apply ``records`` (untimed) in ring-sized batches."""
        pending = list(records)
        for i in range(0, len(pending), PUBLISH_BATCH):
            self.batch(pending[i:i + PUBLISH_BATCH], self.t0)

    def declare(self, name: str, arguments: dict | None = None, *, exclusive: bool = False,
                conn: int = CONN) -> None:
        self.batch([r.QueueDeclare(conn, CH, name, False, False, exclusive, False,
                                   arguments or {}, False)], self.t0)

    def fill(self, queue: str, *, expiration: str | None = None, conn: int = CONN) -> None:
        pending: list[r.Request] = []
        for i in range(1, self.n + 1):
            pending.append(r.Publish(conn, CH, "", queue, False, False, i << 8, 16, 128, None,
                                     expiration))
            if len(pending) == PUBLISH_BATCH:
                self.batch(pending, self.t0)
                pending = []
        if pending:
            self.batch(pending, self.t0)

    def ready(self) -> None:
        """The queue is filled: what follows is timed."""
        if FREEZE:
            gc.collect()
            gc.freeze()
            gc.disable()

    def timed(self, call: Callable[[], object]) -> object:
        start = time.perf_counter()
        result = call()
        self.calls.append(time.perf_counter() - start)
        return result

    def publish_in_steps(self, runs: list[r.Publish | r.PublishRun]) -> None:
        """Each publish record, and each step of what a step's limit (STEP_WORK) left of it,
        one timed call, as the runtime's ``_apply`` goes on with a stopped run."""
        d = self.d

        def step(rec: r.Publish | r.PublishRun | None) -> None:
            d.begin_batch(self.t0)
            d.work, d.work_limit = 0, STEP_WORK
            if rec is None:
                d.resume_run(W)
            else:
                d.handle(W, rec)
            d.end_batch()
            d.outbox[W].clear()
            d.notify[W].clear()

        for run in runs:
            self.timed(lambda run=run: step(run))  # type: ignore[misc]
            while d.run_pending(W):
                self.timed(lambda: step(None))

    def request(self, rec: r.Request, now: float) -> None:
        self.timed(lambda: self.batch([rec], now))

    def run_timer(self, now: float) -> None:
        """Tick as the runtime's timer does while the next deadline has come."""
        while True:
            deadline = self.timed(lambda: self.d.tick(now))
            self.d.outbox[W].clear()
            self.d.notify[W].clear()
            if deadline is None or deadline > now:  # type: ignore[operator]
                return

    def report(self, name: str, expect_freed: int) -> None:
        calls = sorted(self.calls)
        median = calls[len(calls) // 2]
        p99 = calls[min(len(calls) - 1, len(calls) * 99 // 100)]
        print(f"{name:<22} longest {calls[-1] * 1e3:8.2f} ms  p99 {p99 * 1e3:8.2f} ms  "
              f"median {median * 1e3:8.2f} ms  calls {len(calls):5d}  total {sum(calls):6.2f} s  "
              f"freed {self.arena.count:>9,}"
              f"{'' if self.arena.count == expect_freed else f' (expected {expect_freed:,})'}",
              flush=True)


def purge(n: int, arguments: dict | None) -> Bench:
    b = Bench(n)
    b.declare("q", arguments)
    b.fill("q")
    b.ready()
    now = b.t0 + 1
    b.request(r.QueuePurge(CONN, CH, "q", False), now)
    b.run_timer(now)
    return b


def delete(n: int, arguments: dict | None) -> Bench:
    b = Bench(n)
    b.declare("q", arguments)
    b.fill("q")
    b.ready()
    now = b.t0 + 1
    b.request(r.QueueDelete(CONN, CH, "q", False, False, False), now)
    b.run_timer(now)
    return b


def exclusive_on_close(n: int) -> Bench:
    """A connection closes: its exclusive queue of n messages goes with it."""
    b = Bench(n)
    b.declare("q", exclusive=True, conn=2)
    b.fill("q", conn=2)
    b.ready()
    now = b.t0 + 1
    b.request(r.ConnClose(2), now)
    b.run_timer(now)
    return b


def ttl_burst(n: int, dead_letter: bool, width: int = 1) -> Bench:
    """n messages with x-message-ttl 1 s, all published at t0: all due at t0 + 1 s; with
    ``dead_letter``, to a fanout exchange bound to ``width`` queues."""
    b = Bench(n)
    arguments: dict = {"x-message-ttl": 1000}
    if dead_letter:
        b.batch([r.ExchangeDeclare(CONN, CH, "dlx", "fanout", False, False, False, False, {},
                                   False)], b.t0)
        for i in range(width):
            b.declare(f"dlq{i}")
        b.set_up(r.QueueBind(CONN, CH, f"dlq{i}", "dlx", "", {}, False) for i in range(width))
        arguments["x-dead-letter-exchange"] = "dlx"
    b.declare("q", arguments)
    b.fill("q")
    b.ready()
    b.run_timer(b.t0 + 2)
    if dead_letter:
        dlq = b.d.vhost.queues[f"dlq{width - 1}"]
        assert dlq.message_count == n, dlq.message_count
    return b


def unacked_on_close(n: int) -> Bench:
    """A consumer without prefetch holds n unacked messages; its connection closes."""
    b = Bench(n)
    b.declare("q")
    b.fill("q")
    b.batch([r.Consume(CONN, CH, 1, 0, "q", "c", False, False, 0, False, True, False)], b.t0)
    for _ in range(0, n, 1000):
        b.batch([r.Pull(1, 1000)], b.t0)
    b.ready()
    now = b.t0 + 1
    b.request(r.ConnClose(CONN), now)
    b.run_timer(now)
    assert b.d.vhost.queues["q"].message_count == n
    return b


def fanout_wide(n: int, queues: int = 1000, per_run: int = 64) -> Bench:
    """Runs of ``per_run`` publishes to a fanout exchange bound to ``queues`` queues: n routed
    copies in all (n // queues messages), each timed call one step of the runtime's
    (STEP_WORK). With ``per_run`` 1, each message is a Publish record of its own."""
    b = Bench(n)
    b.batch([r.ExchangeDeclare(CONN, CH, "fx", "fanout", False, False, False, False, {}, False)],
            b.t0)
    for i in range(queues):
        b.declare(f"q{i}")
        b.batch([r.QueueBind(CONN, CH, f"q{i}", "fx", "", {}, False)], b.t0)
    b.ready()
    messages = max(1, n // queues)
    runs: list[r.Publish | r.PublishRun] = [
        r.PublishRun(CONN, CH, "fx", "", False, False,
                     [x for i in range(start, min(start + per_run, messages))
                      for x in ((i + 1) << 8, 16, 128)])
        if per_run > 1 else r.Publish(CONN, CH, "fx", "", False, False, (start + 1) << 8, 16, 128,
                                      None)
        for start in range(0, messages, per_run)]
    b.publish_in_steps(runs)
    assert b.d.vhost.queues[f"q{queues - 1}"].message_count == messages
    return b


def exchange_walk(n: int, per_run: int = 64) -> Bench:
    """A fanout exchange bound to n // 100 fanout exchanges, each bound to one queue: runs of
    ``per_run`` publishes, 10 of them, each walking every exchange (RabbitMQ's route)."""
    b = Bench(n)
    middle = n // 100
    fanout = [r.ExchangeDeclare(CONN, CH, name, "fanout", False, False, False, False, {}, False)
              for name in ["x", *(f"x{i}" for i in range(middle))]]
    b.set_up(fanout)
    b.declare("q")
    b.set_up(r.ExchangeBind(CONN, CH, f"x{i}", "x", "", {}, False) for i in range(middle))
    b.set_up(r.QueueBind(CONN, CH, "q", f"x{i}", "", {}, False) for i in range(middle))
    b.ready()
    b.publish_in_steps([
        r.PublishRun(CONN, CH, "x", "", False, False,
                     [x for i in range(run * per_run, (run + 1) * per_run)
                      for x in ((i + 1) << 8, 16, 128)])
        for run in range(10)])
    assert b.d.vhost.queues["q"].message_count == 10 * per_run
    return b


def exchange_delete(n: int) -> Bench:
    """exchange.delete of a direct exchange bound to n // 20 queues (one key each): the
    request, then the timer's ticks while its bindings go."""
    b = Bench(n)
    b.batch([r.ExchangeDeclare(CONN, CH, "dx", "direct", False, False, False, False, {}, False)],
            b.t0)
    for i in range(n // 20):
        b.declare(f"q{i}")
        b.batch([r.QueueBind(CONN, CH, f"q{i}", "dx", f"k{i}", {}, False)], b.t0)
    b.ready()
    now = b.t0 + 1
    b.request(r.ExchangeDelete(CONN, CH, "dx", False, False), now)
    b.run_timer(now)
    assert "dx" not in b.d.vhost.exchanges
    return b


def queue_delete(n: int) -> Bench:
    """queue.delete of a queue bound n // 20 times to a topic exchange: the request, then the
    timer's ticks while the bindings go."""
    b = Bench(n)
    b.batch([r.ExchangeDeclare(CONN, CH, "tx", "topic", False, False, False, False, {}, False)],
            b.t0)
    b.declare("q")
    for i in range(n // 20):
        b.batch([r.QueueBind(CONN, CH, "q", "tx", f"a.b{i}.#", {}, False)], b.t0)
    b.ready()
    now = b.t0 + 1
    b.request(r.QueueDelete(CONN, CH, "q", False, False, False), now)
    b.run_timer(now)
    assert "q" not in b.d.vhost.queues and not b.d.vhost.exchanges["tx"].has_bindings
    return b


def queue_delete_sources(n: int) -> Bench:
    """queue.delete of a queue bound once by each of n // 20 fanout exchanges."""
    b = Bench(n)
    b.declare("q")
    for i in range(n // 20):
        b.batch([r.ExchangeDeclare(CONN, CH, f"fx{i}", "fanout", False, False, False, False, {}, False),
                 r.QueueBind(CONN, CH, "q", f"fx{i}", "", {}, False)], b.t0)
    b.ready()
    now = b.t0 + 1
    b.request(r.QueueDelete(CONN, CH, "q", False, False, False), now)
    b.run_timer(now)
    assert not any(x.is_bound("q") for x in b.d.vhost.exchanges.values())
    return b


def exchange_delete_destination(n: int, sources: int) -> Bench:
    """exchange.delete of an exchange that n // 20 exchange-to-exchange bindings lead to, from
    ``sources`` direct exchanges (keys k0, k1, ... each)."""
    b = Bench(n)
    b.batch([r.ExchangeDeclare(CONN, CH, "dest", "fanout", False, False, False, False, {}, False)],
            b.t0)
    per_source = max(1, n // 20 // sources)
    for i in range(sources):
        b.batch([r.ExchangeDeclare(CONN, CH, f"sx{i}", "direct", False, False, False, False, {}, False)]
                + [r.ExchangeBind(CONN, CH, "dest", f"sx{i}", f"k{j}", {}, False) for j in range(per_source)],
                b.t0)
    b.ready()
    now = b.t0 + 1
    b.request(r.ExchangeDelete(CONN, CH, "dest", False, False), now)
    b.run_timer(now)
    assert not any(x.has_bindings for name, x in b.d.vhost.exchanges.items() if name.startswith("sx"))
    return b


def close_exclusive_many(n: int) -> Bench:
    """A connection owning n // 50 exclusive queues closes."""
    b = Bench(n)
    for i in range(n // 50):
        b.declare(f"e{i}", exclusive=True, conn=2)
    b.ready()
    now = b.t0 + 1
    b.request(r.ConnClose(2), now)
    b.run_timer(now)
    assert not b.d.vhost.queues_owned_by((W, 2))
    return b


def close_consumers(n: int, channels: int, queues: int) -> Bench:
    """A connection with n // 50 consumers over ``channels`` channels and ``queues`` queues
    closes (``channels`` 1: a channel.close; 0: one channel, and its queue is deleted)."""
    b = Bench(n)
    for q in range(queues):
        b.declare(f"c{q}")
    b.set_up(r.Consume(2, 1 + i % max(channels, 1), i + 1, i, f"c{i % queues}", f"t{i}",
                       False, False, 0, False, True, False) for i in range(n // 50))
    b.ready()
    now = b.t0 + 1
    if channels:
        b.request(r.ChanClose(2, 1) if channels == 1 else r.ConnClose(2), now)
    else:  # the queue is deleted under them
        b.request(r.QueueDelete(CONN, CH, "c0", False, False, False), now)
    b.run_timer(now)
    assert all(q.consumer_count == 0 for q in b.d.vhost.queues.values())
    assert not b.d._channels.subs
    return b


def headers_route(n: int, per_batch: int = 64) -> Bench:
    """A headers exchange with n // 100 bindings (one value each of one header, to one queue);
    batches of 64 publishes, each matching one binding, 100 batches."""
    b = Bench(n)
    b.batch([r.ExchangeDeclare(CONN, CH, "h", "headers", False, False, False, False, {}, False)],
            b.t0)
    b.declare("hq")
    bindings = n // 100
    b.set_up(r.QueueBind(CONN, CH, "hq", "h", "", {"x-match": "all", "k": f"v{i}"}, False)
             for i in range(bindings))
    b.ready()
    now = b.t0 + 1
    offset = 0
    for _ in range(100):
        batch: list[r.Request] = []
        for _ in range(per_batch):
            offset += 256
            batch.append(r.Publish(CONN, CH, "h", "", False, False, offset, 16, 128,
                                   {"k": f"v{offset % bindings}"}))
        b.timed(lambda batch=batch: b.batch(batch, now))  # type: ignore[misc]
    assert b.d.vhost.queues["hq"].message_count == 100 * per_batch
    return b


def queued_count(n: int) -> Bench:
    """n // 10 queues, each with a consumer on a channel of its own: the memory alarm's count of
    what they queue and hold, one timed call a step (the steps flow_tick runs in)."""
    b = Bench(n)
    queues = n // 10
    b.set_up(r.QueueDeclare(CONN, CH, f"q{i}", False, False, False, False, {}, False)
             for i in range(queues))
    b.set_up(r.Consume(CONN, 1 + i, i + 1, i, f"q{i}", f"t{i}", False, False, 0, False, True,
                       False) for i in range(queues))
    b.ready()
    d = b.d
    d.alarms.queued_high, d.alarms.queued_low = 1 << 40, 1 << 39
    now = b.t0 + 1

    def step() -> None:
        d.begin_batch(now)
        d.flow_tick()

    b.timed(step)
    while d.next_deadline() == now:
        b.timed(step)
    return b


SCENARIOS: dict[str, tuple[Callable[[int], Bench], bool]] = {
    # name: (run, whether every body ends up freed)
    "purge-plain": (lambda n: purge(n, None), True),
    "delete-plain": (lambda n: delete(n, None), True),
    "purge-featured": (lambda n: purge(n, {"x-max-length": 10 * n}), True),
    "delete-featured": (lambda n: delete(n, {"x-max-length": 10 * n}), True),
    "exclusive-on-close": (exclusive_on_close, True),
    "ttl-burst": (lambda n: ttl_burst(n, False), True),
    "ttl-burst-dead-letter": (lambda n: ttl_burst(n, True), False),
    # n // 1000 messages expiring to a dead-letter exchange bound to 1,000 queues.
    "ttl-burst-dead-letter-wide": (lambda n: ttl_burst(n // 1000, True, 1000), False),
    "unacked-on-close": (unacked_on_close, False),
    "fanout-wide": (fanout_wide, False),
    # One message at a time to a fanout of 10,000 queues: each is offered to them in slices.
    "fanout-single": (lambda n: fanout_wide(n, 10_000, 1), False),
    "exchange-delete": (exchange_delete, False),
    "queue-delete-bound": (queue_delete, False),
    "queue-delete-sources": (queue_delete_sources, False),
    # The destination of exchange-to-exchange bindings: from one exchange, and one each.
    "exchange-delete-destination": (lambda n: exchange_delete_destination(n, 1), False),
    "exchange-delete-destinations": (lambda n: exchange_delete_destination(n, n // 20), False),
    "close-exclusive-many": (close_exclusive_many, False),
    # A channel with n // 50 consumers of one queue closes; a connection with as many over 100
    # channels and 100 queues.
    "close-consumers-channel": (lambda n: close_consumers(n, 1, 1), False),
    "close-consumers-connection": (lambda n: close_consumers(n, 100, 100), False),
    # A queue with n // 50 consumers (of one channel) deleted.
    "queue-delete-consumers": (lambda n: close_consumers(n, 0, 1), False),
    "headers-route": (headers_route, False),
    "exchange-walk": (exchange_walk, False),
    # The memory alarm's count over 100,000 queues and as many channels.
    "queued-count": (queued_count, False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("-s", "--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--keep-gc", action="store_true",
                        help="do not freeze the filled queue out of the garbage collector")
    args = parser.parse_args()
    global FREEZE
    FREEZE = not args.keep_gc
    print(f"{args.messages:,} messages per scenario"
          f"{'' if FREEZE else ', garbage collector left on'}")
    for name in args.scenarios.split(","):
        run, all_freed = SCENARIOS[name]
        bench = run(args.messages)
        bench.report(name, args.messages if all_freed else 0)
        del bench
        gc.enable()
        gc.unfreeze()
        gc.collect()


if __name__ == "__main__":
    main()
