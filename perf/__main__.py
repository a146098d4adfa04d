"""Shoal side by side with RabbitMQ: `python -m perf` (see perf/README.md).

    python -m perf                         # S1-S8 against Shoal, then against RabbitMQ if installed
    python -m perf --scenarios S1,S3 --seconds 5
    python -m perf --quick                 # small counts, 3 s per scenario: a smoke run
    python -m perf --workers-scaling       # S1-S4 against Shoal with --workers 1, 2, 4 (and 8 on 8+ CPUs)
    python -m perf --no-rabbitmq --json-out perf/results/mine.json
    python -m perf --scenarios overload --seconds 10    # S7u, S1u, S3u (+ ping-pong), S4u, S9u, S10u: overload shapes
    python -m perf --scenarios S3u,S4u --no-rabbitmq --generator python
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipc.compiled import describe
from perf import cgen, overload, report_table
from perf.brokers import Broker, RabbitBroker, ShoalBroker, rabbitmq_available
from perf.overload import OVERLOAD_SCENARIOS, OverloadOptions, OverloadScenario
from perf.scenario_table import SCENARIOS, Options, Scenario
from perf.scenarios import run

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCALING_WORKERS = (1, 2, 4, 8)  # those up to the host's CPUs (at least 4) run by default
SCALING_SCENARIOS = ("S1", "S2", "S3", "S4")
ALIASES: dict[str, list[str]] = {
    "classic": list(SCENARIOS),
    "overload": list(OVERLOAD_SCENARIOS),
    "all": [*SCENARIOS, *OVERLOAD_SCENARIOS],
}


def _worker_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of worker counts: {text!r}") from exc
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be 1 or more: {text!r}")
    return counts


def default_scaling_workers(cpus: int) -> tuple[int, ...]:
    """--workers-scaling's worker counts on a host with ``cpus`` CPUs: 1, 2, 4 and 8 as far as
    the CPUs go (4 even on fewer, as before: the oversubscribed figure shows what it costs)."""
    return tuple(w for w in SCALING_WORKERS if w <= max(4, cpus))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m perf", description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--scenarios", default="",
        help="comma-separated keys or groups (classic = S1-S8, overload = S7u,S1u,S3u,S4u,S9u,S10u, all), e.g. S1,S3u "
        "(default: classic)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=None, help="cap per scenario (default 10; 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small counts and 3 s per scenario (a smoke run)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="Shoal --workers (default: CPUs)")
    parser.add_argument(
        "--workers-scaling", action="store_true",
        help="S1-S4 against Shoal with each of --scaling-workers, and which process saturates first",
    )  # fmt: skip
    parser.add_argument(
        "--scaling-workers", type=_worker_counts, default=None,
        help="comma-separated --workers values for --workers-scaling (default: 1, 2, 4, 8 up to the "
             "host's CPUs, at least up to 4)",
    )  # fmt: skip
    parser.add_argument("--no-rabbitmq", action="store_true", help="do not run RabbitMQ even if installed")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run each throughput scenario (S1-S6) this many times against both brokers, the first "
             "broker alternating, and add each round's ratios and their median (ratios near 1 on a "
             "shared host need several rounds); the tables and JSON results are the first round's",
    )
    parser.add_argument("--json-out", type=Path, help="results file (default perf/results/<timestamp>.json)")
    parser.add_argument("--window", type=int, default=10_000, help="publisher lead over its consumers (10000)")
    parser.add_argument("--confirm", action="store_true", help="publishers use publisher confirms")
    parser.add_argument("--ack-each", action="store_true",
                        help="consumers ack every delivery on its own (multiple=false), as pika, "
                             "kombu and aio-pika do by default, instead of every 50 (5 in S3)")
    parser.add_argument("--global-qos", action="store_true",
                        help="consumers set basic.qos global=true (one prefetch per channel, as "
                             "celery asks of RabbitMQ) instead of per consumer")
    parser.add_argument("--sample-interval", type=float, default=0.5, help="psutil sampling interval, s (0.5)")
    parser.add_argument("--s8-messages", type=int, default=1_000_000, help="S8 queued messages (1,000,000)")
    parser.add_argument("--s8-connections", type=int, default=1_000, help="S8 idle connections (1,000)")
    parser.add_argument("--s8-drain", action="store_true",
                        help="S8: then consume every queued message, with the peak memory on the way")
    parser.add_argument("--quiet", action="store_true", help="no per-second progress lines")
    parser.add_argument(
        "--generator", choices=cgen.GENERATOR_CHOICES, default="auto",
        help="overload scenarios: C generator (c), Python processes (python), or C when it builds (auto)",
    )  # fmt: skip
    parser.add_argument(
        "--python-publishers", type=int, default=2,
        help="Python fallback: publisher processes standing in for one unbounded publisher (2)",
    )  # fmt: skip
    parser.add_argument("--steady-rate", type=float, default=1000.0, help="S7u's paced rate, msg/s (1000)")
    parser.add_argument("--ping-pong-seconds", type=float, default=5.0, help="the ping-pong after S3u, s (5)")
    parser.add_argument("--ping-pong-rate", type=float, default=1000.0, help="the ping-pong's rate, msg/s (1000)")
    args = parser.parse_args(argv)
    if args.python_publishers < 1:
        parser.error("--python-publishers must be at least 1")
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    return args


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def resolve_keys(spec: str) -> list[str]:
    """Scenario keys named by `--scenarios` (keys in any case, or a group of ALIASES), in the order
    given, each once; '' is the classic set. Unknown names end the program with the known ones."""
    if not spec.strip():
        return list(SCENARIOS)
    known = {k.upper(): k for k in [*SCENARIOS, *OVERLOAD_SCENARIOS]}
    keys: list[str] = []
    unknown: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part.lower() in ALIASES:
            named = ALIASES[part.lower()]
        elif part.upper() in known:
            named = [known[part.upper()]]
        else:
            unknown.append(part)
            continue
        keys.extend(k for k in named if k not in keys)
    if unknown:
        raise SystemExit(
            f"unknown scenarios: {', '.join(unknown)} "
            f"(known: {', '.join(known.values())}; groups: {', '.join(ALIASES)})"
        )
    return keys


AnyScenario = Scenario | OverloadScenario


def _select(spec: str, allowed: tuple[str, ...] | None = None) -> list[AnyScenario]:
    keys = resolve_keys(spec)
    if allowed is not None:
        keys = [k for k in keys if k in allowed]
    return [SCENARIOS[k] if k in SCENARIOS else OVERLOAD_SCENARIOS[k] for k in keys]


def _one_line(result: dict[str, Any]) -> str:
    if result.get("kind") == "memory":
        idle, queued = result.get("idle") or {}, result.get("queued") or {}
        text = (
            f"{queued.get('queued', 0):,} queued: RSS {queued.get('rss_mb')} MB, PSS {queued.get('pss_mb')} MB; "
            f"idle connection {idle.get('per_connection_kb_pss')} KB (PSS)"
        )
    elif result.get("failed"):
        text = "FAILED"
    elif result.get("kind") in ("unbounded", "steady"):
        latency = result.get("latency") or {}
        text = (
            f"published {result.get('published_per_s') or 0:,.0f} msg/s, "
            f"delivered {result.get('delivered_per_s') or 0:,.0f} msg/s, backlog at end {result.get('backlog_end')}, "
            f"broker {result.get('broker_cores')} cores, "
            f"p50 {latency.get('p50_ms')} ms p99 {latency.get('p99_ms')} ms, generator {result.get('generator')}"
        )
        after = result.get("after")
        if isinstance(after, dict):
            text += (
                f"; then {after.get('scenario')}: p50 {(after.get('latency') or {}).get('p50_ms')} ms "
                f"p99 {(after.get('latency') or {}).get('p99_ms')} ms"
            )
    else:
        latency = result.get("latency") or {}
        text = (
            f"{result.get('delivered_per_s', 0):,.0f} msg/s delivered, "
            f"{result.get('delivered_per_broker_cpu_s') or 0:,.0f} msg per broker CPU-s, "
            f"p50 {latency.get('p50_ms')} ms p99 {latency.get('p99_ms')} ms, "
            f"longest pause {result.get('longest_gap_ms')} ms, "
            f"lost/dup/reord {report_table.integrity(result)}, generator {report_table.gen_flag(result)}"
        )
    errors = result.get("errors") or []
    suffix = f"  [{len(errors)} error(s)]" if errors else ""
    return f"{result.get('broker')} {result.get('scenario')}: {text}{suffix}"


class Session:
    """One broker (kind and settings) across the selected scenarios: started on first use,
    restarted fresh for S8 and whenever it died, stopped by `close`."""

    def __init__(
        self, name: str, factory: Callable[[], Broker], opts: Options, overload_opts: OverloadOptions | None = None
    ):
        self.name = name
        self.factory = factory
        self.opts = opts
        self.overload_opts = overload_opts or OverloadOptions()
        self.broker: Broker | None = None
        self.problems: list[str] = []
        self.described: dict[str, Any] = {}

    def _fresh(self) -> Broker:
        self._stop()
        _say(f"starting {self.name} ...")
        started = time.monotonic()
        self.broker = self.factory()
        self.described = self.broker.describe()
        _say(f"{self.broker.label} ready on 127.0.0.1:{self.broker.port} in {time.monotonic() - started:.1f} s")
        return self.broker

    def _stop(self) -> None:
        if self.broker is not None:
            broker, self.broker = self.broker, None
            problems = broker.stop()
            self.problems.extend(f"{broker.label}: {p}" for p in problems)
            for problem in problems:
                _say(f"cleanup: {problem}")

    def run_one(self, scenario: AnyScenario) -> dict[str, Any]:
        try:
            if self.broker is None or scenario.kind == "memory":
                self._fresh()
            elif not self.broker.alive():
                self.problems.append(f"{self.broker.label} had died before {scenario.key}; restarted")
                _say(f"{self.broker.label} is not running; restarting it. Log:\n{self.broker.log_tail()}")
                self._fresh()
        except Exception as exc:  # noqa: BLE001 - a broker that will not start fails its scenarios
            self.problems.append(f"{self.name} did not start: {exc}")
            _say(f"{self.name} did not start: {exc}")
            self.broker = None
            return {"scenario": scenario.key, "title": scenario.title, "broker": self.name,
                    "kind": scenario.kind, "failed": True, "errors": [f"broker did not start: {exc}"]}  # fmt: skip
        assert self.broker is not None
        _say(f"== {self.broker.label} {scenario.key}: {scenario.title}")
        if isinstance(scenario, OverloadScenario):
            result = overload.run(self.broker, scenario, self.overload_opts)
        else:
            result = run(self.broker, scenario, self.opts)
        if not self.broker.alive():
            result.setdefault("errors", []).append("broker not running after the scenario")
        if result.get("errors"):
            result["broker_log_tail"] = self.broker.log_tail(8000)
        _say(_one_line(result))
        for error in result.get("errors") or []:
            _say(f"  ! {error}")
        return result

    def close(self) -> None:
        self._stop()


def _source_version() -> str:
    """The commit the Shoal under test was started from (read-only git), '+dirty' with local edits."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through every finally: clients and brokers are stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    opts = Options(
        seconds=args.seconds, quick=args.quick, window=args.window, confirm=args.confirm,
        ack_each=args.ack_each, global_qos=args.global_qos,
        sample_interval=args.sample_interval, s8_messages=args.s8_messages,
        s8_connections=args.s8_connections, s8_drain=args.s8_drain, progress=not args.quiet,
    )  # fmt: skip
    overload_opts = OverloadOptions(
        seconds=args.seconds, python_publishers=args.python_publishers, steady_rate=args.steady_rate,
        ping_pong_seconds=args.ping_pong_seconds, ping_pong_rate=args.ping_pong_rate,
        sample_interval=args.sample_interval, progress=not args.quiet,
    )  # fmt: skip
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python -m perf " + " ".join(argv if argv is not None else sys.argv[1:]),
        "host": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        },
        "options": vars(opts),
        "shoal_source": _source_version(),
        "shoal_hot_path": describe(),
    }  # fmt: skip
    selected = _select(args.scenarios)
    if any(isinstance(s, OverloadScenario) for s in selected) and not args.workers_scaling:
        try:
            overload_opts.generator = cgen.choose_generator(args.generator, cgen.build, args.python_publishers)
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from exc
        _say(overload_opts.generator.note)
        report["generator"] = {"kind": overload_opts.generator.kind, "note": overload_opts.generator.note,
                               "binary": str(overload_opts.generator.binary or "")}  # fmt: skip
        report["overload_options"] = {k: v for k, v in vars(overload_opts).items() if k != "generator"}
    problems: list[str] = []
    markdown: list[str] = []

    try:
        if args.workers_scaling:
            scenarios = _select(args.scenarios, SCALING_SCENARIOS)
            counts = args.scaling_workers or default_scaling_workers(os.cpu_count() or 1)
            scaling: dict[int, dict[str, dict[str, Any]]] = {w: {} for w in counts}
            by_workers = {w: Session(f"shoal --workers {w}", functools.partial(ShoalBroker, w), opts) for w in counts}
            try:  # interleaved, as below: each scenario against w=1, 2, 4, ... in turn
                for scenario in scenarios:
                    for workers, session in by_workers.items():
                        scaling[workers][scenario.key] = session.run_one(scenario)
            finally:
                for session in by_workers.values():
                    session.close()
                    problems += session.problems
            report["scaling"] = {str(w): list(per.values()) for w, per in scaling.items()}
            markdown.append("Shoal scaling with --workers (delivered msg/s):\n\n"
                            + report_table.scaling_table(scaling, cpus=os.cpu_count()))
            all_results = [r for per in scaling.values() for r in per.values()]
        else:
            scenarios = _select(args.scenarios)
            # Interleaved: each scenario runs against Shoal, then at once against RabbitMQ (both
            # brokers stay up, the idle one costs next to nothing), so load from elsewhere on the host
            # that comes and goes affects both sides of a ratio alike.
            shoal_session = Session(
                f"shoal --workers {args.workers}", functools.partial(ShoalBroker, args.workers), opts, overload_opts
            )
            sessions = [shoal_session]
            why_not = "--no-rabbitmq" if args.no_rabbitmq else rabbitmq_available()
            if why_not is None:
                sessions.append(Session("rabbitmq", RabbitBroker, opts, overload_opts))
            else:
                _say(f"RabbitMQ skipped: {why_not}")
            outcome: dict[str, list[dict[str, Any]]] = {s.name: [] for s in sessions}
            rounds: dict[str, list[dict[str, dict[str, Any]]]] = {}
            try:
                for scenario in scenarios:
                    repeat = args.rounds if isinstance(scenario, Scenario) and scenario.kind == "throughput" else 1
                    for n in range(max(repeat, 1)):
                        got = {s.name: s.run_one(scenario) for s in (sessions if n % 2 == 0 else sessions[::-1])}
                        rounds.setdefault(scenario.key, []).append(got)
                        if n == 0:
                            for session in sessions:
                                outcome[session.name].append(got[session.name])
            finally:
                for session in sessions:
                    session.close()
                    problems += session.problems
            shoal = outcome[shoal_session.name]
            report["shoal"] = {"broker": shoal_session.described, "results": shoal}
            rabbit: list[dict[str, Any]] = []
            if len(sessions) > 1:
                rabbit = outcome[sessions[1].name]
                report["rabbitmq"] = {"broker": sessions[1].described, "results": rabbit}
            else:
                report["rabbitmq"] = {"skipped": why_not}
            by_key_s = {r["scenario"]: r for r in shoal}
            by_key_r = {r["scenario"]: r for r in rabbit}
            flow = [s.key for s in scenarios if isinstance(s, Scenario) and s.kind != "memory"]
            if flow:
                markdown.append(
                    "Shoal / RabbitMQ (msg/s: higher is better; p99: lower is better):\n\n"
                    + report_table.comparison_table([(k, by_key_s.get(k), by_key_r.get(k)) for k in flow])
                )
                markdown.append(
                    "Where the broker's CPU goes (µs a delivered message, user + system; the system part is "
                    "the kernel's: socket copies, wake-ups):\n\n"
                    + report_table.cpu_split_table([(k, by_key_s.get(k), by_key_r.get(k)) for k in flow])
                )
            if args.rounds > 1 and rabbit:
                repeated = [(key, report_table.round_ratios(
                    [(got.get(shoal_session.name), got.get(sessions[1].name)) for got in runs]
                )) for key, runs in rounds.items() if len(runs) > 1]
                report["rounds"] = {key: ratios for key, ratios in repeated}
                markdown.append(f"Shoal / RabbitMQ in each of {args.rounds} rounds (the first broker "
                                "alternating):\n\n" + report_table.rounds_table(repeated))
            if "S8" in [s.key for s in scenarios]:
                markdown.append(report_table.memory_table(by_key_s.get("S8"), by_key_r.get("S8")))
            for scenario in scenarios:
                if isinstance(scenario, OverloadScenario):
                    markdown.append(report_table.overload_table(
                        scenario.key, by_key_s.get(scenario.key), by_key_r.get(scenario.key) if rabbit else None
                    ))  # fmt: skip
            if report.get("generator"):
                markdown.append(f"Overload generator: {report['generator']['note']}")
            all_results = shoal + rabbit
    except KeyboardInterrupt:
        _say("interrupted; everything started was stopped")
        return 130

    errors = report_table.errors_section(all_results)
    if errors:
        markdown.append("Errors and integrity notes:\n\n" + errors)
    if problems:
        short = [p.splitlines()[0] for p in problems if not p.split(": ", 1)[-1].startswith("log tail")]
        markdown.append("Cleanup problems (log tails in the JSON):\n\n" + "\n".join(f"- {p}" for p in short))
    report["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    report["cleanup_problems"] = problems
    report["markdown"] = "\n\n".join(markdown)

    out = args.json_out or RESULTS_DIR / f"{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    print()
    print(f"{report['command']}  ({report['started']}, {os.cpu_count()} CPUs, Shoal {report['shoal_source']}, "
          f"{report['shoal_hot_path']})")
    print()
    print(report["markdown"])
    print()
    print(f"results: {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
