"""The scenarios, and running one against a broker.

Every throughput/latency scenario has the same shape: declare its queues (and exchange), start the
consumer processes, then the publisher processes (perf.loadgen, multiprocessing 'spawn'), wait
until every client is connected, set `go`, and watch. A publisher stops at its message count or
after `seconds`; the run ends when every queue's consumers have received what was published to
it, or when nothing has arrived for `STALL` seconds after the publishers stopped, or at a hard
deadline. Then `stop` is set, every client reports, the topology is deleted.

Figures: delivered msg/s = deliveries (all consumers; fanout counts each copy) / (last delivery -
go); messages delivered per broker CPU-second = deliveries / (user+system CPU of all broker
processes between go and the end); latency percentiles of every delivery; loss, duplicates and
reordering per queue (perf.accounting); each generator process's CPU share of its active window.

S8 (memory) differs: RSS/PSS of all broker processes with N idle connections open (per
connection: the growth over the baseline / N), then with M 128-byte messages queued (no consumer).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil

from perf import loadgen
from perf.accounting import latency_summary, merge_group
from perf.brokers import Broker
from perf.sampler import Sampler, memory_snapshot
from perf.wire import Client

GENERATOR_BOUND = 0.80  # a generator process above this share of one core flags the run
STALL = 3.0  # after the publishers stop: end the run when nothing arrived for this long
DRAIN = 15.0  # ... and at most this long after they stopped
SPAWN_WAIT = 60.0  # for every client to connect and be ready
WINDOW_BYTES = 32 * 2**20  # a publisher's lead is also capped at this many body bytes
S8_UNCONFIRMED = 10_000  # S8 fills its queue with confirms, at most this many unconfirmed per publisher


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    kind: str = "throughput"  # throughput | latency | memory
    body_size: int = 128
    publishers: int = 1
    queues: int = 1
    consumers_per_queue: int = 1
    fanout: bool = False
    prefetch: int = 100
    ack_every: int = 50
    rate: float = 0.0  # msg/s per publisher; 0 = as fast as the window allows
    count: int = 1_000_000  # per publisher
    quick_count: int = 20_000

    @property
    def consumers(self) -> int:
        return self.queues * self.consumers_per_queue


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in [
        Scenario("S1", "1 publisher -> 1 queue -> 1 consumer"),
        Scenario("S2", "4 publishers -> 4 queues -> 4 consumers", publishers=4, queues=4, count=500_000,
                 quick_count=5_000),
        Scenario("S3", "1 publisher -> 1 queue -> 8 competing consumers, prefetch 10", consumers_per_queue=8,
                 prefetch=10, ack_every=5),
        Scenario("S4", "1 publisher -> fanout -> 8 queues -> 8 consumers", queues=8, fanout=True, count=500_000,
                 quick_count=5_000),
        Scenario("S5", "S1 with 4 KiB bodies", body_size=4096, count=500_000, quick_count=10_000),
        Scenario("S6", "S1 with 256 KiB bodies", body_size=256 * 1024, count=20_000, quick_count=500),
        Scenario("S7", "latency at a fixed 1,000 msg/s (1 -> 1 -> 1)", kind="latency", rate=1000.0),
        Scenario("S8", "memory: idle connections; queued 128-byte messages", kind="memory"),
    ]
}  # fmt: skip


@dataclass
class Options:
    seconds: float = 10.0
    quick: bool = False
    window: int = 10_000
    confirm: bool = False
    ack_each: bool = False  # consumers send basic.ack multiple=false per delivery (pika's default)
    global_qos: bool = False  # consumers' basic.qos global=true (celery's choice against RabbitMQ)
    sample_interval: float = 0.5
    s8_messages: int = 1_000_000
    s8_connections: int = 1_000
    s8_seconds: float = 180.0
    s8_drain: bool = False  # then consume every queued message, watching memory (issue 11)
    progress: bool = True


def _progress(line: str, enabled: bool) -> None:
    if enabled:
        print(line, file=sys.stderr, flush=True)


def _ctx() -> Any:
    return mp.get_context("spawn")


class _Clients:
    """The generator processes of one run: started, watched, always reaped."""

    def __init__(self) -> None:
        self.ctx = _ctx()
        self.entries: list[dict[str, Any]] = []
        self.go = self.ctx.Event()
        self.stop = self.ctx.Event()

    def spawn(self, target: Callable[..., None], job: dict[str, Any], extra: dict[str, Any], name: str) -> dict:
        reader, writer = self.ctx.Pipe(duplex=False)
        ready = self.ctx.Event()
        shared = {"go": self.go, "stop": self.stop, "ready": ready, **extra}
        process = self.ctx.Process(target=target, args=(job, shared, writer), name=name, daemon=True)
        process.start()
        writer.close()
        entry = {"name": name, "process": process, "pipe": reader, "ready": ready, "result": None, "shared": shared}
        with contextlib.suppress(psutil.Error):
            entry["ps"] = psutil.Process(process.pid)
            entry["ps"].cpu_percent(None)
        self.entries.append(entry)
        return entry

    def wait_ready(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        for entry in self.entries:
            while not entry["ready"].wait(0.1):
                if not entry["process"].is_alive():
                    self._collect(entry, 1.0)
                    raise RuntimeError(f"{entry['name']} exited before it was ready: {entry['result']}")
                if time.monotonic() > limit:
                    raise RuntimeError(f"{entry['name']} not ready after {timeout:g} s")

    def dead(self) -> list[str]:
        return [e["name"] for e in self.entries if not e["process"].is_alive() and e["result"] is None]

    def cpu_percent_max(self) -> float:
        peak = 0.0
        for entry in self.entries:
            with contextlib.suppress(psutil.Error, KeyError):
                peak = max(peak, entry["ps"].cpu_percent(None))
        return peak

    def _collect(self, entry: dict[str, Any], timeout: float) -> None:
        if entry["result"] is not None:
            return
        with contextlib.suppress(EOFError, OSError):
            if entry["pipe"].poll(timeout):
                entry["result"] = entry["pipe"].recv()

    def finish(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Set stop, collect every result (bounded), join, kill what is left (by PID)."""
        self.stop.set()
        limit = time.monotonic() + timeout
        for entry in self.entries:
            self._collect(entry, max(0.1, limit - time.monotonic()))
        for entry in self.entries:
            entry["process"].join(max(0.1, limit - time.monotonic()))
            if entry["process"].is_alive():
                entry["process"].kill()
                entry["process"].join(5.0)
            if entry["result"] is None:
                entry["result"] = {"name": entry["name"], "error": f"no result (exit code {entry['process'].exitcode})"}
            entry["pipe"].close()
        return [e["result"] for e in self.entries]


