"""Persistent messages with publisher confirms, Shoal and RabbitMQ side by side (issue "Durability").

    python -m perf.durable [--seconds 10] [--workers 2] [--window 256] [--body 128] [--no-rabbitmq]
                           [--recover N] [--recover-only]

Scenarios (each broker in turn, same machine, same run):

    P1  persistent messages -> durable queue -> 1 consumer (prefetch 100, acks each message),
        the publisher keeping at most `window` messages unconfirmed
    P2  the same with no consumer: how fast confirmed messages pile up on disk
    R1  queue N persistent messages, stop the broker (SIGTERM), start it again on the
        same data directory: seconds until it accepts a client, and that every message is there

Figures: **confirmed msg/s** (basic.ack multiple counts every tag up to it), **delivered msg/s**
(the consumer's count / the run), **confirm p50/p99 ms** (publish written to the socket -> its
confirm read), **broker cores** (CPU of all broker processes / wall).

The publisher is this process (perf.wire, raw frames; one socket, select); the consumer is
perf.loadgen's, in a process of its own. Every run is bounded by `seconds` and by a message count.
"""

from __future__ import annotations

import argparse
import select
import shutil
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from pamqp import commands, frame

from perf import loadgen
from perf.brokers import Broker, RabbitBroker, ShoalBroker, rabbitmq_wanted
from perf.clients import SPAWN_WAIT
from perf.clients import Clients as _Clients
from perf.wire import Client, PublishBatch, publish_template, split_frames

QUEUE = "perf.durable"
MAX_MESSAGES = 2_000_000


