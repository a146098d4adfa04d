"""Brokers under test: a Shoal it starts (`shoal serve --port 0`) and a RabbitMQ it starts.

Both are started by this process, on 127.0.0.1 only, and stopped by PID; nothing is found or
killed by name.

Shoal: `python -m cli.main serve --host 127.0.0.1 --port 0 --workers W --ready-file F` in its own
session (as tests/integration/harness.py does); ready when F names W worker PIDs. Its processes
are the supervisor, the workers F names (re-read on every call, so a replaced worker is followed)
and their descendants. Stopping: SIGTERM to the supervisor, 10 s, then SIGKILL to every PID it
knows; then any `/dev/shm/shoal.<instance>.*` left is reported and unlinked.

RabbitMQ (when `/usr/lib/rabbitmq/bin/rabbitmq-server` exists; $PERF_RABBITMQ_SERVER overrides):

1. a temp dir D holds everything: HOME (so the Erlang cookie is D/.erlang.cookie), mnesia, logs,
   an empty rabbitmq.conf, an empty enabled_plugins file, and an empty rabbitmq-env.conf
   (RABBITMQ_CONF_ENV_FILE, so /etc/rabbitmq/rabbitmq-env.conf is not read);
2. three free loopback ports: EPMD, AMQP, DIST;
3. `epmd -port EPMD -address 127.0.0.1` is started as a child (not `-daemon`), and
   ERL_EPMD_PORT=EPMD is exported to the broker, so the node registers with that epmd and
   `-start_epmd false` keeps Erlang from starting (and leaving behind) a daemon of its own;
4. `/usr/lib/rabbitmq/bin/rabbitmq-server` (the script itself: /usr/sbin/rabbitmq-server is a
   wrapper that `su`s to the rabbitmq user) with RABBITMQ_NODENAME=shoal-perf-<pid>@localhost,
   RABBITMQ_NODE_IP_ADDRESS=127.0.0.1, RABBITMQ_NODE_PORT=AMQP, RABBITMQ_DIST_PORT=DIST,
   RABBITMQ_MNESIA_BASE / RABBITMQ_LOG_BASE under D, and
   RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}";
   the script stays as a /bin/sh parent and runs beam.smp as its child;
5. ready when an AMQP handshake on AMQP succeeds (60 s at most);
6. stop: SIGTERM to the beam.smp PID (RabbitMQ stops gracefully on SIGTERM), 30 s, then SIGKILL to
   beam.smp and its descendants; the sh parent exits with it; then SIGTERM (SIGKILL) to the epmd
   child; then D is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from perf.wire import Client

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
SHOAL_READY_TIMEOUT = 30.0
RABBIT_READY_TIMEOUT = 90.0
SHM_DIR = Path("/dev/shm")
RABBITMQ_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def is_alive(process: psutil.Process) -> bool:
    """Whether `process` still runs (a zombie does not; neither does a recycled PID)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait at most `timeout` s for `processes` to end; return those still alive."""
    limit = time.monotonic() + timeout
    pending = [p for p in processes if is_alive(p)]
    while pending and time.monotonic() < limit:
        time.sleep(0.05)
        pending = [p for p in pending if is_alive(p)]
    return pending


def kill(process: psutil.Process) -> None:
    """SIGKILL `process` if it still exists."""
    # psutil checks the create time first, so a recycled PID is never hit.
    with contextlib.suppress(psutil.Error):
        process.kill()


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the process that started it dies, even by SIGKILL
    (PR_SET_PDEATHSIG), so a killed perf run leaves no broker behind: Shoal's supervisor and the
    rabbitmq-server script stop gracefully on SIGTERM, epmd just exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


class Broker:
    """What the scenarios need of a broker."""

    kind = "broker"
    port = 0
    label = ""

    def processes(self) -> dict[str, psutil.Process]:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> list[str]:
        raise NotImplementedError

    def log_tail(self, chars: int = 4000) -> str:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "port": self.port}

    def memory_breakdown(self) -> dict[str, Any] | None:
        """The broker's own account of its memory, where it has one."""
        return None


