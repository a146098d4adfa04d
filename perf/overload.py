"""Overload scenarios: publishers that do not pace themselves, consumers that ack each message.

Theory of operation
-------------------
S1-S7 (perf/scenarios.py) keep every publisher within a window of its consumers, which measures
throughput at a bounded queue depth. Real clients mostly do not: a publisher without confirms
writes as fast as TCP lets it, and a consumer acks each delivery on its own (basic.ack,
multiple=false) with a small prefetch. These scenarios use that shape:

    S1u  1 unbounded publisher -> 1 queue -> 1 consumer, prefetch 10, ack each
    S3u  1 unbounded publisher -> 1 queue -> 8 competing consumers, prefetch 10, ack each;
         then, on the same broker, a 1,000 msg/s ping-pong (1 -> 1 -> 1) for a few seconds
    S4u  1 unbounded publisher -> fanout -> 8 queues -> 8 consumers (one each), prefetch 10, ack each
    S9u  4 unbounded publishers -> 4 queues (one each) -> one channel consuming all four, its
         prefetch of 40 shared (basic.qos global=true), ack each: a celery worker's shape
    S10u a slow consumer beside others: 3 publishers paced at 3,000 msg/s, one per queue; queue
         A's consumer takes 20 ms over each message (50 msg/s), queue B's acks each at once,
         queue C has no consumer. Each publisher's rate and each consumer's are reported: a
         slow consumer should cost no publisher its rate (RabbitMQ lets A grow)
    S7u  1 publisher paced at 1,000 msg/s -> 1 queue -> 1 consumer, ack each: broker cores (the
         idle cost) and latency; also the broker's cores with nothing published (2 s, consumer
         attached)

A run is bounded by time (`seconds`, 10 by default) and by a message count (500,000 msg/s times
the seconds for the C generator: more than any broker here takes). It goes:

1. declare the topology; start the consumers, then the publisher (perf.cgen's C generator, or
   Python processes from perf.loadgen when that cannot be built: several unbounded publisher
   processes stand in for the one C publisher, and the result says so); wait until all are
   connected and set up;
2. `go`; every second a line with what was published and delivered, the queues' depth (a
   passive queue.declare on a separate connection; a broker too busy to answer within 2 s is
   not asked again in that run) and the broker's CPU;
3. at `seconds` every generator stops (the C processes on their own clock, the Python ones on
   the orchestrator's `stop`): the publisher finishes the batch in hand and closes its connection
   (Connection.Close, then Close-Ok: the broker has taken every publish before it), consumers
   close theirs (what they were sent and had not read goes back to the queue);
4. the queues' depth is read until it stops changing (two equal readings 0.5 s apart, 30 s at
   most): that is the **backlog at end** (ready + unacked: the unacked were requeued when the
   consumers closed); then the topology is deleted.

Figures: **publish msg/s** = messages the publisher wrote to its socket / its active time (for an
unbounded publisher that is how fast the broker reads); **deliver msg/s** = deliveries to all
consumers (fanout: each copy) within the window / the window; **broker cores** = CPU time of all
broker processes over the window / the window; **published - delivered** = what the
clients' counts leave undelivered (in the queues, or in socket buffers at the end);
**unaccounted** = published - delivered - backlog at end: > 0 means messages written to the
socket were neither delivered nor queued (lost: no confirms), < 0 that something arrived twice.
Latency percentiles are of every delivery (send time in the body to receipt); after an
unbounded publisher they are mostly queueing time, so only S7u's and the ping-pong's are
latencies.
"""

from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from perf import cgen, loadgen
from perf.brokers import Broker
from perf.cgen import CProcess, GeneratorChoice, histogram_of, histogram_summary, merge_histograms
from perf.clients import Clients as _Clients
from perf.clients import progress as _progress
from perf.sampler import Sampler
from perf.scenario_topology import delete_topology
from perf.wire import Client

