"""Durable queue declares one at a time: ms each, Shoal (its own data directory) and RabbitMQ.

    python -m perf.durable_declares [--count 1000] [--rounds 1] [--workers 2] [--no-rabbitmq]

A pika client declares ``count`` durable queues, each after the last one's declare-ok, and
deletes them afterwards (not timed). Each declare is one batch of definition changes, committed
(and checkpointed: docs/durability.md) before its declare-ok goes out, so this is what a durable
declare costs a client that waits for each. Bounded by ``count`` and the brokers' own timeouts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pika

from perf.brokers import Broker, RabbitBroker, ShoalBroker, rabbitmq_wanted


def declares(port: int, count: int) -> list[float]:
    """Seconds for each of ``count`` durable declares, one at a time."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        channel = connection.channel()
        names = [f"perf.durable-declare.{i}" for i in range(count)]
        took = []
        for name in names:
            began = time.perf_counter()
            channel.queue_declare(name, durable=True)
            took.append(time.perf_counter() - began)
        for name in names:
            channel.queue_delete(name)
        return took
    finally:
        connection.close()


def report(name: str, broker: Broker, count: int) -> None:
    took = declares(broker.port, count)
    tenth = max(1, count // 10)
    first, last = statistics.fmean(took[:tenth]), statistics.fmean(took[-tenth:])
    took.sort()
    print(f"{name:9} {count} durable declares: mean {statistics.fmean(took) * 1e3:.2f} ms, "
          f"p50 {took[len(took) // 2] * 1e3:.2f} ms, p99 {took[int(len(took) * 0.99)] * 1e3:.2f} ms "
          f"(first tenth {first * 1e3:.2f} ms, last {last * 1e3:.2f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args()
    for _ in range(args.rounds):
        shoal = ShoalBroker(args.workers)
        try:
            report("shoal", shoal, args.count)
        finally:
            shoal.stop()
        if rabbitmq_wanted(args.no_rabbitmq):
            rabbit = RabbitBroker()
            try:
                report("rabbitmq", rabbit, args.count)
            finally:
                rabbit.stop()


if __name__ == "__main__":
    main()