# --------------------------------------------------------------------------- Shoal


def child_role(argv: list[str], name: str, pid: int) -> str:
    """A supervisor's child that is not a worker, by the module it runs (``python -m
    management.process``: ``management``; ``links.process``: ``links``), else ``name:pid``."""
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        if module.endswith(".process"):
            return module.partition(".")[0]
    return f"{name}:{pid}"


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def shoal_command() -> list[str]:
    """How perf starts Shoal: ``$SHOAL_SERVE`` replaces ``python -m cli.main``; ``$SHOAL_SERVE_ARGS``
    adds options to every ``serve`` (e.g. ``--management-port 0`` for a run without the API)."""
    override = os.environ.get("SHOAL_SERVE")
    return shlex.split(override) if override else [sys.executable, "-m", "cli.main"]


class ShoalBroker(Broker):
    kind = "shoal"

    def __init__(self, workers: int, extra_args: list[str] | None = None):
        self.workers = workers
        self.label = f"shoal(w={workers})"
        self.directory = Path(tempfile.mkdtemp(prefix="shoal-perf-"))
        self.ready_file = self.directory / "ready.json"
        self.log_path = self.directory / "broker.log"
        self.instance = ""
        self.known: dict[int, psutil.Process] = {}
        self.command = [
            *shoal_command(), "serve", "--host", HOST, "--port", "0", "--workers", str(workers),
            "--log-level", "warning", "--ready-file", str(self.ready_file),
            "--data-dir", str(self.directory / "data"), *(extra_args or []),
            *shlex.split(os.environ.get("SHOAL_SERVE_ARGS", "")),
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                self.command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
            )  # fmt: skip
        self._remember(self.popen.pid)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _remember(self, pid: int) -> psutil.Process | None:
        if pid not in self.known:
            with contextlib.suppress(psutil.Error):
                self.known[pid] = psutil.Process(pid)
        return self.known.get(pid)

    def _ready(self) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.ready_file.read_text())
            if isinstance(data, dict):
                return data
        return None

    def _wait_ready(self) -> None:
        limit = time.monotonic() + SHOAL_READY_TIMEOUT
        while time.monotonic() < limit and self.popen.poll() is None:
            info = self._ready()
            if info and len(info.get("worker_pids", [])) == self.workers and int(info.get("port", 0)) > 0:
                self.port = int(info["port"])
                self.instance = str(info["instance"])
                for pid in info["worker_pids"]:
                    self._remember(int(pid))
                return
            time.sleep(0.05)
        raise RuntimeError(f"shoal not ready (exit code {self.popen.poll()}):\n{self.log_tail()}")

    def processes(self) -> dict[str, psutil.Process]:
        out: dict[str, psutil.Process] = {}
        supervisor = self.known.get(self.popen.pid)
        if supervisor is not None and is_alive(supervisor):
            out["supervisor"] = supervisor
        info = self._ready() or {}
        for index, pid in enumerate(info.get("worker_pids", [])):
            process = self._remember(int(pid))
            if process is not None and is_alive(process):
                out[f"worker{index}"] = process
        listed = {p.pid for p in out.values()}
        if supervisor is not None:
            for child in _descendants(supervisor):
                if child.pid not in listed and is_alive(child):
                    process = self._remember(child.pid) or child
                    out[child_role(_cmdline(process), process.name(), child.pid)] = process
        return out

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "port": self.port, "workers": self.workers, "command": self.command}

    def stop(self) -> list[str]:
        problems: list[str] = []
        supervisor = self.known.get(self.popen.pid)
        if supervisor is not None:
            for child in _descendants(supervisor):
                self._remember(child.pid)
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                code = self.popen.wait(10.0)
                if code != 0:
                    problems.append(f"shoal supervisor exited with {code} after SIGTERM")
            except subprocess.TimeoutExpired:
                problems.append("shoal supervisor still running 10 s after SIGTERM")
        else:
            problems.append(f"shoal supervisor had already exited with {self.popen.returncode}")
        survivors = wait_gone(list(self.known.values()), 5.0)
        for process in survivors:
            problems.append(f"pid {process.pid} still running; SIGKILL")
            kill(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5.0)
        if self.instance:
            for segment in sorted(SHM_DIR.glob(f"shoal.{self.instance}.*")):
                problems.append(f"shared memory left behind: {segment}; unlinked")
                with contextlib.suppress(OSError):
                    segment.unlink()
        if problems:
            problems.append("log tail:\n" + self.log_tail(2000))
        shutil.rmtree(self.directory, ignore_errors=True)
        return problems