C_RATE_CAP = 500_000  # count cap per C publisher: this many msg/s times the seconds
PY_RATE_CAP = 150_000  # ... per Python publisher process (its consumers keep one byte per message)
SPAWN_WAIT = 60.0  # for every generator to be connected and set up
PROBE_TIMEOUT = 2.0  # a depth probe the broker does not answer within this is given up for the run
SETTLE_MAX = 30.0  # reading the backlog after the run: at most this long
TEARDOWN_TIMEOUT = 60.0  # deleting queues that may hold millions of messages
GRACE = 30.0  # a publisher's time to get rid of its last batch and see Close-Ok
GENERATOR_BOUND = 0.80  # a generator process above this share of one core flags the run
IDLE_SECONDS = 2.0  # S7u: broker cores with the consumer attached and nothing published


@dataclass(frozen=True)
class OverloadScenario:
    key: str
    title: str
    kind: str = "unbounded"  # unbounded | steady
    queues: int = 1
    consumers_per_queue: int = 1
    fanout: bool = False
    publishers: int = 1  # each to its own queue (publisher p to queue p % queues) unless fanout
    one_channel: bool = False  # one consumer, one channel, a basic.consume on every queue
    global_qos: bool = False  # basic.qos global=true: the channel's consumers share the prefetch
    prefetch: int = 10
    ack_every: int = 1  # 1: basic.ack multiple=false per delivery
    body_size: int = 128
    ping_pong_after: bool = False
    publisher_rate: float = 0.0  # msg/s per publisher (0: unbounded)
    slow_ack_rate: float = 0.0  # queue 0's consumers take 1/this s over each delivery (0: none)
    idle_queues: int = 0  # the last this many queues have no consumer

    @property
    def consumers(self) -> int:
        return 1 if self.one_channel else (self.queues - self.idle_queues) * self.consumers_per_queue


OVERLOAD_SCENARIOS: dict[str, OverloadScenario] = {
    s.key: s
    for s in [
        OverloadScenario("S7u", "steady 1,000 msg/s -> 1 queue -> 1 consumer, ack each: idle cost", kind="steady"),
        OverloadScenario("S1u", "1 unbounded publisher -> 1 queue -> 1 consumer, prefetch 10, ack each"),
        OverloadScenario("S3u", "1 unbounded publisher -> 1 queue -> 8 competing consumers, prefetch 10, ack each",
                         consumers_per_queue=8, ping_pong_after=True),
        OverloadScenario("S4u", "1 unbounded publisher -> fanout -> 8 queues -> 8 consumers, prefetch 10, ack each",
                         queues=8, fanout=True),
        OverloadScenario("S9u", "4 unbounded publishers -> 4 queues -> one channel consuming all 4, global "
                         "prefetch 40, ack each", queues=4, publishers=4, one_channel=True, global_qos=True,
                         prefetch=40),
        OverloadScenario("S10u", "3 publishers at 3,000 msg/s -> A (a consumer taking 20 ms a message), B (a "
                         "consumer acking each), C (no consumer), prefetch 10", queues=3, publishers=3,
                         publisher_rate=3000.0, slow_ack_rate=50.0, idle_queues=1),
    ]
}  # fmt: skip

PING_PONG = OverloadScenario("pp", "1,000 msg/s ping-pong 1 -> 1 -> 1 right after the overload", kind="steady")


@dataclass
class OverloadOptions:
    seconds: float = 10.0
    generator: GeneratorChoice = field(default_factory=lambda: GeneratorChoice("python", None, "not chosen"))
    python_publishers: int = 2
    steady_rate: float = 1000.0
    ping_pong_seconds: float = 5.0
    ping_pong_rate: float = 1000.0
    sample_interval: float = 0.5
    progress: bool = True


def count_cap(kind: str, rate: float, seconds: float) -> int:
    """Messages per publisher process: a paced one sends rate x seconds (+1), an unbounded one is
    capped far above what any broker here takes (C) or what one Python process can send."""
    if rate > 0:
        return int(rate * seconds) + 1
    return int((C_RATE_CAP if kind == "c" else PY_RATE_CAP) * seconds) + 1


def publisher_processes(kind: str, rate: float, python_publishers: int, publishers: int = 1) -> int:
    """One C process a publisher; the Python fallback needs several for one unbounded publisher's
    load."""
    return publishers * (1 if kind == "c" or rate > 0 else max(1, python_publishers))


