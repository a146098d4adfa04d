"""A first throughput figure: one pika publisher, one pika consumer, one queue.

    python -m perf.quick [--workers 2] [--messages 20000] [--seconds 10]

Starts `shoal serve --port 0 --workers W` (like the integration fixture, waiting for its ready
file), then a publisher process and a consumer process (multiprocessing, spawn). The consumer
has prefetch 100 and acks with multiple=True every 50 messages; the publisher stays at most
--window messages ahead of it (a shared counter), so the queue never grows without bound. The run
ends when the consumer has every message or after --seconds, whichever comes first.

It prints delivered msg/s, the broker's CPU-seconds per 10k messages (supervisor + workers, from
psutil cpu_times) and each process's CPU% sampled every 0.5 s, and a final JSON line. The clients'
CPU-seconds are reported too: a publisher pinned at ~100% means the figure is the client's, not
the broker's. The broker is always stopped (SIGTERM, then SIGKILL by PID) and /dev/shm checked.

$SHOAL_SERVE, when set, replaces `python -m cli.main` as the command that is given `serve ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import multiprocessing.synchronize
import os
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import psutil

from perf.brokers import wait_gone

HOST = "127.0.0.1"
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
_STAMP = struct.Struct("<QQ")  # sequence number, send time (monotonic ns)
SAMPLE_INTERVAL = 0.5
# The trace's psutil samples are denser, so that the report's CPU and RSS plots of a run shorter
# than a second still have points to draw (a sample costs about a millisecond of CPU).
TRACE_SAMPLE_INTERVAL = 0.1
REPO_ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m perf.quick", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="broker IO workers (default 2)")
    parser.add_argument("--messages", type=int, default=20_000, help="messages to send (default 20000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="cap on the measured run (default 10)")
    parser.add_argument("--body-size", type=int, default=128, help="body bytes (default 128)")
    parser.add_argument(
        "--trace", type=Path, default=None,
        help="trace into this directory: the broker (shoal serve --trace), psutil samples of "
        "every process, and the clients' send/receive times; then run `shoal report DIR`",
    )
    parser.add_argument(
        "--window", type=int, default=10_000, help="publisher's lead over the consumer (default 10000)"
    )
    parser.add_argument("--prefetch", type=int, default=100, help="consumer prefetch-count (default 100)")
    parser.add_argument(
        "--ack-every", type=int, default=50, help="consumer acks multiple=True every N (default 50)"
    )
    parser.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the broker


@dataclass
class BrokerRun:
    popen: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    instance: str = ""
    processes: dict[int, psutil.Process] = field(default_factory=dict)

    def remember(self, pids: list[int]) -> None:
        for pid in pids:
            if pid not in self.processes:
                with contextlib.suppress(psutil.Error):
                    self.processes[pid] = psutil.Process(pid)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"


def serve_command() -> list[str]:
    override = os.environ.get("SHOAL_SERVE")
    return shlex.split(override) if override else [sys.executable, "-m", "cli.main"]


def start_broker(workers: int, directory: Path, trace: Path | None = None) -> BrokerRun:
    ready_file = directory / "ready.json"
    log_path = directory / "broker.log"
    command = [
        *serve_command(), "serve", "--host", HOST, "--port", "0", "--workers", str(workers),
        "--log-level", "warning", "--ready-file", str(ready_file),
        "--data-dir", str(directory / "data"), *(["--trace", str(trace)] if trace else []),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    run = BrokerRun(popen, log_path)
    run.remember([popen.pid])
    limit = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < limit and popen.poll() is None:
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            info = json.loads(ready_file.read_text())
            if len(info["worker_pids"]) == workers and int(info["port"]) > 0:
                run.port, run.instance = int(info["port"]), str(info["instance"])
                run.remember([int(pid) for pid in info["worker_pids"]])
                return run
        time.sleep(0.05)
    raise RuntimeError(f"broker not ready (exit code {popen.poll()}):\n{run.log_tail()}")


def stop_broker(run: BrokerRun) -> list[str]:
    """SIGTERM, bounded wait, SIGKILL by PID; return what was wrong."""
    problems: list[str] = []
    with contextlib.suppress(psutil.Error):
        run.remember([p.pid for p in psutil.Process(run.popen.pid).children(recursive=True)])
    if run.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.popen.pid, signal.SIGTERM)
        try:
            code = run.popen.wait(STOP_TIMEOUT)
            if code != 0:
                problems.append(f"supervisor exited with {code} after SIGTERM")
        except subprocess.TimeoutExpired:
            problems.append(f"supervisor still running {STOP_TIMEOUT:g} s after SIGTERM")
    survivors = wait_gone(list(run.processes.values()), 5.0)
    for process in survivors:
        problems.append(f"pid {process.pid} still running; SIGKILL")
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks the create time first: a recycled PID is never hit
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.popen.wait(5.0)
    if run.instance:
        for segment in sorted(Path("/dev/shm").glob(f"shoal.{run.instance}.*")):
            problems.append(f"shared memory left behind: {segment}; unlinked")
            with contextlib.suppress(OSError):
                segment.unlink()
    return problems


# --------------------------------------------------------------------------- the clients


def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(host=HOST, port=port, connection_attempts=1, stack_timeout=10)
    )


def publisher(
    port: int, queue: str, args: argparse.Namespace, published: Any, consumed: Any,
    ready: mp.synchronize.Event, go: mp.synchronize.Event, stop: mp.synchronize.Event,
) -> None:  # fmt: skip
    connection = _connect(port)
    channel = connection.channel()
    # Each body carries its sequence number and CLOCK_MONOTONIC send time.
    padding = b"x" * max(0, args.body_size - _STAMP.size)
    trace = _client_trace(args, "publisher")
    ready.set()
    go.wait(60)
    limit = time.monotonic() + args.seconds
    sent = 0
    while sent < args.messages and not stop.is_set() and time.monotonic() < limit:
        if sent - consumed.value >= args.window:
            connection.process_data_events(time_limit=0.001)
            continue
        now_ns = time.monotonic_ns()
        channel.basic_publish("", queue, _STAMP.pack(sent, now_ns) + padding)
        if trace is not None:
            trace.sent(now_ns, 0, sent, 1, queue)
        sent += 1
        if sent % 1000 == 0:
            published.value = sent
            connection.process_data_events(time_limit=0)
    published.value = sent
    connection.close()
    if trace is not None:
        trace.close()


def consumer(
    port: int, queue: str, args: argparse.Namespace, consumed: Any, done_at: Any,
    ready: mp.synchronize.Event, go: mp.synchronize.Event, stop: mp.synchronize.Event,
) -> None:  # fmt: skip
    connection = _connect(port)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=args.prefetch)
    state = {"count": 0, "unacked": 0, "last_tag": 0}
    trace = _client_trace(args, "consumer")

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        if trace is not None and len(body) >= _STAMP.size:
            seq, sent_ns = _STAMP.unpack_from(body)
            trace.received(time.monotonic_ns(), 0, seq, sent_ns, queue, method.redelivered)
        state["count"] += 1
        state["unacked"] += 1
        state["last_tag"] = method.delivery_tag
        if state["unacked"] >= args.ack_every:
            ch.basic_ack(method.delivery_tag, multiple=True)
            state["unacked"] = 0
            consumed.value = state["count"]
        if state["count"] == args.messages:
            done_at.value = time.monotonic()

    channel.basic_consume(queue, on_message_callback=on_message)
    ready.set()
    go.wait(60)
    limit = time.monotonic() + args.seconds
    while state["count"] < args.messages and not stop.is_set() and time.monotonic() < limit:
        connection.process_data_events(time_limit=0.05)
    if state["unacked"]:
        channel.basic_ack(state["last_tag"], multiple=True)
    consumed.value = state["count"]
    connection.close()
    if trace is not None:
        trace.close()


def _client_trace(args: argparse.Namespace, name: str) -> Any:
    if args.trace is None:
        return None
    from perf.trace_writers import ClientTraceWriter  # pyarrow only when tracing

    return ClientTraceWriter(args.trace, name)


# --------------------------------------------------------------------------- measuring


def _cpu_seconds(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def measure(run: BrokerRun, args: argparse.Namespace) -> dict[str, Any]:
    queue = f"perf.quick.{os.getpid()}"
    setup = _connect(run.port)
    setup.channel().queue_declare(queue, auto_delete=False)
    setup.close()

    ctx = mp.get_context("spawn")
    published, consumed = ctx.Value("q", 0), ctx.Value("q", 0)
    done_at = ctx.Value("d", 0.0)
    go, stop = ctx.Event(), ctx.Event()
    ready = [ctx.Event(), ctx.Event()]
    children = [
        ctx.Process(
            target=consumer,
            args=(run.port, queue, args, consumed, done_at, ready[0], go, stop),
            name="consumer",
        ),
        ctx.Process(
            target=publisher,
            args=(run.port, queue, args, published, consumed, ready[1], go, stop),
            name="publisher",
        ),
    ]
    for child in children:
        child.start()
    try:
        for event in ready:
            if not event.wait(30):
                raise RuntimeError("a client did not connect within 30 s")
        broker = {label: run.processes[pid] for label, pid in _labels(run).items()}
        clients = {child.name: psutil.Process(child.pid) for child in children}
        watched = {**broker, **clients}
        cpu_before = {label: _cpu_seconds(p) for label, p in watched.items()}
        samples: dict[str, list[float]] = {label: [] for label in watched}
        # CPU % per interval from cpu_times deltas (not psutil's cpu_percent, whose per-object
        # state the trace sampler would share and reset).
        last_cpu = {label: (time.monotonic(), cpu_before[label]) for label in watched}

        sampler = None
        if args.trace is not None:
            from perf.trace_writers import ProcSampleWriter

            sampler = ProcSampleWriter(args.trace, "sampler")
            sampler.sample_processes(watched)
        started = time.monotonic()
        go.set()
        next_sample = started + SAMPLE_INTERVAL
        next_trace_sample = started + TRACE_SAMPLE_INTERVAL
        while time.monotonic() - started < args.seconds and any(c.is_alive() for c in children):
            if done_at.value:
                break
            time.sleep(0.02)
            if sampler is not None and time.monotonic() >= next_trace_sample:
                next_trace_sample += TRACE_SAMPLE_INTERVAL
                sampler.sample_processes(watched)
            if time.monotonic() >= next_sample:
                next_sample += SAMPLE_INTERVAL
                for label, process in watched.items():
                    with contextlib.suppress(psutil.Error):
                        now, used = time.monotonic(), _cpu_seconds(process)
                        then, before = last_cpu[label]
                        if now > then:
                            samples[label].append(max(0.0, used - before) / (now - then) * 100)
                        last_cpu[label] = (now, used)
        ended = done_at.value or time.monotonic()
        if sampler is not None:
            # a last sample, unless the previous one is too recent for CPU times that tick in
            # 10 ms steps to give a meaningful percentage
            if time.monotonic() >= next_trace_sample - TRACE_SAMPLE_INTERVAL / 2:
                sampler.sample_processes(watched)
            sampler.close()
        cpu_after = {label: _cpu_seconds(p) for label, p in watched.items()}
    finally:
        stop.set()
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join(5)

    elapsed = max(ended - started, 1e-9)
    delivered = consumed.value
    cpu = {label: cpu_after[label] - cpu_before[label] for label in watched}
    broker_cpu = sum(cpu[label] for label in broker)
    return {
        "bench": "perf.quick",
        "workers": args.workers,
        "body_size": args.body_size,
        "messages": args.messages,
        "published": published.value,
        "delivered": delivered,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(delivered / elapsed, 1),
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_s_per_10k": round(broker_cpu / delivered * 10_000, 3) if delivered else None,
        "cpu_s": {label: round(value, 3) for label, value in cpu.items()},
        "cpu_percent_mean": {label: _mean(values) for label, values in samples.items()},
        "cpu_percent_max": {
            label: round(max(values), 1) if values else None for label, values in samples.items()
        },
    }


def _labels(run: BrokerRun) -> dict[str, int]:
    info = json.loads((run.log_path.parent / "ready.json").read_text())
    labels = {"supervisor": run.popen.pid}
    labels.update({f"worker{k}": int(pid) for k, pid in enumerate(info["worker_pids"])})
    run.remember(list(labels.values()))
    return labels


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def report(result: dict[str, Any]) -> None:
    print(
        f"delivered {result['delivered']} of {result['messages']} messages "
        f"({result['body_size']} B) in {result['seconds']} s: {result['msg_per_s']} msg/s"
    )
    per_10k = result["broker_cpu_s_per_10k"]
    print(f"broker CPU: {result['broker_cpu_s']} s in all, {per_10k} s per 10k messages")
    for label, seconds in result["cpu_s"].items():
        mean, peak = result["cpu_percent_mean"][label], result["cpu_percent_max"][label]
        print(f"  {label:<10} {seconds:8.3f} CPU-s   mean {mean}%   max {peak}%")
    print(json.dumps(result, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-perf-") as tmp:
        try:
            if args.trace is not None:
                args.trace.mkdir(parents=True, exist_ok=True)
            run = start_broker(args.workers, Path(tmp), args.trace)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 2
        problems: list[str] = []
        try:
            result = measure(run, args)
        finally:
            problems = stop_broker(run)
            for problem in problems:
                print(f"cleanup: {problem}", file=sys.stderr)
            if problems:
                print(run.log_tail(), file=sys.stderr)
    report(result)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, sort_keys=True) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
