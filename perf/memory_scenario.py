"""S8, memory: the broker's RSS/PSS with N idle connections open (per connection: the growth
over the baseline / N), then with M 128-byte messages queued (no consumer), and with
``--s8-drain`` while one consumer takes them all back."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import psutil

from perf import loadgen
from perf.brokers import Broker
from perf.clients import SPAWN_WAIT, Clients, progress
from perf.sampler import memory_snapshot
from perf.scenario_table import Options, Scenario
from perf.scenario_topology import declare_topology, scenario_names, teardown
from perf.wire import Client

S8_UNCONFIRMED = 10_000  # S8 fills its queue with confirms, at most this many unconfirmed per publisher


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
    clients = Clients()
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
                progress(f"  [{broker.label} S8] idle connections opened {opened_value.value:,}", opts.progress)
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
    exchange, queues = scenario_names(broker, replace(scenario, queues=1))
    queue = queues[0]
    declare_topology(broker, replace(scenario, queues=1), exchange, queues)
    clients = Clients()
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
                    progress(
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
    problem = teardown(broker, replace(scenario, queues=1), exchange, queues)
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
    clients = Clients()
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
                progress(f"  [{broker.label} S8 drain {time.monotonic() - started:5.1f}s] received "
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
