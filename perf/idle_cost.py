"""The idle cost: broker CPU at a steady, light load (`python -m perf.idle_cost`).

One publisher paced at `--rate` msg/s (default 1,000) -> one queue -> one consumer acking each
delivery on its own (basic.ack multiple=false, prefetch 10), 128-byte bodies, for `--seconds`.
The clients are `perf.loadgen`'s raw-socket processes (a few % of a core each at this rate).

What it prints, per broker and round:

- **cores** per broker process (Shoal: supervisor, worker0, worker1, ..., marked `(pub)` /
  `(con)` where the publisher / consumer is connected; RabbitMQ: beam.smp and its children) and
  in total: user + system CPU-seconds (psutil `cpu_times`) over the steady window divided by
  its wall time. The window starts `--warmup` seconds after `go` and ends when the publisher
  stops. On a busy host the broker's processes wake later, find several messages waiting and
  spend less per message (fewer cs/msg, higher latency): compare rounds run side by side
  (`--base`, `--rounds`) and with similar cs/msg;
- **us/msg**: the same CPU time divided by the deliveries within the window;
- **sys**: the kernel's share of that CPU time (system / (user + system));
- **cs/msg**: voluntary + involuntary context switches of the broker per delivered message
  (how many times a broker process went to sleep and was woken, roughly; psutil counts a
  process's main thread only, so RabbitMQ's beam.smp shows 0);
- **per process, per message** (Shoal, a second line): each process's µs of CPU and context
  switches (its wake-ups, roughly) per delivered message;
- **idle cores**: the broker's cores over `--idle` seconds before `go`, both clients connected
  and the consumer attached, nothing published;
- **p50 / p99**: end-to-end latency of every delivery (the publisher's CLOCK_MONOTONIC in the
  body to the consumer's receipt), the ping-pong figure.

    python -m perf.idle_cost                          # Shoal --workers 2, and RabbitMQ if installed
    python -m perf.idle_cost --rounds 3 --seconds 10 --no-rabbitmq
    python -m perf.idle_cost --base /tmp/base         # also a Shoal run from another checkout,
                                                      # alternating with this one, round by round
    python -m perf.idle_cost --no-rabbitmq --stages /tmp/stages   # where Shoal's latency goes

With ``--stages DIR`` each Shoal runs traced (``shoal serve --trace DIR/<label>``) and, after the
rounds, ``shoal report``'s PySpark job (the ``report`` extra and Java) reads each trace: the
table it prints splits a message's time in the broker by stage (publish parsed in the
publisher's worker -> enqueued in the supervisor -> delivered by the consumer's worker -> the
client's ack) beside the clients' end-to-end p50 and p99, which also hold both ends' sockets and
wake-ups. Tracing costs CPU (docs/tracing-and-report.md): read the CPU figures of a traced run
as such.

Brokers are started once and stay up across rounds; each round runs every broker once, in
turn (A B, then B A, ...), so load elsewhere on the host hits them alike. Everything is stopped
by PID at the end (also on Ctrl-C); `perf.brokers` reports any shared memory left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ipc.compiled import describe, describe_checkout
from perf import loadgen
from perf.accounting import latency_summary
from perf.brokers import Broker, RabbitBroker, ShoalBroker, rabbitmq_wanted
from perf.clients import Clients as _Clients
from perf.wire import Client

BODY_SIZE = 128
PREFETCH = 10
SPAWN_WAIT = 60.0
DRAIN = 5.0  # after the publisher stops, how long the consumer may take to catch up


def _cpu(processes: dict[str, psutil.Process]) -> dict[str, tuple[float, int, float, int]]:
    """CPU-seconds (user + system), context switches (voluntary + involuntary), system
    CPU-seconds and involuntary context switches of each process now."""
    out = {}
    for label, process in processes.items():
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            switches = process.num_ctx_switches()
            out[label] = (times.user + times.system, switches.voluntary + switches.involuntary, times.system,
                          switches.involuntary)
    return out


def _delta(a: dict[str, tuple[float, int, float, int]],
           b: dict[str, tuple[float, int, float, int]]) -> dict[str, tuple[float, int, float, int]]:
    return {k: (b[k][0] - a[k][0], b[k][1] - a[k][1], b[k][2] - a[k][2], b[k][3] - a[k][3]) for k in b if k in a}


def run_once(broker: Broker, seconds: float, rate: float, warmup: float, idle: float) -> dict[str, Any]:
    queue = f"idle-cost.{os.getpid()}.{time.monotonic_ns() % 10**9}"
    setup = Client(broker.port)
    try:
        setup.queue_declare(queue)
    finally:
        setup.close()
    count = int(rate * seconds)
    clients = _Clients()
    ctx = clients.ctx
    received = ctx.RawValue("q", 0)
    published, done = ctx.RawValue("q", 0), ctx.RawValue("b", 0)
    result: dict[str, Any] = {"broker": broker.label, "rate": rate, "seconds": seconds, "errors": []}
    try:
        consumer = {
            "port": broker.port, "queue": queue, "name": "c0", "prefetch": PREFETCH, "ack_every": 1,
            "ack_single": True, "hard_seconds": seconds + idle + DRAIN + 30.0, "capacities": [count],
        }  # fmt: skip
        clients.spawn(loadgen.consumer_main, consumer, {"received": received}, "consumer")
        clients.wait_ready(SPAWN_WAIT)
        publisher = {
            "port": broker.port, "id": 0, "body_size": BODY_SIZE, "count": count, "seconds": seconds,
            "window": 0, "rate": rate, "confirm": False, "grace": DRAIN + 20.0, "exchange": "",
            "routing_key": queue,
        }  # fmt: skip
        clients.spawn(loadgen.publisher_main, publisher, {"published": published, "done": done, "watch": []},
                      "publisher")  # fmt: skip
        clients.wait_ready(SPAWN_WAIT)
        processes = broker.processes()
        time.sleep(0.5)  # the connections' setup settles
        i0, t_i0 = _cpu(processes), time.monotonic()
        time.sleep(idle)
        i1, t_i1 = _cpu(processes), time.monotonic()
        clients.go.set()
        go = time.monotonic()
        time.sleep(warmup)
        c0, t0, n0 = _cpu(processes), time.monotonic(), received.value
        limit = go + seconds + DRAIN
        while not done.value and time.monotonic() < limit:
            time.sleep(0.02)
        c1, t1, n1 = _cpu(processes), time.monotonic(), received.value
        while received.value < published.value and time.monotonic() < limit:
            time.sleep(0.02)
    finally:
        results = clients.finish()
        with contextlib.suppress(Exception):
            teardown = Client(broker.port)
            teardown.queue_delete(queue)
            teardown.close()
    for r in results:
        if r.get("error"):
            result["errors"].append(f"{r.get('role', r.get('name'))}: {r['error']}")
    consumed = next((r for r in results if r.get("role") == "consumer"), {})
    if published.value != consumed.get("received"):
        result["errors"].append(f"published {published.value:,}, delivered {consumed.get('received')}")
    roles: dict[str, list[str]] = {}  # Shoal: which worker holds the publisher, the consumer
    for r in results:
        if r.get("worker") is not None:
            roles.setdefault(f"worker{r['worker']}", []).append(str(r["role"])[:3])
    cpu, wall, delivered = _delta(c0, c1), t1 - t0, n1 - n0
    cpu = {f"{k}({'+'.join(sorted(roles[k]))})" if k in roles else k: v for k, v in cpu.items()}
    idle_cpu = _delta(i0, i1)
    total_cpu = sum(c[0] for c in cpu.values())
    result.update(
        wall_s=round(wall, 3),
        delivered=delivered,
        cores={k: round(c[0] / wall, 3) for k, c in cpu.items()},
        # per process and message: µs of CPU, context switches, the kernel's µs of that CPU and
        # the involuntary (preempted) switches of those
        per_message={k: (round(c / delivered * 1e6, 1), round(s / delivered, 2),
                         round(sy / delivered * 1e6, 1), round(inv / delivered, 2))
                     for k, (c, s, sy, inv) in cpu.items() if delivered and c > 0},
        system_share=round(sum(c[2] for c in cpu.values()) / total_cpu, 3) if total_cpu else None,
        cores_total=round(total_cpu / wall, 3),
        us_per_msg=round(total_cpu / delivered * 1e6, 1) if delivered else None,
        cs_per_msg=round(sum(c[1] for c in cpu.values()) / delivered, 2) if delivered else None,
        idle_cores=round(sum(c[0] for c in idle_cpu.values()) / (t_i1 - t_i0), 4),
        latency=latency_summary(r.get("latencies_us", b"") for r in results if r.get("role") == "consumer"),
        clients_cores={r.get("role"): round(r["cpu_s"] / r["wall_s"], 3) for r in results if r.get("wall_s")},
    )
    return result


def _line(result: dict[str, Any]) -> str:
    lat = result["latency"]
    per = "  ".join(f"{k} {v:.3f}" for k, v in result["cores"].items())
    flag = "  ! " + "; ".join(result["errors"]) if result["errors"] else ""
    per_message = "  ".join(f"{k} {us} us (sys {sys_us}) {cs} cs ({involuntary} involuntary)"
                            for k, (us, cs, sys_us, involuntary) in result["per_message"].items())
    if result["label"].startswith("shoal"):
        flag += f"\n{'':<14} per message: {per_message}"
    return (
        f"{result['label']:<14} cores {result['cores_total']:.3f} ({per})  {result['us_per_msg']} us/msg  "
        f"{result['cs_per_msg']} cs/msg  sys {result['system_share']:.0%}  idle {result['idle_cores']:.3f}  "
        f"p50 {lat.get('p50_ms')} ms  p99 {lat.get('p99_ms')} ms{flag}"
    )


def _role(process: str) -> str:
    """A process's part in the run: ``worker1(con)`` is the consumer's worker, whichever it is."""
    if process.endswith("(con)"):
        return "consumer's worker"
    if process.endswith("(pub)"):
        return "publisher's worker"
    if process.endswith("(con+pub)"):
        return "both clients' worker"
    return process


def per_process_table(results: list[dict[str, Any]], labels: list[str]) -> str:
    """The median over rounds of each process's µs of CPU (of it the kernel's) and context
    switches (of them involuntary: preempted, not asleep) per delivered message, by its part
    (supervisor, publisher's worker, consumer's worker), the broker's total, and the total
    against RabbitMQ's median; a markdown table."""
    roles: list[str] = []
    for r in results:
        for process in r["per_message"]:
            role = _role(process)
            if role not in roles and not role.startswith(("python:", "erl_", "inet_", "sh:")):
                roles.append(role)
    rabbit = [r["us_per_msg"] for r in results if r["label"] == "rabbitmq" and r["us_per_msg"]]
    rabbit_us = statistics.median(rabbit) if rabbit else None
    lines = ["per message, median of rounds: µs of CPU (the kernel's) / context switches (involuntary)",
             "| broker | " + " | ".join(roles) + " | broker | / RabbitMQ |",
             "|---|" + "---:|" * (len(roles) + 2)]
    for label in labels:
        mine = [r for r in results if r["label"] == label and r["us_per_msg"]]
        if not mine:
            continue
        cells = []
        for role in roles:
            found = [v for r in mine for k, v in r["per_message"].items() if _role(k) == role]
            if not found:
                cells.append("")
                continue
            us, cs, sys_us, involuntary = (statistics.median(v[i] for v in found) for i in range(4))
            cells.append(f"{us:.0f} ({sys_us:.0f}) / {cs:.2f} ({involuntary:.2f})")
        total = statistics.median(r["us_per_msg"] for r in mine)
        switches = statistics.median(r["cs_per_msg"] for r in mine)
        ratio = f"{total / rabbit_us:.2f}" if rabbit_us and label != "rabbitmq" else ""
        cells.append(f"{total:.0f} / {switches:.2f}" if label != "rabbitmq" else f"{total:.0f}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def _trace_args(stages: Path | None, label: str, traces: dict[str, Path]) -> list[str]:
    """``shoal serve``'s arguments to trace the broker ``label`` under ``stages`` (none without
    ``--stages``); the directory is remembered in ``traces``."""
    if stages is None:
        return []
    directory = stages.resolve() / label.replace("@", "-").replace("/", "-")
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):  # another run's trace would be read with this one's
        raise SystemExit(f"--stages: {directory} is not empty")
    traces[label] = directory
    return ["--trace", str(directory)]