def _names(broker: Broker, scenario: Scenario) -> tuple[str, list[str]]:
    prefix = f"perf.{os.getpid()}.{int(time.time() * 1000) % 10**9}.{scenario.key}"
    return f"{prefix}.x", [f"{prefix}.q{i}" for i in range(scenario.queues)]


def _setup(broker: Broker, scenario: Scenario, exchange: str, queues: list[str]) -> None:
    client = Client(broker.port)
    try:
        for queue in queues:
            client.queue_declare(queue)
        if scenario.fanout:
            client.exchange_declare(exchange, "fanout")
            for queue in queues:
                client.queue_bind(queue, exchange)
    finally:
        client.close()


def _depths(broker: Broker, queues: list[str]) -> list[int | None]:
    """Messages in each queue (passive queue.declare), None where that cannot be asked."""
    if not broker.alive():
        return [None] * len(queues)
    try:
        client = Client(broker.port)
    except Exception:  # noqa: BLE001 - the broker is in trouble; the run reports that already
        return [None] * len(queues)
    out: list[int | None] = []
    try:
        for queue in queues:
            try:
                out.append(client.queue_declare(queue, passive=True))
            except Exception:  # noqa: BLE001
                out.append(None)
                break
    finally:
        client.close()
    return out + [None] * (len(queues) - len(out))


