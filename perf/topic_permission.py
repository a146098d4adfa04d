"""What a topic permission costs the publish path (`python -m perf.topic_permission`).

One raw publisher (perf.wire's pre-encoded frames, no confirms, 128-byte bodies) sends to
`amq.topic`, bound to a queue with ``x-max-length`` 1000 (the oldest are dropped: nothing piles
up), as guest. Rows, on one broker:

- no topic permission: the check is one truthiness test;
- a topic permission for guest on amq.topic (``set_topic_permissions guest amq.topic ^orders\\.
  .*``), the publisher cycling through 16 routing keys (a usual publisher);
- the same with every routing key different (`--unique` of them, cycled): the worst case for a
  cache of verdicts.

A passive queue.declare on the publisher's channel after each row makes sure the supervisor has
handled every publish. Printed per row: msg/s, msg per broker CPU-second (supervisor and
workers, psutil ``cpu_times``) and the supervisor's CPU microseconds per message (it checks topic
permissions). Timings are printed, never asserted.

    python -m perf.topic_permission                   # 300,000 messages a row, 1 worker
    python -m perf.topic_permission --messages 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil
from pamqp import commands

from perf.brokers import ShoalBroker, shoal_command
from perf.wire import Client, publish_template

QUEUE = "topic-permission-cost"
BODY = 128


def broker_cpu(broker: ShoalBroker) -> tuple[float, float]:
    """CPU seconds so far: all the broker's processes, and the supervisor alone."""
    total = supervisor = 0.0
    for name, process in broker.processes().items():
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
        if name == "supervisor":
            supervisor += times.user + times.system
    return total, supervisor


def ctl(broker: ShoalBroker, *args: str) -> None:
    control = str((broker._ready() or {})["control"])
    subprocess.run([*shoal_command(), "ctl", "--control-socket", control, "-q", *args],
                   check=True, capture_output=True, timeout=60)


def frames_for(keys: list[str], frame_max: int) -> bytes:
    return b"".join(publish_template("amq.topic", key, BODY, 0, frame_max)[0] for key in keys)


def one_row(broker: ShoalBroker, keys: list[str], messages: int) -> dict[str, float]:
    client = Client(broker.port)
    try:
        client.queue_declare(QUEUE, passive=True)
        batch = frames_for(keys, client.frame_max)
        per_batch = len(keys)
        cpu, supervisor = broker_cpu(broker)
        started = time.monotonic()
        sent = 0
        while sent < messages:
            client.sock.sendall(batch)
            sent += per_batch
        client.queue_declare(QUEUE, passive=True)  # every publish before it was handled
        elapsed = time.monotonic() - started
        cpu_after, supervisor_after = broker_cpu(broker)
    finally:
        client.close()
    return {"msg_s": sent / elapsed, "msg_cpu_s": sent / max(cpu_after - cpu, 1e-9),
            "sup_us": (supervisor_after - supervisor) / sent * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--unique", type=int, default=20_000, help="routing keys of the last row")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    usual = [f"orders.{region}.{n}" for region in ("eu", "us", "ap", "sa") for n in range(4)]
    unique = [f"orders.{n}" for n in range(args.unique)]
    rows: list[tuple[str, dict[str, float]]] = []
    broker = ShoalBroker(args.workers)
    try:
        setup = Client(broker.port)
        setup.call(commands.Queue.Declare(queue=QUEUE, arguments={"x-max-length": 1000}),
                   commands.Queue.DeclareOk)
        setup.queue_bind(QUEUE, "amq.topic", "orders.#")
        setup.close()
        for _ in range(args.rounds):
            ctl(broker, "clear_topic_permissions", "guest")
            rows.append(("none", one_row(broker, usual, args.messages)))
            ctl(broker, "set_topic_permissions", "guest", "amq.topic", "^orders\\.", ".*")
            rows.append(("16 keys", one_row(broker, usual, args.messages)))
            rows.append((f"{args.unique:,} keys", one_row(broker, unique, args.messages)))
            for name, row in rows[-3:]:
                print(f"{name:14} {row['msg_s']:10.0f} msg/s {row['msg_cpu_s']:10.0f} msg/CPU-s "
                      f"{row['sup_us']:6.2f} us supervisor/msg", file=sys.stderr)
    finally:
        for problem in broker.stop():
            print(problem, file=sys.stderr)
    print("| topic permission | msg/s | msg per broker CPU-s | supervisor µs per msg |")
    print("|---|---:|---:|---:|")
    for name, row in rows:
        print(f"| {name} | {row['msg_s']:.0f} | {row['msg_cpu_s']:.0f} | {row['sup_us']:.2f} |")


if __name__ == "__main__":
    main()
