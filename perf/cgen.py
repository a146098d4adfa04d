"""The C load generator (perf/cgen/shoalgen.c): building it, choosing it, driving its processes.

Theory of operation
-------------------
Python clients cannot publish 60,000+ msg/s and still leave a core to the broker on this
machine, so the overload scenarios (perf/overload.py) drive brokers with `shoalgen`, a small C
program against rabbitmq-c (Debian's librabbitmq-dev). This module

- **builds** it on demand: `gcc -O2 perf/cgen/shoalgen.c -lrabbitmq` into
  `build/cgen/shoalgen-<sha of the source and the command>` (build/ is git-ignored; the name
  changes with the source, so a stale binary is never used; written under a temporary name
  and renamed, so concurrent builds do not see half a file);
- **chooses** the generator (`choose_generator`): `auto` uses the C one when it builds and
  otherwise falls back to Python generator processes (perf/loadgen.py), saying why; `c`
  insists (an error when it cannot be built); `python` never builds;
- **drives** one shoalgen process (`CProcess`): started with its argv (`publisher_argv`,
  `consumer_argv`), stdin and stdout pipes, and PR_SET_PDEATHSIG; a reader thread parses the
  JSON lines it prints (`parse_event`): `ready`, `progress` (a count once a second) and the
  final `result`; `go()` and `stop()` write those words to its stdin; `finish()` waits for
  the result and the exit (bounded), then kills the process by PID if it is still there;
- **merges latencies**: shoalgen keeps a log-linear histogram per consumer (`bucket_of`:
  exact below 64 us, 32 buckets per power of two above), `merge_histograms` adds them up and
  `histogram_summary` gives percentiles (a bucket's midpoint, so within ~1.5 %). The Python
  fallback's latencies are put into the same buckets (`histogram_of`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from perf.brokers import REPO_ROOT, _die_with_parent

SOURCE = Path(__file__).resolve().parent / "cgen" / "shoalgen.c"
BUILD_DIR = REPO_ROOT / "build" / "cgen"
CFLAGS = ("-O2", "-Wall", "-Wextra")
LIBS = ("-lrabbitmq",)
BUILD_TIMEOUT = 120.0
GENERATOR_CHOICES = ("auto", "c", "python")
STDERR_KEEP = 4000  # characters of a generator's stderr kept for the report


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class Build:
    """The outcome of building shoalgen: the binary, or why there is none."""

    binary: Path | None
    reason: str | None = None


def compiler() -> str | None:
    """$CC when set (its first word must be on PATH), else gcc."""
    name = (os.environ.get("CC") or "gcc").split()[0]
    return shutil.which(name)


def build(source: Path = SOURCE, build_dir: Path = BUILD_DIR, cc: str | None = None) -> Build:
    """Compile shoalgen unless a binary of this very source is there already."""
    cc = cc or compiler()
    if cc is None:
        return Build(None, "no C compiler (gcc) on PATH")
    try:
        text = source.read_bytes()
    except OSError as exc:
        return Build(None, f"cannot read {source}: {exc}")
    digest = hashlib.sha256(text + " ".join((cc, *CFLAGS, *LIBS)).encode()).hexdigest()[:12]
    binary = build_dir / f"shoalgen-{digest}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return Build(binary)
    build_dir.mkdir(parents=True, exist_ok=True)
    partial = build_dir / f".shoalgen-{digest}.{os.getpid()}.tmp"
    command = [cc, *CFLAGS, "-o", str(partial), str(source), *LIBS]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        partial.unlink(missing_ok=True)
        return Build(None, f"{' '.join(command)}: {exc}")
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        return Build(None, build_failure_reason(done.stderr))
    os.replace(partial, binary)
    for stale in build_dir.glob("shoalgen-*"):  # binaries of earlier sources
        if stale != binary:
            stale.unlink(missing_ok=True)
    return Build(binary)


def build_failure_reason(stderr: str) -> str:
    """A one-line reason from the compiler's complaint (a missing rabbitmq-c says so)."""
    if "amqp.h" in stderr or "amqp_tcp_socket.h" in stderr or "-lrabbitmq" in stderr:
        return "rabbitmq-c is not installed (apt-get install librabbitmq-dev)"
    lines = [line.strip() for line in stderr.splitlines() if "error" in line]
    return "build failed: " + (lines[0] if lines else stderr.strip()[-300:] or "no output")