def _shoal_from(checkout: Path, workers: int, extra_args: list[str] | None = None) -> ShoalBroker:
    """A Shoal run from another checkout (same interpreter): `python -m` puts the cwd first on
    sys.path, so the supervisor and the workers it spawns import that checkout's code."""
    command = f"sh -c 'cd {shlex.quote(str(checkout))} && exec {shlex.quote(sys.executable)} -m cli.main \"$@\"' shoal"
    saved = os.environ.get("SHOAL_SERVE")
    os.environ["SHOAL_SERVE"] = command
    try:
        return ShoalBroker(workers, extra_args)
    finally:
        if saved is None:
            os.environ.pop("SHOAL_SERVE", None)
        else:
            os.environ["SHOAL_SERVE"] = saved


# The report's latency stages (summary.json's latency_us), in a message's order, and their words.
STAGES = (
    ("publish_to_enqueue", "publish parsed -> enqueued"),
    ("enqueue_to_deliver", "enqueued -> delivered"),
    ("publish_to_deliver", "publish parsed -> delivered"),
    ("deliver_to_ack", "delivered -> client's ack read"),
)


def stage_table(latency: dict[str, dict[str, Any]], clients: dict[str, tuple[float | None, float | None]]) -> str:
    """Each traced broker's stages, p50 / p99 in µs (``latency``: its label -> the report's
    ``latency_us``), and the clients' end-to-end p50 / p99 of its rounds (``clients``: label ->
    ms, medians of the rounds); a markdown table."""
    lines = ["| µs, p50 / p99 | " + " | ".join(words for _, words in STAGES) + " | clients, end to end |",
             "|---|" + "---:|" * (len(STAGES) + 1)]
    for label, stages in latency.items():
        cells = []
        for key, _ in STAGES:
            got = stages.get(key) or {}
            p50, p99 = got.get("p50"), got.get("p99")
            cells.append(f"{p50:.0f} / {p99:.0f}" if p50 is not None and p99 is not None else "")
        p50_ms, p99_ms = clients.get(label, (None, None))
        end = f"{p50_ms * 1000:.0f} / {p99_ms * 1000:.0f}" if p50_ms is not None and p99_ms is not None else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {end} |")
    return "\n".join(lines)