def _percentile(values: array, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def publish_confirmed(port: int, seconds: float, window: int, body: int,
                      count: int = MAX_MESSAGES) -> dict[str, Any]:
    """Publish persistent messages for `seconds` (at most `count`), at most `window` unconfirmed;
    confirm latencies. Waits (bounded) for the last confirms."""
    client = Client(port)
    client.confirm_select()
    template, patch_at = publish_template("", QUEUE, body, 0, client.frame_max, delivery_mode=2)
    batch = PublishBatch(template, patch_at, window)
    sock = client.sock
    sent_at = array("d")  # per publish sequence number - 1: when it was written
    latencies = array("d")
    confirmed = nacked = 0
    pending = bytearray(client.take_buffered())
    started = time.monotonic()
    deadline = started + seconds
    sent = 0
    while time.monotonic() < deadline + (10 if sent >= count else 0) and confirmed + nacked < count:
        room = min(window - (sent - confirmed - nacked), count - sent)
        if room > 0 and time.monotonic() < deadline:
            now = time.monotonic()
            sock.sendall(batch.fill(room, sent, time.monotonic_ns()))
            sent_at.extend([now] * room)
            sent += room
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            continue
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the publisher's socket")
        pending += data
        frames, used = split_frames(pending)
        del pending[:used]
        now = time.monotonic()
        for _channel, raw in frames:
            if raw[0] != 1:  # heartbeats
                continue
            method = frame.unmarshal(raw)[2]
            if isinstance(method, commands.Basic.Ack | commands.Basic.Nack):
                upto = method.delivery_tag  # confirms come in publish order: all up to this one
                first = confirmed + nacked
                for seq in range(first, upto):
                    latencies.append(now - sent_at[seq])
                if isinstance(method, commands.Basic.Nack):
                    nacked += max(0, upto - first)
                else:
                    confirmed += max(0, upto - first)
            elif isinstance(method, commands.Connection.Close | commands.Channel.Close):
                raise ConnectionError(f"{type(method).__name__}: {method.reply_text}")
    wall = time.monotonic() - started
    client.close()
    return {"sent": sent, "confirmed": confirmed, "nacked": nacked, "wall": wall,
            "p50_ms": _percentile(latencies, 0.5) * 1e3, "p99_ms": _percentile(latencies, 0.99) * 1e3}


def broker_cpu(broker: Broker) -> float:
    total = 0.0
    for process in broker.processes().values():
        try:
            t = process.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 - a process that just exited
            continue
    return total


def run_p(broker: Broker, seconds: float, window: int, body: int, consumer: bool) -> dict[str, Any]:
    setup = Client(broker.port)
    setup.queue_declare(QUEUE, durable=True)
    setup.call(commands.Queue.Purge(queue=QUEUE), commands.Queue.PurgeOk)
    clients = _Clients()
    received = clients.ctx.RawValue("q", 0)
    try:
        if consumer:
            job = {"port": broker.port, "queue": QUEUE, "name": "c0", "prefetch": 100, "ack_every": 1,
                   "ack_single": True, "hard_seconds": seconds + 60, "capacities": [MAX_MESSAGES]}
            clients.spawn(loadgen.consumer_main, job, {"received": received}, "consumer")
            clients.wait_ready(SPAWN_WAIT)
            clients.go.set()
        cpu0, t0 = broker_cpu(broker), time.monotonic()
        result = publish_confirmed(broker.port, seconds, window, body)
        if consumer:  # let the consumer take what was confirmed (bounded)
            limit = time.monotonic() + 10
            while received.value < result["confirmed"] and time.monotonic() < limit:
                time.sleep(0.05)
        wall = time.monotonic() - t0
        result["cores"] = (broker_cpu(broker) - cpu0) / wall
        result["delivered"] = received.value
        result["delivered_rate"] = received.value / wall if consumer else 0.0
        result["confirmed_rate"] = result["confirmed"] / result["wall"]
    finally:
        clients.stop.set()
        for entry in clients.entries:
            entry["process"].join(10)
            if entry["process"].is_alive():
                entry["process"].kill()
        setup.queue_delete(QUEUE)
        setup.close()
    return result


def run_recovery(workers: int, count: int, body: int) -> dict[str, Any]:
    """R1: `count` persistent messages queued, SIGTERM, start again: seconds to accept a client."""
    data = Path(tempfile.mkdtemp(prefix="shoal-durable-"))
    arena_mb = max(64, count * (body + 200) * 2 // workers >> 20)
    args = ["--log-level", "info", "--data-dir", str(data), "--arena-mb", str(arena_mb)]
    try:
        broker = ShoalBroker(workers, args)
        try:
            publish_confirmed_count(broker.port, count, body)
        finally:
            broker.stop()
        t0 = time.monotonic()
        broker = ShoalBroker(workers, args)
        accepted = time.monotonic() - t0
        try:
            client = Client(broker.port)
            queued = client.queue_declare(QUEUE, passive=True)
            client.close()
            restored = [line for line in broker.log_tail(1 << 20).splitlines()
                        if "persistent message(s)" in line]
        finally:
            broker.stop()
        return {"count": count, "accept_s": accepted, "queued": queued,
                "log": restored[-1].split(": ", 1)[-1] if restored else ""}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def run_recovery_rabbitmq(count: int, body: int) -> dict[str, Any]:
    """R1 against RabbitMQ: `count` persistent messages, restart the node on its Mnesia dir."""
    broker = RabbitBroker()
    try:
        publish_confirmed_count(broker.port, count, body)
        accepted = broker.restart()
        client = Client(broker.port)
        queued = client.queue_declare(QUEUE, passive=True, durable=True)
        client.close()
        return {"count": count, "accept_s": accepted, "queued": queued, "log": ""}
    finally:
        broker.stop()


def publish_confirmed_count(port: int, count: int, body: int) -> None:
    setup = Client(port)
    setup.queue_declare(QUEUE, durable=True)
    setup.close()
    done = 0
    while done < count:
        result = publish_confirmed(port, 30.0, 1024, body, count - done)
        done += result["confirmed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--body", type=int, default=128)
    parser.add_argument("--recover", type=int, default=200_000, help="R1's message count (0: skip)")
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--recover-only", action="store_true", help="R1 only (skip P1 and P2)")
    args = parser.parse_args()
    brokers: list[tuple[str, Any]] = [("shoal", lambda: ShoalBroker(args.workers))]
    if rabbitmq_wanted(args.no_rabbitmq):
        brokers.append(("rabbitmq", RabbitBroker))
    rows = []
    for name, start in [] if args.recover_only else brokers:
        broker = start()
        try:
            for key, consumer in (("P1", True), ("P2", False)):
                r = run_p(broker, args.seconds, args.window, args.body, consumer)
                rows.append((key, name, r))
                print(f"{key} {name:9} confirmed {r['confirmed_rate']:9,.0f} msg/s  delivered "
                      f"{r['delivered_rate']:9,.0f} msg/s  confirm p50 {r['p50_ms']:6.2f} ms  "
                      f"p99 {r['p99_ms']:6.2f} ms  broker cores {r['cores']:.2f}", flush=True)
        finally:
            broker.stop()
    if args.recover:
        runs = [("shoal", lambda: run_recovery(args.workers, args.recover, args.body))]
        if any(name == "rabbitmq" for name, _ in brokers):
            runs.append(("rabbitmq", lambda: run_recovery_rabbitmq(args.recover, args.body)))
        for name, run in runs:
            r = run()
            print(f"R1 {name:9} {r['count']:,} persistent messages: accepting clients "
                  f"{r['accept_s']:.2f} s after start; {r['queued']:,} queued {r['log']}", flush=True)


if __name__ == "__main__":
    main()