@dataclass(frozen=True)
class GeneratorChoice:
    """Which generator a run uses: kind 'c' (with its binary) or 'python' (with a note why)."""

    kind: str
    binary: Path | None = None
    note: str = ""


def choose_generator(requested: str, builder: Callable[[], Build], python_publishers: int) -> GeneratorChoice:
    """`requested` is auto, c or python; `builder` is called unless python was asked for."""
    if requested not in GENERATOR_CHOICES:
        raise ValueError(f"generator must be one of {', '.join(GENERATOR_CHOICES)}, not {requested!r}")
    if requested == "python":
        return GeneratorChoice("python", None, f"Python generator (asked for): {python_publishers} publisher processes")
    outcome = builder()
    if outcome.binary is not None:
        return GeneratorChoice("c", outcome.binary, f"C generator {outcome.binary.name}")
    if requested == "c":
        raise RuntimeError(f"the C generator cannot be built: {outcome.reason}")
    return GeneratorChoice(
        "python", None,
        f"C generator unavailable ({outcome.reason}); falling back to {python_publishers} Python publisher "
        "processes per publisher: publish rates then measure Python as much as the broker",
    )  # fmt: skip


# --------------------------------------------------------------------------- argv


def publisher_argv(
    binary: Path, port: int, *, exchange: str, routing_key: str, body_size: int, pub_id: int, count: int,
    seconds: float, rate: float = 0.0, grace: float = 20.0,
) -> list[str]:  # fmt: skip
    """shoalgen's command line for one publisher (rate 0: as fast as TCP lets it)."""
    argv = [
        str(binary), "publish", "--port", str(port), "--exchange", exchange, "--routing-key", routing_key,
        "--body-size", str(body_size), "--id", str(pub_id), "--count", str(count), "--seconds", f"{seconds:g}",
        "--grace", f"{grace:g}",
    ]  # fmt: skip
    if rate:
        argv += ["--rate", f"{rate:g}"]
    return argv


def consumer_argv(
    binary: Path, port: int, *, queue: str, name: str, prefetch: int, ack_every: int, seconds: float,
    publishers: int, capacity: int, grace: float = 20.0, global_qos: bool = False, ack_rate: float = 0.0,
) -> list[str]:  # fmt: skip
    """shoalgen's command line for one consumer (ack_every 1: basic.ack multiple=false per delivery;
    ``queue`` "a,b": a consumer on each, on the one channel; ``global_qos``: they share the prefetch;
    ``ack_rate``: a slow application, each delivery taking 1/ack_rate s before its ack)."""
    return [
        str(binary), "consume", "--port", str(port), "--queue", queue, "--name", name,
        "--prefetch", str(prefetch), "--global", "1" if global_qos else "0", "--ack-every", str(ack_every),
        "--seconds", f"{seconds:g}", "--publishers", str(publishers), "--capacity", str(capacity),
        "--grace", f"{grace:g}", *(["--ack-rate", f"{ack_rate:g}"] if ack_rate else []),
    ]  # fmt: skip