def _stages(traces: dict[str, Path], results: list[dict[str, Any]]) -> None:
    """``shoal report``'s job over each trace, then :func:`stage_table`."""
    from report import prerequisites

    missing = prerequisites.missing()
    if missing:
        print(f"--stages: {missing}", file=sys.stderr)
        return
    from report.job import run_report

    latency: dict[str, dict[str, Any]] = {}
    for label, directory in traces.items():
        paths = run_report(str(directory), str(directory / "report"))
        latency[label] = json.loads(Path(paths["summary"]).read_text()).get("latency_us", {})
    clients = {}
    for label in traces:
        mine = [r["latency"] for r in results if r["label"] == label]
        p50 = [x["p50_ms"] for x in mine if x.get("p50_ms") is not None]
        p99 = [x["p99_ms"] for x in mine if x.get("p99_ms") is not None]
        clients[label] = (statistics.median(p50) if p50 else None, statistics.median(p99) if p99 else None)
    print()
    print(stage_table(latency, clients))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.idle_cost", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time per round (10)")
    parser.add_argument("--rate", type=float, default=1000.0, help="msg/s (1000)")
    parser.add_argument("--workers", type=int, default=2, help="Shoal --workers (2)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per broker, interleaved (1)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds after go before the window (1)")
    parser.add_argument("--idle", type=float, default=2.0, help="idle measurement before go, seconds (2)")
    parser.add_argument("--base", type=Path, action="append", default=[],
                        help="also run Shoal from this checkout (repeatable)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="do not run RabbitMQ even if installed")
    parser.add_argument("--json-out", type=Path, help="write every round's result here")
    parser.add_argument("--stages", type=Path, metavar="DIR",
                        help="trace each Shoal into DIR/<label> and print its latency by stage (PySpark)")
    args = parser.parse_args(argv)
    args.seconds = min(max(args.seconds, args.warmup + 1.0), 120.0)

    brokers: list[tuple[str, Broker]] = []
    results: list[dict[str, Any]] = []
    traces: dict[str, Path] = {}
    try:
        print(f"shoal: {describe()}", flush=True)
        brokers.append(("shoal", ShoalBroker(args.workers, _trace_args(args.stages, "shoal", traces))))
        for checkout in args.base:
            label = f"shoal@{checkout.name}"
            print(f"{label}: {describe_checkout(checkout.resolve())}", flush=True)
            brokers.append((label, _shoal_from(checkout.resolve(), args.workers,
                                               _trace_args(args.stages, label, traces))))
        if rabbitmq_wanted(args.no_rabbitmq):
            brokers.append(("rabbitmq", RabbitBroker()))
        for round_no in range(args.rounds):
            order = brokers if round_no % 2 == 0 else brokers[::-1]
            for label, broker in order:
                if not broker.alive():
                    print(f"{label}: not running; skipped", file=sys.stderr)
                    continue
                result = run_once(broker, args.seconds, args.rate, args.warmup, args.idle)
                result.update(label=label, round=round_no)
                results.append(result)
                print(_line(result), flush=True)
    finally:
        for label, broker in brokers:
            for problem in broker.stop():
                print(f"{label}: {problem}", file=sys.stderr)
    if len(results) > 1:
        print()
        print(per_process_table(results, [label for label, _ in brokers]))
        print("\nmean over rounds:")
        for label, _ in brokers:
            mine = [r for r in results if r["label"] == label]
            if not mine:
                continue
            by_role = [{_role(k): v for k, v in r["cores"].items()} for r in mine]  # workers swap parts
            mean = {k: round(sum(c.get(k, 0) for c in by_role) / len(mine), 3) for k in by_role[0]}
            p50 = sorted(r["latency"].get("p50_ms") or 0 for r in mine)
            p99 = sorted(r["latency"].get("p99_ms") or 0 for r in mine)
            print(f"{label:<14} cores {sum(r['cores_total'] for r in mine) / len(mine):.3f} {mean}  "
                  f"p50 median {p50[len(p50) // 2]} ms  p99 median {p99[len(p99) // 2]} ms")
    if traces and results:
        _stages(traces, results)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=1))
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