def _teardown(broker: Broker, scenario: Scenario, exchange: str, queues: list[str]) -> str | None:
    if not broker.alive():
        return "broker not running at teardown"
    return delete_topology(broker.port, queues, exchange if scenario.fanout else None)


def delete_topology(port: int, queues: list[str], exchange: str | None,
                    timeout: float = 10.0) -> str | None:
    """Delete a scenario's queues (and its exchange); None, or what went wrong."""
    try:
        client = Client(port, timeout=timeout)
    except Exception as exc:  # noqa: BLE001
        return f"teardown connect failed: {exc!r}"
    try:
        for queue in queues:
            client.queue_delete(queue)
        if exchange is not None:
            client.exchange_delete(exchange)
    except Exception as exc:  # noqa: BLE001
        return f"teardown failed: {exc!r}"
    finally:
        client.close()
    return None


def run_flow(broker: Broker, scenario: Scenario, opts: Options) -> dict[str, Any]:
    """S1-S7: publishers -> queues -> consumers; see the module docstring."""
    seconds = opts.seconds
    if scenario.kind == "latency":
        count = max(1, int(scenario.rate * seconds))
    else:
        count = scenario.quick_count if opts.quick else scenario.count
    window = min(opts.window, max(1, WINDOW_BYTES // scenario.body_size))
    exchange, queues = _names(broker, scenario)
    _setup(broker, scenario, exchange, queues)
    clients = _Clients()
    ctx = clients.ctx
    routes = [list(range(scenario.queues)) if scenario.fanout else [p % scenario.queues]
              for p in range(scenario.publishers)]  # fmt: skip
    received_values: dict[int, list[Any]] = {q: [] for q in range(scenario.queues)}
    published_values = [ctx.RawValue("q", 0) for _ in range(scenario.publishers)]
    done_values = [ctx.RawValue("b", 0) for _ in range(scenario.publishers)]
    hard_seconds = seconds + DRAIN + 30.0
    result: dict[str, Any] = {
        "scenario": scenario.key, "title": scenario.title, "broker": broker.label, "kind": scenario.kind,
        "body_size": scenario.body_size, "publishers": scenario.publishers, "queues": scenario.queues,
        "consumers": scenario.consumers, "prefetch": scenario.prefetch,
        "ack_every": 1 if opts.ack_each else scenario.ack_every, "ack_single": opts.ack_each,
        "global_qos": opts.global_qos, "count_per_publisher": count, "window": window if not scenario.rate else None,
        "rate_per_publisher": scenario.rate or None, "seconds_cap": seconds, "errors": [],
    }  # fmt: skip
    sampler = Sampler(broker.processes, opts.sample_interval)
    try:
        for q, queue in enumerate(queues):
            for c in range(scenario.consumers_per_queue):
                value = ctx.RawValue("q", 0)
                received_values[q].append(value)
                job = {
                    "port": broker.port, "queue": queue, "name": f"c{q}.{c}", "prefetch": scenario.prefetch,
                    "ack_every": scenario.ack_every, "ack_single": opts.ack_each,
                    "global_qos": opts.global_qos, "hard_seconds": hard_seconds,
                    "capacities": [count if q in routes[p] else 0 for p in range(scenario.publishers)],
                }  # fmt: skip
                clients.spawn(loadgen.consumer_main, job, {"received": value}, f"consumer c{q}.{c}")
        clients.wait_ready(SPAWN_WAIT)
        for p in range(scenario.publishers):
            target = queues[routes[p][0]]
            job = {
                "port": broker.port, "id": p, "body_size": scenario.body_size, "count": count,
                "seconds": seconds, "window": 0 if scenario.rate else window, "rate": scenario.rate,
                "confirm": opts.confirm, "grace": DRAIN + 20.0,
                "exchange": exchange if scenario.fanout else "", "routing_key": "" if scenario.fanout else target,
            }  # fmt: skip
            extra = {
                "published": published_values[p], "done": done_values[p],
                "watch": [received_values[q] for q in routes[p]],
            }  # fmt: skip
            clients.spawn(loadgen.publisher_main, job, extra, f"publisher p{p}")
        clients.wait_ready(SPAWN_WAIT)

        sampler.start()
        time.sleep(0.2)
        t0 = sampler.mark()
        clients.go.set()
        hard_limit = t0 + hard_seconds
        next_line = t0 + 1.0
        last_total, last_change = 0, t0
        published_done_at: float | None = None
        last_line_total, last_line_t = 0, t0
        gen_peak = 0.0
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            total = sum(v.value for values in received_values.values() for v in values)
            if total != last_total:
                last_total, last_change = total, now
            if published_done_at is None and all(d.value for d in done_values):
                published_done_at = now
            if published_done_at is not None:
                complete = all(
                    sum(v.value for v in received_values[q])
                    >= sum(published_values[p].value for p in range(scenario.publishers) if q in routes[p])
                    for q in received_values
                )
                if complete:
                    break
                if now - last_change > STALL or now - published_done_at > DRAIN:
                    result["errors"].append(
                        f"stopped waiting: {total:,} deliveries, nothing new for {now - last_change:.1f} s"
                    )
                    break
            if now > hard_limit:
                result["errors"].append("hard deadline reached")
                break
            dead = clients.dead()
            if dead:
                result["errors"].append(f"client processes exited early: {', '.join(dead)}")
                break
            if not broker.alive():
                result["errors"].append("the broker exited during the run")
                break
            if now >= next_line:
                next_line += 1.0
                peak = clients.cpu_percent_max()
                gen_peak = max(gen_peak, peak)
                published = sum(v.value for v in published_values)
                rate = (total - last_line_total) / max(now - last_line_t, 1e-6)
                last_line_total, last_line_t = total, now
                broker_cpu = sampler.latest_cpu_percent()
                _progress(
                    f"  [{broker.label} {scenario.key} {now - t0:5.1f}s] published {published:>10,}  "
                    f"delivered {total:>10,} ({rate:>9,.0f}/s)  broker CPU {broker_cpu or 0:>5.0f}%  "
                    f"generator max {peak:>4.0f}%",
                    opts.progress,
                )
        t1 = sampler.mark()
    finally:
        results = clients.finish()
        sampler.stop()
        depths = _depths(broker, queues)  # after the consumers closed: their unacked are requeued
        problem = _teardown(broker, scenario, exchange, queues)
        if problem:
            result["errors"].append(problem)

    publishers = [r for r in results if r.get("role") == "publisher"]
    consumers = [r for r in results if r.get("role") == "consumer"]
    for r in results:
        if r.get("error"):
            result["errors"].append(f"{r.get('role', '?')} {r.get('id', r.get('name', '?'))}: {r['error']}")
    published = {int(r["id"]): int(r.get("published", 0)) for r in publishers}
    groups = []
    for q, queue in enumerate(queues):
        members = [r for r in consumers if r.get("queue") == queue and "seen" in r]
        expect = {p: published.get(p, 0) for p in range(scenario.publishers) if q in routes[p]}
        group = merge_group(members, expect)
        # A message still in its queue (a consumer's connection died, say) is undelivered, not lost.
        group["still_queued"] = depths[q] or 0
        group["lost"] = max(0, group["lost"] - group["still_queued"])
        groups.append(group)
    integrity = {
        key: sum(g[key] for g in groups)
        for key in (
            "expected", "distinct", "lost", "still_queued", "duplicates", "reordered", "redelivered", "foreign"
        )
    }
    if integrity["still_queued"]:
        result["errors"].append(f"{integrity['still_queued']:,} messages were left undelivered in the queues")
    if integrity["lost"]:
        result["errors"].append(
            f"{integrity['lost']:,} messages published (written to the socket, no confirms) were never delivered"
            " and are not in the queues"
        )
    delivered = sum(int(r.get("received", 0)) for r in consumers)
    last_ns = max((int(r.get("last_ns") or 0) for r in consumers), default=0)
    elapsed = max(last_ns / 1e9 - t0, 1e-6) if last_ns else max(t1 - t0, 1e-6)
    pub_wall = max((float(r.get("wall_s") or 0) for r in publishers), default=0.0)
    broker_summary = sampler.summary(t0, t1)
    generators = []
    for r in results:
        cpu, wall = r.get("cpu_s"), r.get("wall_s")
        if cpu is None or not wall:
            continue
        generators.append({
            "name": f"{r['role']} {r.get('id', r.get('name'))}", "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3), "cpu_fraction": round(cpu / wall, 3), "worker": r.get("worker"),
        })  # fmt: skip
    max_fraction = max((g["cpu_fraction"] for g in generators), default=0.0)
    span = max(t1 - t0, 1e-6)
    generator_cores = sum(g["cpu_s"] for g in generators) / span
    host_cores = broker_summary.get("host_busy_cores")
    workers_used: dict[str, int] = {}
    for r in results:
        if r.get("worker") is not None:
            key = f"{r['role']}@w{r['worker']}"
            workers_used[key] = workers_used.get(key, 0) + 1
    result.update(
        published=sum(published.values()),
        delivered=delivered,
        elapsed_s=round(elapsed, 3),
        measured_s=round(t1 - t0, 3),
        delivered_per_s=round(delivered / elapsed, 1),
        published_per_s=round(sum(published.values()) / pub_wall, 1) if pub_wall else None,
        broker_cpu=broker_summary,
        delivered_per_broker_cpu_s=round(delivered / broker_summary["cpu_s"], 1) if broker_summary["cpu_s"] else None,
        latency=latency_summary(r.get("latencies_us", b"") for r in consumers),
        integrity=integrity,
        integrity_per_queue=groups,
        generators=generators,
        generator_max_cpu_fraction=round(max_fraction, 3),
        generator_peak_cpu_percent=round(gen_peak, 1),
        generator_bound=max_fraction > GENERATOR_BOUND,
        generator_cores=round(generator_cores, 2),
        other_load_cores=(
            round(max(0.0, host_cores - broker_summary["cores_used"] - generator_cores), 2)
            if host_cores is not None and broker_summary["cores_used"] is not None else None
        ),
        connections_on_workers=workers_used,
    )
    return result


# --------------------------------------------------------------------------- S8


def _settle(broker: Broker, minimum: float = 2.0, maximum: float = 15.0) -> float:
    """Wait until the broker's summed RSS is steady (within 1 % over 1 s), between `minimum` and
    `maximum` seconds; return how long that took."""
    started = time.monotonic()
    time.sleep(minimum)
    previous = None
    while time.monotonic() - started < maximum:
        total = 0
        for process in broker.processes().values():
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        if previous is not None and abs(total - previous) <= 0.01 * max(previous, 1):
            break
        previous = total
        time.sleep(1.0)
    return round(time.monotonic() - started, 1)


def _own_allocated_mb(accounting: dict[str, Any] | None) -> float | None:
    total = (accounting or {}).get("total")
    if isinstance(total, dict) and isinstance(total.get("allocated"), int):
        return round(total["allocated"] / 2**20, 1)
    return None


def run_memory(broker: Broker, scenario: Scenario, opts: Options) -> dict[str, Any]:
    """S8: broker memory with idle connections, then with queued 128-byte messages."""
    connections = min(opts.s8_connections, 200) if opts.quick else opts.s8_connections
    messages = min(opts.s8_messages, 100_000) if opts.quick else opts.s8_messages
    result: dict[str, Any] = {
        "scenario": scenario.key, "title": scenario.title, "broker": broker.label, "kind": "memory",
        "connections": connections, "messages": messages, "body_size": 128, "errors": [],
    }  # fmt: skip

    # ---- idle connections
    _settle(broker)
    base = memory_snapshot(broker.processes())
    clients = _Clients()
    opened_value = clients.ctx.RawValue("q", 0)
    try:
        clients.spawn(
            loadgen.idle_main, {"port": broker.port, "connections": connections, "open_seconds": 120},
            {"received": opened_value}, "idle connections",
        )  # fmt: skip
        limit = time.monotonic() + 150
        next_line = time.monotonic() + 1
        while not clients.entries[0]["ready"].wait(0.2):
            if time.monotonic() > limit or not clients.entries[0]["process"].is_alive():
                break
            if time.monotonic() >= next_line:
                next_line += 1
                _progress(f"  [{broker.label} S8] idle connections opened {opened_value.value:,}", opts.progress)
        result["idle_settle_s"] = _settle(broker)
        held = memory_snapshot(broker.processes())
        held["broker_own_accounting"] = broker.memory_breakdown()
    finally:
        idle_results = clients.finish()
    idle = idle_results[0]
    opened = int(idle.get("opened", 0))
    if idle.get("error"):
        result["errors"].append(f"idle connections: {idle['error']}")
    result["idle"] = {
        "opened": opened,
        "baseline": base,
        "with_connections": held,
        "per_connection_kb_rss": round((held["rss_bytes"] - base["rss_bytes"]) / opened / 1024, 1) if opened else None,
        "per_connection_kb_pss": round((held["pss_bytes"] - base["pss_bytes"]) / opened / 1024, 1) if opened else None,
        "connections_on_workers": idle.get("workers", {}),
    }

    # ---- queued messages
    _settle(broker)
    base = memory_snapshot(broker.processes())
    exchange, queues = _names(broker, replace(scenario, queues=1))
    queue = queues[0]
    _setup(broker, replace(scenario, queues=1), exchange, queues)
    clients = _Clients()
    publishers = 2
    share = [messages // publishers + (1 if p < messages % publishers else 0) for p in range(publishers)]
    published_values = [clients.ctx.RawValue("q", 0) for _ in range(publishers)]
    done_values = [clients.ctx.RawValue("b", 0) for _ in range(publishers)]
    queued = 0
    t0 = time.monotonic()
    try:
        for p in range(publishers):
            job = {
                "port": broker.port, "id": p, "body_size": 128, "count": share[p], "seconds": opts.s8_seconds,
                "window": S8_UNCONFIRMED, "rate": 0, "confirm": True, "grace": 60.0, "exchange": "",
                "routing_key": queue,
            }  # fmt: skip
            clients.spawn(
                loadgen.publisher_main, job,
                {"published": published_values[p], "done": done_values[p], "watch": []}, f"publisher p{p}",
            )  # fmt: skip
        clients.wait_ready(SPAWN_WAIT)
        t0 = time.monotonic()
        clients.go.set()
        next_line = t0 + 1
        limit = t0 + opts.s8_seconds + 90
        probe = Client(broker.port)
        try:
            while time.monotonic() < limit:
                time.sleep(0.25)
                done = all(d.value for d in done_values)
                if time.monotonic() >= next_line or done:
                    next_line += 1
                    queued = probe.queue_declare(queue, passive=True)
                    sent = sum(v.value for v in published_values)
                    _progress(
                        f"  [{broker.label} S8 {time.monotonic() - t0:5.1f}s] published {sent:>10,}  "
                        f"queued {queued:>10,}",
                        opts.progress,
                    )
                    if done and queued >= sent:
                        break
                if clients.dead():
                    result["errors"].append(f"publishers exited early: {clients.dead()}")
                    break
            queued = probe.queue_declare(queue, passive=True)
        finally:
            probe.close()
        fill_seconds = time.monotonic() - t0
        result["queued_settle_s"] = _settle(broker)
        full = memory_snapshot(broker.processes())
        full["broker_own_accounting"] = broker.memory_breakdown()
    finally:
        pub_results = clients.finish()
    sent = sum(int(r.get("published", 0)) for r in pub_results)
    for r in pub_results:
        if r.get("error"):
            result["errors"].append(f"publisher {r.get('id')}: {r['error']}")
    if queued != sent:
        result["errors"].append(f"published {sent:,} but the queue holds {queued:,}")
    if opts.s8_drain and queued:
        result["drained"] = _drain(broker, queue, share, queued, opts)
        result["errors"].extend(result["drained"].pop("errors"))
    problem = _teardown(broker, replace(scenario, queues=1), exchange, queues)
    if problem:
        result["errors"].append(problem)
    result["queued"] = {
        "published": sent,
        "queued": queued,
        "fill_seconds": round(fill_seconds, 2),
        "baseline": base,
        "with_messages": full,
        "rss_mb": full["rss_mb"],
        "own_allocated_mb": _own_allocated_mb(full.get("broker_own_accounting")),
        "pss_mb": full["pss_mb"],
        "bytes_per_message_pss": round((full["pss_bytes"] - base["pss_bytes"]) / queued, 1) if queued else None,
        "rss_mb_per_million": round(full["rss_mb"] * 1_000_000 / queued, 1) if queued else None,
    }
    return result


def _drain(broker: Broker, queue: str, share: list[int], queued: int, opts: Options) -> dict[str, Any]:
    """S8 --s8-drain: the consumers come back. One consumer (prefetch 1,000, an ack per 100
    deliveries) takes every queued message while the broker's memory is sampled: every message
    delivered once, in order per publisher, and the peak RSS/PSS on the way."""
    clients = _Clients()
    received = clients.ctx.RawValue("q", 0)
    peak = memory_snapshot(broker.processes())
    errors: list[str] = []
    started = time.monotonic()
    try:
        job = {
            "port": broker.port, "name": "drain", "queue": queue, "prefetch": 1000, "ack_every": 100,
            "hard_seconds": opts.s8_seconds + 600, "capacities": share,
        }  # fmt: skip
        clients.spawn(loadgen.consumer_main, job, {"received": received}, "drain consumer")
        clients.wait_ready(SPAWN_WAIT)
        started = time.monotonic()
        clients.go.set()
        limit = started + opts.s8_seconds + 600
        next_line = started + 1
        while received.value < queued and time.monotonic() < limit and not clients.dead():
            time.sleep(0.5)
            snapshot = memory_snapshot(broker.processes())
            if snapshot["rss_bytes"] > peak["rss_bytes"]:
                peak = snapshot
            if time.monotonic() >= next_line:
                next_line += 5
                _progress(f"  [{broker.label} S8 drain {time.monotonic() - started:5.1f}s] received "
                          f"{received.value:>10,} of {queued:,}  RSS {snapshot['rss_mb']:,.0f} MB", opts.progress)
        seconds = time.monotonic() - started
    finally:
        (consumer,) = clients.finish()
    if consumer.get("error"):
        errors.append(f"drain consumer: {consumer['error']}")
    got = int(consumer.get("received", 0))
    if got != queued or consumer.get("duplicates") or consumer.get("reordered"):
        errors.append(f"drained {got:,} of {queued:,} (duplicates {consumer.get('duplicates')}, "
                      f"reordered {consumer.get('reordered')})")
    return {
        "received": got, "seconds": round(seconds, 1), "rate": round(got / seconds) if seconds else None,
        "duplicates": consumer.get("duplicates"), "reordered": consumer.get("reordered"),
        "peak_rss_mb": peak["rss_mb"], "peak_pss_mb": peak["pss_mb"], "errors": errors,
    }  # fmt: skip


def run(broker: Broker, scenario: Scenario, opts: Options) -> dict[str, Any]:
    started = time.monotonic()
    try:
        if scenario.kind == "memory":
            result = run_memory(broker, scenario, opts)
        else:
            result = run_flow(broker, scenario, opts)
    except Exception as exc:  # noqa: BLE001 - one failed scenario must not end the run
        result = {
            "scenario": scenario.key, "title": scenario.title, "broker": broker.label, "kind": scenario.kind,
            "errors": [f"{type(exc).__name__}: {exc}"], "failed": True,
        }  # fmt: skip
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result