def parse_event(line: str | bytes) -> dict[str, Any] | None:
    """One of shoalgen's stdout lines as a dict with an 'event' key, or None for anything else."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("event"), str) else None


# --------------------------------------------------------------------------- latency histograms


def bucket_of(value_us: int) -> int:
    """The histogram bucket of a latency in microseconds (as shoalgen.c's bucket_of)."""
    v = max(0, int(value_us))
    if v < 64:
        return v
    bits = v.bit_length()
    return 64 + (bits - 7) * 32 + (v >> (bits - 6)) - 32


def bucket_range(index: int) -> tuple[int, int]:
    """[low, high) in microseconds of a bucket."""
    if index < 64:
        return index, index + 1
    octave, mantissa = divmod(index - 64, 32)
    shift = octave + 1
    return (mantissa + 32) << shift, (mantissa + 33) << shift


def histogram_of(latencies_us: Iterable[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for value in latencies_us:
        index = bucket_of(value)
        out[index] = out.get(index, 0) + 1
    return out


def merge_histograms(histograms: Iterable[Mapping[int, int] | Iterable[Iterable[int]]]) -> dict[int, int]:
    """Sum histograms given as {bucket: count} or as shoalgen's [[bucket, count], ...]."""
    out: dict[int, int] = {}
    for hist in histograms:
        pairs = hist.items() if isinstance(hist, Mapping) else hist
        for index, count in pairs:
            out[int(index)] = out.get(int(index), 0) + int(count)
    return out


def histogram_summary(hist: Mapping[int, int], max_us: int | None = None) -> dict[str, float | int | None]:
    """count and p50/p90/p99/p99.9/max in ms (nearest rank; a bucket's midpoint, capped at max_us)."""
    total = sum(hist.values())
    out: dict[str, float | int | None] = {"count": total}
    ordered = sorted(hist.items())
    for label, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)):
        value: float | None = None
        if total:
            rank = max(1, -(-round(fraction * 1_000_000) * total // 1_000_000))
            running = 0
            for index, count in ordered:
                running += count
                if running >= rank:
                    low, high = bucket_range(index)
                    value = low if high - low == 1 else (low + high - 1) / 2
                    if max_us is not None:
                        value = min(value, max_us)
                    break
        out[f"{label}_ms"] = round(value / 1000, 3) if value is not None else None
    if max_us is not None and total:
        out["max_ms"] = round(max_us / 1000, 3)
    elif ordered:
        out["max_ms"] = round((bucket_range(ordered[-1][0])[1] - 1) / 1000, 3)
    else:
        out["max_ms"] = None
    return out


# --------------------------------------------------------------------------- one process


class CProcess:
    """One shoalgen process: started at once, `ready`/`count`/`result` from its stdout."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.argv = argv
        self.ready = threading.Event()
        self.count = 0
        self.result: dict[str, Any] | None = None
        self.stderr_tail = ""
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - a killed orchestrator takes its generators along
        )  # fmt: skip
        self.pid = self.popen.pid
        self._threads = [
            threading.Thread(target=self._read_stdout, name=f"{name}-out", daemon=True),
            threading.Thread(target=self._read_stderr, name=f"{name}-err", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            event = parse_event(raw)
            if event is None:
                continue
            kind = event["event"]
            if kind == "ready":
                self.ready.set()
            elif kind == "progress":
                self.count = int(event.get("count") or 0)
            elif kind == "result":
                self.result = event
                self.count = int(event.get("published", event.get("received", self.count)) or 0)

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            self.stderr_tail = (self.stderr_tail + raw.decode("utf-8", "replace"))[-STDERR_KEEP:]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def has_result(self, wait: float) -> bool:
        """Whether its result line has been read (waiting up to `wait` for the reader to get it)."""
        if self.result is None:
            self._threads[0].join(wait)
        return self.result is not None

    def _say(self, word: str) -> None:
        stdin: IO[bytes] | None = self.popen.stdin
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(word.encode() + b"\n")
            stdin.flush()

    def go(self) -> None:
        self._say("go")

    def stop(self) -> None:
        self._say("stop")

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait (at most `timeout`) for the result and the exit; kill by PID past that."""
        limit = time.monotonic() + timeout
        try:
            self.popen.wait(max(0.1, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5.0)
        for thread in self._threads:
            thread.join(max(0.1, limit - time.monotonic()))
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        if self.result is None:
            tail = self.stderr_tail.strip().splitlines()[-1:] or [""]
            return {"name": self.name, "error": f"no result (exit code {self.popen.returncode}) {tail[0]}".strip()}
        return self.result