# --------------------------------------------------------------------------- the generators


class _Fleet:
    """The generator processes of one run, C (perf.cgen) or Python (perf.loadgen), behind one
    interface; every process it starts is reaped (by PID) in `finish`."""

    def __init__(self, choice: GeneratorChoice, port: int):
        self.kind = choice.kind
        self.binary = choice.binary
        self.port = port
        self.c_processes: list[tuple[str, CProcess]] = []  # (role, process)
        self.py: _Clients | None = _Clients() if self.kind == "python" else None
        self.py_counts: list[tuple[str, Any]] = []  # (role, RawValue) in spawn order
        self.py_jobs: list[dict[str, Any]] = []
        self.window_end_counts: list[int] | None = None

    def add_consumer(self, name: str, queue: str, scenario: OverloadScenario, seconds: float, publishers: int,
                     capacity: int, ack_rate: float = 0.0) -> None:  # fmt: skip
        if self.kind == "c":
            assert self.binary is not None
            argv = cgen.consumer_argv(
                self.binary, self.port, queue=queue, name=name, prefetch=scenario.prefetch,
                ack_every=scenario.ack_every, seconds=seconds, publishers=publishers, capacity=capacity, grace=GRACE,
                global_qos=scenario.global_qos, ack_rate=ack_rate,
            )  # fmt: skip
            self.c_processes.append(("consumer", CProcess(f"consumer {name}", argv)))
            return
        assert self.py is not None
        value = self.py.ctx.RawValue("q", 0)
        job = {
            "port": self.port, "queue": queue, "name": name, "prefetch": scenario.prefetch,
            "ack_every": scenario.ack_every, "ack_single": scenario.ack_every <= 1,
            "global_qos": scenario.global_qos, "hard_seconds": seconds + GRACE + 30.0,
            "capacities": [capacity] * publishers, "ack_rate": ack_rate,
        }  # fmt: skip
        self.py.spawn(loadgen.consumer_main, job, {"received": value}, f"consumer {name}")
        self.py_counts.append(("consumer", value))
        self.py_jobs.append(job)

    def add_publisher(self, pub_id: int, exchange: str, routing_key: str, scenario: OverloadScenario, count: int,
                      seconds: float, rate: float) -> None:  # fmt: skip
        if self.kind == "c":
            assert self.binary is not None
            argv = cgen.publisher_argv(
                self.binary, self.port, exchange=exchange, routing_key=routing_key, body_size=scenario.body_size,
                pub_id=pub_id, count=count, seconds=seconds, rate=rate, grace=GRACE,
            )  # fmt: skip
            self.c_processes.append(("publisher", CProcess(f"publisher p{pub_id}", argv)))
            return
        assert self.py is not None
        published, done = self.py.ctx.RawValue("q", 0), self.py.ctx.RawValue("b", 0)
        job = {
            "port": self.port, "id": pub_id, "body_size": scenario.body_size, "count": count, "seconds": seconds,
            "window": 0, "rate": rate, "confirm": False, "grace": GRACE, "exchange": exchange,
            "routing_key": routing_key,
        }  # fmt: skip
        self.py.spawn(loadgen.publisher_main, job, {"published": published, "done": done, "watch": []},
                      f"publisher p{pub_id}")  # fmt: skip
        self.py_counts.append(("publisher", published))
        self.py_jobs.append(job)

    def wait_ready(self, timeout: float) -> None:
        if self.py is not None:
            self.py.wait_ready(timeout)
            return
        limit = time.monotonic() + timeout
        for _role, process in self.c_processes:
            while not process.ready.wait(0.1):
                if not process.alive():
                    result = process.finish(2.0)
                    raise RuntimeError(f"{process.name} exited before it was ready: {result.get('error')}")
                if time.monotonic() > limit:
                    raise RuntimeError(f"{process.name} not ready after {timeout:g} s")

    def go(self) -> None:
        if self.py is not None:
            self.py.go.set()
        for _role, process in self.c_processes:
            process.go()

    def counts(self) -> tuple[int, int]:
        """(published, delivered) so far (the C processes' last progress lines: up to 1 s old)."""
        pairs = [(r, p.count) for r, p in self.c_processes] + [(r, v.value) for r, v in self.py_counts]
        return sum(c for r, c in pairs if r == "publisher"), sum(c for r, c in pairs if r == "consumer")

    def end_window(self) -> None:
        """At the end of the window: the Python consumers' counts (the C ones count by their own clock)."""
        self.window_end_counts = [v.value for _r, v in self.py_counts]

    def dead(self) -> list[str]:
        if self.py is not None:
            return self.py.dead()
        return [p.name for _r, p in self.c_processes if not p.alive() and not p.has_result(0.5)]

    def stop(self) -> None:
        if self.py is not None:
            self.py.stop.set()
        for _role, process in self.c_processes:
            process.stop()

    def finish(self, timeout: float) -> list[dict[str, Any]]:
        """Every process's result, normalised (see `_normalise_python`); all of them reaped."""
        if self.py is not None:
            raw = self.py.finish(timeout)
            ends = self.window_end_counts or [None] * len(raw)
            return [_normalise_python(r, end) for r, end in zip(raw, ends, strict=False)]
        limit = time.monotonic() + timeout
        out = []
        for role, process in self.c_processes:
            result = dict(process.finish(max(0.5, limit - time.monotonic())))
            result.setdefault("role", role)
            if role == "consumer":
                result["in_window"] = result.get("received", 0)
                result["wall_s"] = result.get("window_s")
            result["pid"] = process.pid
            out.append(result)
        return out