# --------------------------------------------------------------------------- RabbitMQ


def rabbitmq_script() -> Path | None:
    override = os.environ.get("PERF_RABBITMQ_SERVER")
    path = Path(override) if override else RABBITMQ_SCRIPT
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _epmd_binary() -> str | None:
    return shutil.which("epmd")


def rabbitmq_available() -> str | None:
    """None when RabbitMQ can be started here, else why not."""
    if rabbitmq_script() is None:
        return f"{RABBITMQ_SCRIPT} not found (apt-get install rabbitmq-server)"
    if _epmd_binary() is None:
        return "epmd not found on PATH"
    return None


def rabbitmq_wanted(skip: bool = False) -> bool:
    """Whether a side-by-side run starts RabbitMQ: not when ``skip`` (a tool's --no-rabbitmq),
    nor when it cannot start here, and then the tool says why on stderr and goes on alone."""
    if skip:
        return False
    why = rabbitmq_available()
    if why is not None:
        print(f"RabbitMQ skipped: {why}", file=sys.stderr)
        return False
    return True


def _wait_port(port: int, timeout: float) -> bool:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


class RabbitBroker(Broker):
    kind = "rabbitmq"

    def __init__(self) -> None:
        script = rabbitmq_script()
        epmd = _epmd_binary()
        if script is None or epmd is None:
            raise RuntimeError(rabbitmq_available() or "rabbitmq not available")
        self.label = "rabbitmq"
        self.directory = Path(tempfile.mkdtemp(prefix="rabbitmq-perf-"))
        self.epmd_port, self.port, self.dist_port = free_port(), free_port(), free_port()
        while len({self.epmd_port, self.port, self.dist_port}) < 3:
            self.port, self.dist_port = free_port(), free_port()
        self.nodename = f"shoal-perf-{os.getpid()}@localhost"
        self.version = ""
        self.beam: psutil.Process | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "rabbitmq-server.out"
        (self.directory / "rabbitmq.conf").write_text("")
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")
        self.env = {
            **os.environ,
            "HOME": str(self.directory),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_CONF_ENV_FILE": str(self.directory / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}",
        }
        self.command = [str(script)]
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        """epmd, then rabbitmq-server; wait until it accepts AMQP."""
        epmd = _epmd_binary()
        if epmd is None:
            raise RuntimeError("epmd not found")
        with (self.directory / "epmd.out").open("ab") as log:
            self.epmd = subprocess.Popen(
                [epmd, "-port", str(self.epmd_port), "-address", HOST],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
            )  # fmt: skip
        if not _wait_port(self.epmd_port, 10.0):
            raise RuntimeError(f"epmd did not listen on {self.epmd_port}")
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.command, cwd=self.directory, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
            )  # fmt: skip
        self._wait_ready()

    def restart(self) -> float:
        """Stop the node (SIGTERM, as `stop`) and start it again on the same Mnesia directory:
        what a restart keeps is there (perf.durable R1). Returns the seconds from the start to
        accepting AMQP."""
        problems = self._shut_down()
        if problems:
            raise RuntimeError("; ".join(problems))
        self.beam = None
        started = time.monotonic()
        self._start()
        return time.monotonic() - started

    def _find_beam(self) -> psutil.Process | None:
        if self.beam is not None and is_alive(self.beam):
            return self.beam
        if self.popen is None:
            return None
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.popen.pid)
            for process in [root, *_descendants(root)]:
                with contextlib.suppress(psutil.Error):
                    if process.name().startswith("beam"):
                        self.beam = process
                        return process
        return None

    def _wait_ready(self) -> None:
        assert self.popen is not None
        limit = time.monotonic() + RABBIT_READY_TIMEOUT
        last_error = ""
        while time.monotonic() < limit:
            if self.popen.poll() is not None:
                break
            if _wait_port(self.port, 0.5):
                try:
                    client = Client(self.port, timeout=5.0)
                except Exception as exc:  # noqa: BLE001 - still booting
                    last_error = repr(exc)
                else:
                    self.version = str(client.server_properties.get("version", ""))
                    client.close()
                    if self._find_beam() is None:
                        raise RuntimeError("rabbitmq answers but no beam.smp child was found")
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"rabbitmq not ready (exit code {self.popen.poll()}, {last_error}):\n{self.log_tail()}"
        )

    def processes(self) -> dict[str, psutil.Process]:
        beam = self._find_beam()
        if beam is None:
            return {}
        out = {"beam.smp": beam}
        for child in _descendants(beam):
            with contextlib.suppress(psutil.Error):
                out[f"{child.name()}:{child.pid}"] = child
        return out

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None and self._find_beam() is not None

    def log_tail(self, chars: int = 4000) -> str:
        parts = []
        for path in [self.log_path, *sorted((self.directory / "log").glob("*.log"))]:
            with contextlib.suppress(OSError):
                parts.append(f"== {path.name}\n" + path.read_text(errors="replace")[-chars:])
        return "\n".join(parts) or "(no log)"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "port": self.port, "version": self.version, "nodename": self.nodename,
            "epmd_port": self.epmd_port, "dist_port": self.dist_port, "command": self.command,
        }  # fmt: skip

    def memory_breakdown(self) -> dict[str, Any] | None:
        """`rabbitmqctl status`'s memory section (bytes; `reserved_unallocated` is RSS the Erlang
        allocators hold but do not use)."""
        ctl = (rabbitmq_script() or RABBITMQ_SCRIPT).with_name("rabbitmqctl")
        try:
            done = subprocess.run(
                [str(ctl), "-n", self.nodename, "status", "--formatter", "json"],
                env=self.env, capture_output=True, text=True, timeout=60, cwd=self.directory, check=False,
            )  # fmt: skip
            memory = json.loads(done.stdout).get("memory")
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return {"error": repr(exc)}
        return memory if isinstance(memory, dict) else {"error": "no memory section"}

    def stop(self) -> list[str]:
        problems = self._shut_down()
        if problems:
            problems.append("log tail:\n" + self.log_tail(2000))
        shutil.rmtree(self.directory, ignore_errors=True)
        return problems

    def _shut_down(self) -> list[str]:
        problems: list[str] = []
        beam = self._find_beam()
        tracked: list[psutil.Process] = []
        if beam is not None:
            tracked = [beam, *_descendants(beam)]
            with contextlib.suppress(psutil.Error):
                beam.send_signal(signal.SIGTERM)
            survivors = wait_gone([beam], 30.0)
            if survivors:
                problems.append("beam.smp still running 30 s after SIGTERM; SIGKILL")
            for process in wait_gone(tracked, 0.5 if not survivors else 0.0):
                kill(process)
        if self.popen is not None:
            if self.popen.poll() is None and beam is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10.0)
            except subprocess.TimeoutExpired:
                problems.append("rabbitmq-server script still running; SIGKILL")
                self.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(5.0)
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.terminate()
            try:
                self.epmd.wait(5.0)
            except subprocess.TimeoutExpired:
                self.epmd.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.epmd.wait(5.0)
        left = wait_gone(tracked, 5.0)
        if left:
            problems.append("left running: " + ", ".join(str(p.pid) for p in left))
        return problems
