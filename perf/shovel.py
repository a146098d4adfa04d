"""Shovel throughput between two local brokers (issue 39): never asserted, only reported.

    .venv/bin/python -m perf.shovel                   # Shoal -> Shoal, 50,000 messages
    .venv/bin/python -m perf.shovel --rabbitmq        # and RabbitMQ -> RabbitMQ (rabbitmq_shovel)
    .venv/bin/python -m perf.shovel --messages 100000 --workers 2
    .venv/bin/python -m perf.shovel --federation      # and exchange federation, Shoal -> Shoal
    .venv/bin/python -m perf.shovel --rabbitmq --federation  # all four rows in one run

Each run starts two brokers of one kind (own ports, own data directories), fills a durable
source queue on the first with persistent 128-byte messages, then declares a dynamic shovel
(on-confirm, src-prefetch-count 1000) from it to a durable queue on the second, and times the
destination's depth from the first message to the last. Shoal's shovel is declared with
``shoal ctl set_parameter``, RabbitMQ's with ``rabbitmqctl set_parameter`` (the node starts with
rabbitmq_shovel in its own enabled_plugins file; RabbitMQ is slow to start here).

The last column is the links process's CPU time per message (user + system, from psutil): the
shovel's or link's own cost, which the load of a shared host does not skew as it skews wall
time. ``--federation`` adds an exchange federation row: the downstream broker federates the topic
exchange ``perf-x`` from the upstream (on-confirm, prefetch 1000) into a durable queue bound with
``#``; once the link runs and the binding is upstream, the messages are published to the
upstream's ``perf-x`` (persistent, no confirms) and the downstream queue's depth is timed; with
``--rabbitmq`` too, the same between two RabbitMQ nodes (rabbitmq_federation). RabbitMQ's rows
have no CPU figure: its shovel and links run inside the node, beside its queues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import psutil

from perf.brokers import HOST, REPO_ROOT, RabbitBroker, ShoalBroker, rabbitmq_script

BODY = b"x" * 128
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _channel(port: int) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, port, heartbeat=0))
    return conn, conn.channel()


def depth(port: int, queue: str) -> int:
    conn, ch = _channel(port)
    try:
        return int(ch.queue_declare(queue, durable=True).method.message_count)
    finally:
        conn.close()


def fill(port: int, queue: str, count: int) -> float:
    """``count`` persistent messages into ``queue``; the seconds it took until all are there."""
    started = time.monotonic()
    conn, ch = _channel(port)
    ch.queue_declare(queue, durable=True)
    for _ in range(count):
        ch.basic_publish("", queue, BODY, PERSISTENT)
    conn.close()
    while depth(port, queue) < count:
        time.sleep(0.1)
    return time.monotonic() - started


def watch(port: int, queue: str, count: int, limit: float) -> tuple[float, float]:
    """Seconds from the first message at the destination to the last, and from the declaration."""
    declared = time.monotonic()
    first = 0.0
    end = declared + limit
    while time.monotonic() < end:
        n = depth(port, queue)
        now = time.monotonic()
        if n and not first:
            first = now
        if n >= count:
            return now - (first or declared), now - declared
        time.sleep(0.05)
    raise RuntimeError(f"only {depth(port, queue)} of {count} arrived in {limit:.0f} s")


def links_cpu(broker: ShoalBroker) -> float:
    """CPU seconds (user + system) the broker's links process has used so far: per message, the
    figure that machine load does not skew."""
    for child in psutil.Process(broker.popen.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "links.process" in " ".join(child.cmdline()):
                times = child.cpu_times()
                return float(times.user + times.system)
    return 0.0


def shovel_value(src_port: int, dest_port: int) -> dict[str, Any]:
    return {"src-uri": f"amqp://guest:guest@{HOST}:{src_port}/%2f", "src-queue": "perf-src",
            "dest-uri": f"amqp://guest:guest@{HOST}:{dest_port}/%2f", "dest-queue": "perf-dst",
            "src-prefetch-count": 1000, "ack-mode": "on-confirm"}


def run_shoal(count: int, workers: int) -> dict[str, Any]:
    src, dst = ShoalBroker(workers), ShoalBroker(workers)
    try:
        fill_s = fill(src.port, "perf-src", count)
        depth(dst.port, "perf-dst")
        control = json.loads(src.ready_file.read_text())["control"]
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", "ctl", "--control-socket", control,
             "set_parameter", "shovel", "perf", json.dumps(shovel_value(src.port, dst.port))],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise RuntimeError(done.stderr)
        moving, total = watch(dst.port, "perf-dst", count, 600)
        return {"pair": f"Shoal -> Shoal (--workers {workers})", "messages": count,
                "fill_s": fill_s, "moving_s": moving, "total_s": total,
                "links_cpu_s": links_cpu(src)}
    finally:
        src.stop()
        dst.stop()


def _ctl(broker: ShoalBroker, *args: str) -> str:
    control = json.loads(broker.ready_file.read_text())["control"]
    done = subprocess.run([sys.executable, "-m", "cli.main", "ctl", "--control-socket", control,
                           *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return done.stdout


UPSTREAM = {"prefetch-count": 1000, "ack-mode": "on-confirm"}


def federate_and_time(up_port: int, down_port: int, ctl: Callable[..., str],
                      up_bindings: Callable[[], str], count: int) -> tuple[float, float]:
    """Federate ``perf-x`` of ``down_port``'s broker from ``up_port``'s (``ctl`` runs the
    downstream's set_parameter / set_policy), publish ``count`` messages upstream once the
    binding is there; the seconds publishing took and from the first arrival to the last."""
    for port in (up_port, down_port):
        conn, ch = _channel(port)
        ch.exchange_declare("perf-x", "topic", durable=True)
        conn.close()
    conn, ch = _channel(down_port)
    ch.queue_declare("perf-fed", durable=True)
    ch.queue_bind("perf-fed", "perf-x", "#")
    conn.close()
    ctl("set_parameter", "federation-upstream", "perf", json.dumps(
        {"uri": f"amqp://guest:guest@{HOST}:{up_port}/%2f", **UPSTREAM}))
    ctl("set_policy", "perf", "^perf-x$", json.dumps({"federation-upstream": "perf"}),
        "--apply-to", "exchanges")
    end = time.monotonic() + 60
    while "perf-x" not in up_bindings():
        if time.monotonic() > end:
            raise RuntimeError("the federation link did not bind upstream in 60 s")
        time.sleep(0.2)
    started = time.monotonic()
    conn, ch = _channel(up_port)
    for _ in range(count):
        ch.basic_publish("perf-x", "k", BODY, PERSISTENT)
    conn.close()
    publish_s = time.monotonic() - started
    moving, _ = watch(down_port, "perf-fed", count, 600)
    return publish_s, moving


def run_federation(count: int, workers: int) -> dict[str, Any]:
    up, down = ShoalBroker(workers), ShoalBroker(workers)
    try:
        started = time.monotonic()
        publish_s, moving = federate_and_time(
            up.port, down.port, lambda *a: _ctl(down, *a),
            lambda: _ctl(up, "list_bindings", "source_name"), count)
        return {"pair": f"Shoal -> Shoal federated exchange (--workers {workers})",
                "messages": count, "fill_s": publish_s, "moving_s": moving,
                "total_s": time.monotonic() - started, "links_cpu_s": links_cpu(down)}
    finally:
        up.stop()
        down.stop()


def run_rabbitmq_federation(count: int) -> dict[str, Any]:
    up, down = two_rabbits()
    try:
        def ctl(*args: str) -> str:
            done = down.ctl(*args)
            if done.returncode:
                raise RuntimeError(done.stdout + done.stderr)
            return done.stdout

        started = time.monotonic()
        publish_s, moving = federate_and_time(
            up.port, down.port, ctl, lambda: up.ctl("list_bindings", "source_name").stdout,
            count)
        return {"pair": f"RabbitMQ {up.version} -> RabbitMQ federated exchange",
                "messages": count, "fill_s": publish_s, "moving_s": moving,
                "total_s": time.monotonic() - started}
    finally:
        up.stop()
        down.stop()


class ShovelRabbit(RabbitBroker):
    """A private RabbitMQ node with rabbitmq_shovel and rabbitmq_federation enabled (its own
    enabled_plugins file)."""

    def _start(self) -> None:
        (self.directory / "enabled_plugins").write_text(
            "[rabbitmq_shovel,rabbitmq_federation].\n")
        super()._start()

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        script = rabbitmq_script()
        assert script is not None
        rabbitmqctl = Path(script).with_name("rabbitmqctl")
        return subprocess.run([str(rabbitmqctl), "-n", self.nodename, *args], env=self.env,
                              capture_output=True, text=True, timeout=120)


def two_rabbits() -> tuple[ShovelRabbit, ShovelRabbit]:
    first = ShovelRabbit()
    try:
        return first, ShovelRabbit()
    except BaseException:
        first.stop()
        raise


def run_rabbitmq(count: int) -> dict[str, Any]:
    src, dst = two_rabbits()
    try:
        fill_s = fill(src.port, "perf-src", count)
        depth(dst.port, "perf-dst")
        done = src.ctl("set_parameter", "shovel", "perf",
                       json.dumps(shovel_value(src.port, dst.port)))
        if done.returncode:
            raise RuntimeError(done.stdout + done.stderr)
        moving, total = watch(dst.port, "perf-dst", count, 600)
        return {"pair": f"RabbitMQ {src.version} -> RabbitMQ", "messages": count,
                "fill_s": fill_s, "moving_s": moving, "total_s": total}
    finally:
        src.stop()
        dst.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rabbitmq", action="store_true", help="RabbitMQ -> RabbitMQ too")
    parser.add_argument("--federation", action="store_true", help="exchange federation too")
    args = parser.parse_args(argv)
    rows = [run_shoal(args.messages, args.workers)]
    if args.federation:
        rows.append(run_federation(args.messages, args.workers))
    if args.rabbitmq:
        rows.append(run_rabbitmq(args.messages))
        if args.federation:
            rows.append(run_rabbitmq_federation(args.messages))
    print("| pair | messages | msg/s (first to last) | msg/s (from declaration) "
          "| links process CPU µs/msg |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        cpu = f"{r['links_cpu_s'] * 1e6 / r['messages']:,.0f}" if r.get("links_cpu_s") else "-"
        print(f"| {r['pair']} | {r['messages']:,} | {r['messages'] / r['moving_s']:,.0f} | "
              f"{r['messages'] / r['total_s']:,.0f} | {cpu} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