def _normalise_python(result: dict[str, Any], window_count: int | None) -> dict[str, Any]:
    """A perf.loadgen result in the C generator's terms (histogram instead of raw latencies)."""
    out = {k: v for k, v in result.items() if k not in ("seen", "latencies_us")}
    if result.get("role") == "consumer":
        latencies = array("q")
        latencies.frombytes(result.get("latencies_us") or b"")
        hist = histogram_of(latencies)
        out["hist"] = sorted(hist.items())
        out["max_us"] = max(latencies) if latencies else 0
        out["in_window"] = window_count if window_count is not None else result.get("received", 0)
        out["by_publisher"] = [bytes(marks).count(1) for marks in result.get("seen") or []]
    return out


# --------------------------------------------------------------------------- topology and depth


def _names(key: str, queues: int) -> tuple[str, list[str]]:
    prefix = f"perf.{os.getpid()}.{int(time.time() * 1000) % 10**9}.{key}"
    return f"{prefix}.x", [f"{prefix}.q{i}" for i in range(queues)]


def _setup(port: int, scenario: OverloadScenario, exchange: str, queues: list[str]) -> None:
    client = Client(port)
    try:
        for queue in queues:
            client.queue_declare(queue)
        if scenario.fanout:
            client.exchange_declare(exchange, "fanout")
            for queue in queues:
                client.queue_bind(queue, exchange)
    finally:
        client.close()


