"""A broker's CPU at rest (`python -m perf.at_rest`).

No client: each broker is started, left `--settle` seconds, then its processes' CPU time is
read from `/proc/PID/task/*/schedstat` (nanoseconds on the CPU, and how many times a thread
was put on one: its wake-ups, roughly) at the start and the end of a `--seconds` window.
The brokers run one at a time (RabbitMQ first, if installed, then Shoal), `--rounds` times
in turn, so the host's other load hits them alike. psutil's CPU times count 10 ms clock
ticks, too coarse for a few hundredths of a core.

    python -m perf.at_rest                       # 20 s each, Shoal --workers 2 and RabbitMQ
    python -m perf.at_rest --seconds 30 --rounds 2 --no-rabbitmq

Printed per broker and round: cores in all, and per process its cores, wake-ups a second
and CPU a wake-up. Every broker is stopped by PID (perf.brokers) before the next starts.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from perf.brokers import Broker, RabbitBroker, ShoalBroker, rabbitmq_wanted


def schedstat(pid: int, root: str = "/proc") -> tuple[int, int]:
    """Nanoseconds on a CPU and times scheduled in, summed over the process's threads now
    (a thread gone since is not counted; (0, 0) for a process gone)."""
    ns = runs = 0
    for path in glob.glob(os.path.join(root, str(pid), "task", "*", "schedstat")):
        with contextlib.suppress(OSError, ValueError):
            on_cpu, _, slices = Path(path).read_text().split()
            ns += int(on_cpu)
            runs += int(slices)
    return ns, runs


def window(processes: dict[str, psutil.Process], seconds: float,
           read: Callable[[int], tuple[int, int]] = schedstat) -> dict[str, tuple[float, float]]:
    """Each process's cores and wake-ups a second over the next ``seconds``."""
    before = {label: read(p.pid) for label, p in processes.items()}
    start = time.monotonic()
    time.sleep(seconds)
    after = {label: read(p.pid) for label, p in processes.items()}
    wall = time.monotonic() - start
    return {label: ((after[label][0] - before[label][0]) / wall / 1e9,
                    (after[label][1] - before[label][1]) / wall)
            for label in processes if label in after}


def line(label: str, per: dict[str, tuple[float, float]]) -> str:
    total = sum(cores for cores, _ in per.values())
    parts = "  ".join(
        f"{name} {cores:.4f} ({wakes:.1f}/s, {cores / wakes * 1e3 if wakes else 0:.2f} ms each)"
        for name, (cores, wakes) in per.items() if cores or wakes)
    return f"{label:<10} {total:.4f} cores at rest   {parts}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.at_rest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured window (20)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the start before it (5)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, the brokers in turn (1)")
    parser.add_argument("--workers", type=int, default=2, help="Shoal --workers (2)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="do not run RabbitMQ even if installed")
    args = parser.parse_args(argv)
    makers: list[tuple[str, Callable[[], Broker]]] = []
    if rabbitmq_wanted(args.no_rabbitmq):
        makers.append(("rabbitmq", RabbitBroker))
    makers.append(("shoal", lambda: ShoalBroker(args.workers)))
    totals: dict[str, list[float]] = {label: [] for label, _ in makers}
    for _ in range(args.rounds):
        for label, make in makers:
            broker = make()
            try:
                time.sleep(args.settle)
                per = window(broker.processes(), args.seconds)
            finally:
                for leftover in broker.stop():
                    print(f"  ! {leftover}")
            totals[label].append(sum(cores for cores, _ in per.values()))
            print(line(label, per), flush=True)
    if len(makers) == 2 and all(totals.values()):
        shoal, rabbit = sum(totals["shoal"]), sum(totals["rabbitmq"])
        print(f"Shoal / RabbitMQ at rest: {shoal / rabbit:.2f} (sum of rounds: {shoal:.4f} / {rabbit:.4f} cores)")


if __name__ == "__main__":
    main()
