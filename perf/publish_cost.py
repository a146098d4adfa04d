"""What one publish costs the broker, per process (`python -m perf.publish_cost`).

One pika publisher (no confirms) sends `--messages` bodies of `--size` octets to a queue with
``x-max-length`` 20 (the oldest are dropped, so nothing piles up), after `--warmup` messages;
a passive queue.declare at the end makes sure all of them were read. Printed per round: the
publish rate, and user + system CPU per message (psutil ``cpu_times``) of each Shoal process
(supervisor, worker0, worker1: the publisher is on one of them) with its minor page faults and
system share. The publisher is the bottleneck (pika), so the rate says little; the per-message
CPU of the publishing worker is the figure (session 11: 256 KiB bodies received in place).

    python -m perf.publish_cost                       # 256 KiB bodies, 3 rounds
    python -m perf.publish_cost --size 4096 --messages 50000

Each round starts a broker (`perf.brokers.ShoalBroker`, `--workers 2`) and stops it by PID.
"""

from __future__ import annotations

import argparse
import time

import pika
import psutil

from perf.brokers import ShoalBroker


def _faults(process: psutil.Process) -> int:
    """Minor page faults so far (/proc/PID/stat, field 10)."""
    with open(f"/proc/{process.pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def _sample(processes: dict[str, psutil.Process]) -> dict[str, tuple[float, float, int]]:
    out = {}
    for name, process in processes.items():
        times = process.cpu_times()
        out[name] = (times.user, times.system, _faults(process))
    return out


def one_round(messages: int, size: int, warmup: int, workers: int) -> str:
    broker = ShoalBroker(workers)
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        channel = connection.channel()
        channel.queue_declare("publish-cost", arguments={"x-max-length": 20})
        body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        for _ in range(warmup):
            channel.basic_publish("", "publish-cost", body)
        channel.queue_declare("publish-cost", passive=True)
        processes = broker.processes()
        before, start = _sample(processes), time.monotonic()
        for _ in range(messages):
            channel.basic_publish("", "publish-cost", body)
        channel.queue_declare("publish-cost", passive=True)  # a round trip: all of them read
        took, after = time.monotonic() - start, _sample(processes)
        connection.close()
    finally:
        broker.stop()
    parts = [f"{messages / took:8,.0f} msg/s"]
    for name in sorted(before):
        user = after[name][0] - before[name][0]
        system = after[name][1] - before[name][1]
        faults = after[name][2] - before[name][2]
        parts.append(f"{name} {(user + system) / messages * 1e6:6.1f} us"
                     f" (sys {system / messages * 1e6:5.1f}, {faults / messages:4.1f} faults)")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000, help="measured publishes (5,000)")
    parser.add_argument("--size", type=int, default=256 * 1024, help="body octets (256 KiB)")
    parser.add_argument("--warmup", type=int, default=200, help="publishes before measuring")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        print(one_round(args.messages, args.size, args.warmup, args.workers), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