class _DepthProbe:
    """Passive queue.declare on its own connection; given up for the run once it times out."""

    def __init__(self, port: int, timeout: float = PROBE_TIMEOUT):
        self.client: Client | None = None
        self.problem: str | None = None
        try:
            self.client = Client(port, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a broker too busy to connect to: no depth figures
            self.problem = f"depth probe: {exc!r}"

    def depth(self, queues: list[str]) -> int | None:
        if self.client is None:
            return None
        total = 0
        try:
            for queue in queues:
                total += self.client.queue_declare(queue, passive=True)
        except Exception as exc:  # noqa: BLE001
            self.problem = f"depth probe gave up: {exc!r}"
            self.close()
            return None
        return total

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            client.close(timeout=1.0)


def _settled_depth(port: int, queues: list[str], limit_s: float = SETTLE_MAX) -> tuple[int | None, float, bool]:
    """The queues' total depth once it stops changing: (depth, seconds it took, settled?)."""
    started = time.monotonic()
    limit = started + limit_s
    previous: int | None = None
    depth: int | None = None
    while time.monotonic() < limit:
        try:
            client = Client(port, timeout=max(1.0, limit - time.monotonic()))
        except Exception:  # noqa: BLE001 - busy: try again
            time.sleep(0.5)
            continue
        try:
            while time.monotonic() < limit:
                depth = sum(client.queue_declare(q, passive=True) for q in queues)
                if depth == previous:
                    return depth, round(time.monotonic() - started, 2), True
                previous = depth
                time.sleep(0.5)
        except Exception:  # noqa: BLE001
            time.sleep(0.5)
        finally:
            client.close(timeout=1.0)
    return depth, round(time.monotonic() - started, 2), False


def _teardown(port: int, scenario: OverloadScenario, exchange: str, queues: list[str]) -> str | None:
    return delete_topology(port, queues, exchange if scenario.fanout else None, TEARDOWN_TIMEOUT)


# --------------------------------------------------------------------------- one run


def run_shape(
    broker: Broker, scenario: OverloadScenario, seconds: float, rate: float, opts: OverloadOptions,
    label: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run of `scenario` (rate 0: unbounded publisher) for `seconds`; see the module docstring."""
    label = label or scenario.key
    choice = opts.generator
    publishers = publisher_processes(choice.kind, rate, opts.python_publishers, scenario.publishers)
    count = count_cap(choice.kind, rate, seconds)
    exchange, queues = _names(label, scenario.queues)
    result: dict[str, Any] = {
        "scenario": label, "title": scenario.title, "broker": broker.label, "kind": scenario.kind,
        "generator": choice.kind, "generator_note": choice.note, "body_size": scenario.body_size,
        "queues": scenario.queues, "consumers": scenario.consumers, "prefetch": scenario.prefetch,
        "ack_every": scenario.ack_every, "publisher_processes": publishers, "count_per_publisher": count,
        "rate": rate or None, "seconds_cap": seconds, "errors": [],
    }  # fmt: skip
    _setup(broker.port, scenario, exchange, queues)
    fleet = _Fleet(choice, broker.port)
    sampler = Sampler(broker.processes, opts.sample_interval)
    probe: _DepthProbe | None = None
    timeline: list[dict[str, Any]] = []
    t0 = t1 = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        if scenario.one_channel:
            fleet.add_consumer("c", ",".join(queues), scenario, seconds, publishers, count)
        else:
            for q, queue in enumerate(queues[:scenario.queues - scenario.idle_queues]):
                for c in range(scenario.consumers_per_queue):
                    fleet.add_consumer(f"c{q}.{c}", queue, scenario, seconds, publishers, count,
                                       scenario.slow_ack_rate if q == 0 else 0.0)
        fleet.wait_ready(SPAWN_WAIT)
        per_publisher = publishers // scenario.publishers  # processes standing in for one publisher
        for p in range(publishers):
            fleet.add_publisher(
                p, exchange if scenario.fanout else "",
                "" if scenario.fanout else queues[(p // per_publisher) % scenario.queues], scenario, count,
                seconds, rate,
            )  # fmt: skip
        fleet.wait_ready(SPAWN_WAIT)
        probe = _DepthProbe(broker.port)
        sampler.start()
        if scenario.kind == "steady" and label == scenario.key:
            idle_from = sampler.mark()
            time.sleep(IDLE_SECONDS)
            idle_to = sampler.mark()
            result["idle_cores"] = sampler.summary(idle_from, idle_to)["cores_used"]
        time.sleep(0.2)
        t0 = sampler.mark()
        fleet.go()
        t_end = t0 + seconds
        next_tick = t0 + 1.0
        while True:
            now = time.monotonic()
            if now >= t_end:
                break
            time.sleep(min(next_tick, t_end) - now)
            now = time.monotonic()
            if now >= t_end:  # the generators end on their own clocks now: not "exited early"
                break
            if now < next_tick:
                continue
            next_tick += 1.0
            published, delivered = fleet.counts()
            depth = probe.depth(queues)
            cpu = sampler.latest_cpu_percent()
            timeline.append({"t": round(now - t0, 2), "published": published, "delivered": delivered,
                             "queued": depth, "broker_cpu_percent": cpu})  # fmt: skip
            _progress(
                f"  [{broker.label} {label} {now - t0:5.1f}s] published {published:>10,}  delivered {delivered:>10,}"
                f"  queued {'?' if depth is None else f'{depth:,}':>10}  broker CPU {cpu or 0:>4.0f}%",
                opts.progress,
            )  # fmt: skip
            if not broker.alive():
                result["errors"].append("the broker exited during the run")
                break
            dead = fleet.dead()
            if dead:
                result["errors"].append(f"generator processes exited early: {', '.join(dead)}")
                break
        t1 = sampler.mark()
        fleet.end_window()
        probe_started = time.monotonic()
        result["queued_at_end"] = probe.depth(queues)
        result["probe_at_end_s"] = round(time.monotonic() - probe_started, 3)
    finally:
        if probe is not None:
            probe.close()
            if probe.problem:
                result["errors"].append(probe.problem)
        fleet.stop()
        results = fleet.finish(GRACE + 15.0)
        sampler.stop()
        if broker.alive():
            backlog, settle_s, settled = _settled_depth(broker.port, queues)
            result.update(backlog_end=backlog, backlog_settle_s=settle_s, backlog_settled=settled)
            if not settled:
                result["errors"].append(f"queue depth still changing {settle_s} s after the run")
            teardown_started = time.monotonic()
            problem = _teardown(broker.port, scenario, exchange, queues)
            result["teardown_s"] = round(time.monotonic() - teardown_started, 2)
            if problem:
                result["errors"].append(problem)
        else:
            result["errors"].append("broker not running after the run")
    result.update(summarise(results, scenario, sampler.summary(t0, t1), t1 - t0, result.get("backlog_end")))
    result["timeline"] = timeline
    result["generator_results"] = [{k: v for k, v in r.items() if k != "hist"} for r in results]
    for r in results:
        if r.get("error"):
            result["errors"].append(f"{r.get('role', '?')} {r.get('id', r.get('name', '?'))}: {r['error']}")
    result["window_from"], result["window_to"] = round(t0, 3), round(t1, 3)  # this host's CLOCK_MONOTONIC
    return result


def summarise(
    results: list[dict[str, Any]], scenario: OverloadScenario, broker_summary: dict[str, Any], span: float,
    backlog_end: int | None,
) -> dict[str, Any]:  # fmt: skip
    """The figures of one run from its generators' (normalised) results; see the module docstring."""
    publishers = [r for r in results if r.get("role") == "publisher"]
    consumers = [r for r in results if r.get("role") == "consumer"]
    published = sum(int(r.get("published") or 0) for r in publishers)
    pub_wall = max((float(r.get("wall_s") or 0) for r in publishers), default=0.0)
    in_window = sum(int(r.get("in_window") or 0) for r in consumers)
    delivered = sum(int(r.get("received") or 0) for r in consumers)
    windows = [float(r["window_s"]) for r in consumers if r.get("window_s")]
    window = sum(windows) / len(windows) if windows else span
    expected = published * (scenario.queues if scenario.fanout else 1)
    undelivered = expected - delivered
    hist = merge_histograms(r.get("hist") or [] for r in consumers)
    counts = [r.get("by_publisher") or [] for r in consumers]  # first deliveries, per publisher process
    by_process = [sum(c[i] for c in counts if i < len(c)) for i in range(max(map(len, counts), default=0))]
    # Per publisher: the Python fallback's processes standing in for one publisher added up
    per = len(by_process) // scenario.publishers if len(by_process) % scenario.publishers == 0 else 1
    by_publisher = [sum(by_process[i:i + per]) for i in range(0, len(by_process), per)] if per else []
    max_us = max((int(r.get("max_us") or 0) for r in consumers), default=0)
    generators = []
    for r in results:
        cpu, wall = r.get("cpu_s"), r.get("wall_s")
        if cpu is None or not wall:
            continue
        generators.append({
            "name": f"{r.get('role')} {r.get('id', r.get('name'))}", "cpu_s": round(float(cpu), 3),
            "wall_s": round(float(wall), 3), "cpu_fraction": round(float(cpu) / float(wall), 3),
        })  # fmt: skip
    # Each publisher's rate (what it wrote / its active time) and each consumer's (deliveries in
    # the window / the window), in spawn order: S10u's figures.
    publisher_rates = [round(int(r.get("published") or 0) / float(r["wall_s"]), 1) if r.get("wall_s") else None
                       for r in publishers]  # fmt: skip
    consumer_rates = {str(r.get("name")): round(int(r.get("in_window") or 0) / float(r["window_s"]), 1)
                      if r.get("window_s") else None for r in consumers}  # fmt: skip
    max_fraction = max((g["cpu_fraction"] for g in generators), default=0.0)
    generator_cores = sum(g["cpu_s"] for g in generators) / span if span > 0 else 0.0
    host = broker_summary.get("host_busy_cores")
    cores = broker_summary.get("cores_used")
    cpu_s = broker_summary.get("cpu_s")
    other = round(max(0.0, host - cores - generator_cores), 2) if host is not None and cores is not None else None
    return {
        "published": published,
        "published_per_s": round(published / pub_wall, 1) if pub_wall else None,
        "delivered": delivered,
        "delivered_in_window": in_window,
        "delivered_per_s": round(in_window / window, 1) if window > 0 else None,
        "window_s": round(window, 3),
        "expected_deliveries": expected,
        "published_minus_delivered": undelivered,
        "unaccounted": undelivered - backlog_end if backlog_end is not None else None,
        "duplicates": sum(int(r.get("duplicates") or 0) for r in consumers),
        "reordered": sum(int(r.get("reordered") or 0) for r in consumers),
        "redelivered": sum(int(r.get("redelivered") or 0) for r in consumers),
        "delivered_by_publisher": by_publisher,
        "publisher_rates": publisher_rates,
        "consumer_rates": consumer_rates,
        "tcp_wait_s": round(sum(float(r.get("tcp_wait_s") or 0) for r in publishers), 2),
        "broker_cpu": broker_summary,
        "broker_cores": cores,
        "broker_rss_max_mb": broker_summary.get("rss_max_mb"),
        "delivered_per_broker_cpu_s": round(in_window / cpu_s, 1) if cpu_s else None,
        "latency": histogram_summary(hist, max_us if hist else None),
        "generators": generators,
        "generator_max_cpu_fraction": round(max_fraction, 3),
        "generator_bound": max_fraction > GENERATOR_BOUND,
        "generator_cores": round(generator_cores, 2),
        "other_load_cores": other,
    }  # fmt: skip


def run(broker: Broker, scenario: OverloadScenario, opts: OverloadOptions) -> dict[str, Any]:
    """A scenario, and for S3u the ping-pong right after it on the same broker; never raises."""
    started = time.monotonic()
    rate = opts.steady_rate if scenario.kind == "steady" else scenario.publisher_rate
    try:
        result = run_shape(broker, scenario, opts.seconds, rate, opts)
    except Exception as exc:  # noqa: BLE001 - one failed scenario must not end the run
        result = {
            "scenario": scenario.key, "title": scenario.title, "broker": broker.label, "kind": scenario.kind,
            "errors": [f"{type(exc).__name__}: {exc}"], "failed": True,
        }  # fmt: skip
    if scenario.ping_pong_after and broker.alive():
        try:
            after = run_shape(broker, PING_PONG, opts.ping_pong_seconds, opts.ping_pong_rate, opts,
                              label=f"{scenario.key}+pp")  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            after = {"scenario": f"{scenario.key}+pp", "errors": [f"{type(exc).__name__}: {exc}"], "failed": True}
        if result.get("window_to") and after.get("window_from"):
            after["since_overload_s"] = round(after["window_from"] - result["window_to"], 2)
        result["after"] = after
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result


__all__ = ["OVERLOAD_SCENARIOS", "OverloadOptions", "OverloadScenario", "run", "run_shape", "summarise"]
