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

S8 (memory) differs: perf.memory_scenario. The scenarios and a run's options are
perf.scenario_table's; the generator processes, perf.clients'; the queues and exchange,
perf.scenario_topology's.
"""

from __future__ import annotations

import time
from typing import Any

from perf import loadgen
from perf.accounting import latency_summary, merge_group
from perf.brokers import Broker
from perf.clients import SPAWN_WAIT, Clients, progress
from perf.memory_scenario import run_memory
from perf.sampler import Sampler
from perf.scenario_table import Options, Scenario
from perf.scenario_topology import declare_topology, queue_depths, scenario_names, teardown

GENERATOR_BOUND = 0.80  # a generator process above this share of one core flags the run
STALL = 3.0  # after the publishers stop: end the run when nothing arrived for this long
DRAIN = 15.0  # ... and at most this long after they stopped
WINDOW_BYTES = 32 * 2**20  # a publisher's lead is also capped at this many body bytes


def run_flow(broker: Broker, scenario: Scenario, opts: Options) -> dict[str, Any]:
    """S1-S7: publishers -> queues -> consumers; see the module docstring."""
    seconds = opts.seconds
    if scenario.kind == "latency":
        count = max(1, int(scenario.rate * seconds))
    else:
        count = scenario.quick_count if opts.quick else scenario.count
    window = min(opts.window, max(1, WINDOW_BYTES // scenario.body_size))
    exchange, queues = scenario_names(broker, scenario)
    declare_topology(broker, scenario, exchange, queues)
    clients = Clients()
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
                progress(
                    f"  [{broker.label} {scenario.key} {now - t0:5.1f}s] published {published:>10,}  "
                    f"delivered {total:>10,} ({rate:>9,.0f}/s)  broker CPU {broker_cpu or 0:>5.0f}%  "
                    f"generator max {peak:>4.0f}%",
                    opts.progress,
                )
        t1 = sampler.mark()
    finally:
        results = clients.finish()
        sampler.stop()
        depths = queue_depths(broker, queues)  # after the consumers closed: their unacked are requeued
        problem = teardown(broker, scenario, exchange, queues)
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
        # The longest a consumer went without a delivery between its first and its last: a
        # stall (lost wake-up, a timer) shows here before it moves a percentile.
        longest_gap_ms=round(max((r.get("longest_gap_ns", 0) for r in consumers), default=0) / 1e6, 2),
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
