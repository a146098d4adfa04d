"""Real `shoal serve` processes for the integration tests, and the helpers that start, stop and
wait on them (the pika helpers that drive a broker's queues and channels: `pika_helpers.py`).

Test modules import what they need from here; `conftest.py` holds the pytest hooks (the per-test
deadline) and the fixtures built on these helpers.

Theory of operation
-------------------
A `Broker` is one `python -m cli.main serve --port 0 --workers 2 --ready-file F` process tree.
The supervisor writes F (atomically) once every worker accepts connections:

    {"port": int, "supervisor_pid": int, "worker_pids": [int, ...], "instance": "<pid>-<hex>"}

and rewrites it when it replaces a worker, so `Broker.worker_pids` re-reads it on every access.
Each AMQP connection's `server_properties["shoal_worker"]` names the worker it landed on
(`worker_of`).

Nothing here waits without a bound:
- starting waits at most `READY_TIMEOUT` for the ready file, then fails with the broker's log;
- stopping sends SIGTERM, waits `STOP_TIMEOUT`, then SIGKILLs by PID every process of the broker
  it knows (the supervisor, every worker PID the ready file ever named, and every process still
  in the supervisor's session), and fails if any survives, if a /dev/shm/shoal.<instance>.* is
  left, or if the supervisor had exited before the test ended without the test stopping it
  (`Broker.signal_supervisor`); a failed test also gets the broker's log tail in its report;
- a test's call phase runs under a SIGALRM deadline (`@pytest.mark.deadline(seconds)`, default
  `DEFAULT_DEADLINE`), so a broker that never answers a synchronous pika call fails the test
  instead of hanging the run. (A signal handler raising in the main thread interrupts pika's and
  asyncio's `select`; pytest-timeout is deliberately not a dependency.)

$SHOAL_SERVE, when set, replaces `python -m cli.main` (see `serve_command`).

The fixtures that hand out brokers (`broker`, `shared_broker`) are in `conftest.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pika
import pika.exceptions
import psutil
import pytest

from perf.brokers import is_alive, kill, wait_gone

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
WORKERS = 2
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
EXIT_AFTER_SUPERVISOR_TIMEOUT = 5.0
DEFAULT_DEADLINE = 90.0
SHM_DIR = Path("/dev/shm")
LOG_TAIL_CHARS = 6000

T = TypeVar("T")


# --------------------------------------------------------------------------- bounded waiting


class DeadlineExceeded(Exception):
    """A bounded section of a test ran past its deadline.

    Deliberately not an OSError: pika's poller swallows OSError from `select` as resumable.
    """


@contextlib.contextmanager
def deadline(seconds: float, what: str, error: type[Exception] = DeadlineExceeded) -> Iterator[None]:
    """Raise `error` in the main thread if the block runs longer than `seconds`.

    Nests: an enclosing deadline that would fire sooner is left in charge.
    """
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer_remaining and outer_remaining <= seconds:
        yield
        return
    started = time.monotonic()

    def on_alarm(signum: int, frame: object) -> None:
        raise error(f"{what}: still running after {seconds:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_remaining:
            left = outer_remaining - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "", interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy (and return that), at most `timeout` s."""
    limit = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= limit:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what or getattr(predicate, '__name__', predicate)}"
            )
        time.sleep(interval)


# --------------------------------------------------------------------------- processes and shm


def shm_segments(instance: str) -> list[Path]:
    """The shared memory segments of one broker instance still present in /dev/shm."""
    return sorted(SHM_DIR.glob(f"shoal.{instance}.*"))



def _describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} ({' '.join(process.cmdline())[:120]})"
    except psutil.Error:
        return f"pid {process.pid}"




def serve_command() -> list[str]:
    """How to run the CLI: `python -m cli.main`, or the command in $SHOAL_SERVE.

    The override exists to check the tests themselves against another implementation of the
    same process contract (for instance a shim in front of RabbitMQ).
    """
    override = os.environ.get("SHOAL_SERVE")
    return shlex.split(override) if override else [sys.executable, "-m", "cli.main"]


@dataclass(frozen=True)
class ReadyInfo:
    port: int
    supervisor_pid: int
    worker_pids: tuple[int, ...]
    instance: str


def read_ready_file(path: Path) -> ReadyInfo | str:
    """The parsed ready file, or a string saying why there is none (yet)."""
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return "no ready file yet"
    try:
        data = json.loads(raw)
        info = ReadyInfo(
            port=int(data["port"]),
            supervisor_pid=int(data["supervisor_pid"]),
            worker_pids=tuple(int(pid) for pid in data["worker_pids"]),
            instance=str(data["instance"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        return f"unusable ready file ({exc!r}): {raw[:500]!r}"
    if not 0 < info.port < 65536:
        return f"ready file has port {info.port}"
    return info


# --------------------------------------------------------------------------- the broker


class Broker:
    """One running `shoal serve` process tree, started by this test run."""

    def __init__(
        self,
        directory: Path,
        workers: int = WORKERS,
        extra_args: Sequence[str] = (),
        *,
        port: int | None = 0,
        wait_ready: bool = True,
    ):
        """Start `shoal serve` and wait for its ready file. With `port` (a free port chosen by
        the test) and `wait_ready=False`, return at once: the test may connect while the workers
        are still starting, and calls `await_ready()` when it needs `instance` or the PIDs. With
        `port=None`, neither --host nor --port is given (a --config file chooses them)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.workers = workers
        self.ready_file = directory / "ready.json"
        # The control socket in a short directory of our own (a Unix socket path has at most
        # 107 bytes), removed at stop even when a test killed the supervisor.
        self.control_dir = Path(tempfile.mkdtemp(prefix="shoal-t"))
        self.log_path = directory / "broker.log"
        self._log = self.log_path.open("wb")
        self._clients: list[pika.BlockingConnection] = []
        self._known: dict[int, psutil.Process] = {}
        self._stopped = False
        self._exit_expected = False
        command = [
            *serve_command(), "serve",
            *(() if port is None else ("--host", HOST, "--port", str(port))),
            "--workers", str(workers),
            "--ready-file", str(self.ready_file),
            "--control-socket", str(self.control_dir / "control.sock"),
            "--data-dir", str(directory / "data"),
            "--management-port", "0",  # no management process unless a test asks (extra_args)
            *extra_args,
        ]  # fmt: skip
        self.popen = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.pid = self.popen.pid
        self._remember([self.pid])
        self.port = port or 0
        self.instance = ""  # known from the ready file
        self.url = f"amqp://guest:guest@{HOST}:{self.port}/%2F"
        if wait_ready:
            self.await_ready()

    # ---- readiness

    def await_ready(self) -> None:
        """Wait (bounded) for the ready file; learn the port, instance and worker PIDs."""
        self._info = self._await_ready()
        self.port = self._info.port
        self.instance = self._info.instance
        self.url = f"amqp://guest:guest@{HOST}:{self.port}/%2F"

    def _await_ready(self) -> ReadyInfo:
        limit = time.monotonic() + READY_TIMEOUT
        while True:
            info = read_ready_file(self.ready_file)
            if isinstance(info, ReadyInfo) and len(info.worker_pids) == self.workers:
                break
            if self.popen.poll() is not None:
                self._abort(f"`shoal serve` exited with {self.popen.returncode} before it was ready ({info})")
            if time.monotonic() >= limit:
                self._abort(f"`shoal serve` not ready after {READY_TIMEOUT:g} s ({info})")
            time.sleep(0.05)
        if info.supervisor_pid != self.pid:
            self._abort(
                f"ready file names supervisor {info.supervisor_pid}, but `shoal serve` is pid {self.pid}"
            )
        self._remember(info.worker_pids)
        return info

    def _abort(self, why: str) -> None:
        self._remember(p.pid for p in self._session_members())
        for process in self._known.values():
            kill(process)
        wait_gone(self._known.values(), EXIT_AFTER_SUPERVISOR_TIMEOUT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(EXIT_AFTER_SUPERVISOR_TIMEOUT)
        info = read_ready_file(self.ready_file)
        if isinstance(info, ReadyInfo):
            for segment in shm_segments(info.instance):
                with contextlib.suppress(OSError):
                    segment.unlink()
        self._stopped = True
        self._log.close()
        pytest.fail(f"{why}\n{self.log_tail()}", pytrace=False)

    def read_ready(self) -> ReadyInfo:
        """The ready file as it is now (it is rewritten when a worker is replaced)."""
        info = wait_until(lambda: _as_info(read_ready_file(self.ready_file)), 2.0, "a readable ready file")
        assert info is not None  # wait_until returns only a truthy value
        self._remember(info.worker_pids)
        return info

    @property
    def worker_pids(self) -> tuple[int, ...]:
        return self.read_ready().worker_pids

    def wait_for_worker_replaced(self, index: int, old_pid: int, timeout: float = 20.0) -> int:
        """Wait until the ready file names a new PID for worker `index`; return it."""

        def replaced() -> int:
            if self.popen.poll() is not None:
                raise AssertionError(f"supervisor exited with {self.popen.returncode}\n{self.log_tail()}")
            pid = self.read_ready().worker_pids[index]
            return pid if pid != old_pid else 0

        return wait_until(replaced, timeout, f"worker {index} (pid {old_pid}) to be replaced")

    # ---- processes

    def signal_supervisor(self, signum: int) -> None:
        """Send the supervisor a signal from the test (so its exit is not reported as a crash)."""
        self._exit_expected = True
        os.kill(self.pid, signum)

    def _remember(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self._known:
                with contextlib.suppress(psutil.Error):
                    self._known[pid] = psutil.Process(pid)

    def _session_members(self) -> list[psutil.Process]:
        """Every live process in the supervisor's session (start_new_session made it the leader)."""
        members = []
        for pid in psutil.pids():
            with contextlib.suppress(OSError, psutil.Error):
                if pid != os.getpid() and os.getsid(pid) == self.pid:
                    members.append(psutil.Process(pid))
        return members

    def processes(self) -> list[psutil.Process]:
        """Every live process of this broker: supervisor, workers, anything they started."""
        self._remember(p.pid for p in self._session_members())
        return [p for p in self._known.values() if is_alive(p)]

    def worker_processes(self) -> list[psutil.Process]:
        return [p for p in self.processes() if p.pid != self.pid]

    def running(self) -> bool:
        if self._stopped or self.popen.poll() is not None:
            return False
        info = read_ready_file(self.ready_file)
        return isinstance(info, ReadyInfo) and all(psutil.pid_exists(pid) for pid in info.worker_pids)

    def log_tail(self) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no broker log: {exc})"
        return f"---- {self.log_path} (tail) ----\n{text[-LOG_TAIL_CHARS:]}"

    # ---- clients

    def connection_parameters(self, **overrides: Any) -> pika.ConnectionParameters:
        settings: dict[str, Any] = {
            "host": HOST,
            "port": self.port,
            "virtual_host": "/",
            "credentials": pika.PlainCredentials("guest", "guest"),
            "connection_attempts": 1,
            "socket_timeout": 5,
            "stack_timeout": 10,
        }
        settings.update(overrides)
        return pika.ConnectionParameters(**settings)

    def connect(self, **overrides: Any) -> pika.BlockingConnection:
        """A pika BlockingConnection to this broker, closed when the test ends."""
        connection = pika.BlockingConnection(self.connection_parameters(**overrides))
        self._clients.append(connection)
        return connection

    def connections_on_workers(
        self, indexes: Iterable[int], rounds: int = 8, burst: int = 8
    ) -> dict[int, pika.BlockingConnection]:
        """Open connections until one has landed on each wanted worker index (bounded).

        They are opened `burst` at a time, concurrently. Workers balance accept() by open
        connections (workers.balance), so a burst normally covers every worker; a worker that is
        slow to wake can still lose a few races, hence the rounds.
        """
        wanted = set(indexes)
        found: dict[int, pika.BlockingConnection] = {}
        seen: set[int] = set()
        with ThreadPoolExecutor(burst) as pool:
            for _ in range(rounds):
                opened = list(pool.map(lambda _: self.connect(), range(burst)))
                for connection in opened:
                    index = worker_of(connection)
                    seen.add(index)
                    if index in wanted and index not in found:
                        found[index] = connection
                    else:
                        close_quietly(connection)
                if len(found) == len(wanted):
                    return found
        raise AssertionError(
            f"after {rounds} x {burst} connections the workers seen were {sorted(seen)}; wanted {sorted(wanted)}"
        )

    def connections_on_distinct_workers(self, count: int = 2) -> list[pika.BlockingConnection]:
        return list(self.connections_on_workers(range(count)).values())

    def close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for connection in clients:
            close_quietly(connection)

    # ---- shutdown

    def stop(self) -> list[str]:
        """SIGTERM, bounded waits, SIGKILL by PID; return what was wrong (empty when clean)."""
        if self._stopped:
            return []
        self._stopped = True
        self.close_clients()
        problems: list[str] = []
        tracked = self.processes()
        if self.popen.poll() is not None and not self._exit_expected:
            problems.append(f"supervisor had exited with {self.popen.returncode} before the test ended")
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                code = self.popen.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                problems.append(f"supervisor {self.pid} still running {STOP_TIMEOUT:g} s after SIGTERM")
            else:
                if code != 0:
                    problems.append(f"supervisor exited with {code} after SIGTERM, expected 0")
        survivors = wait_gone([*tracked, *self.processes()], EXIT_AFTER_SUPERVISOR_TIMEOUT)
        if survivors:
            problems.append("left running: " + ", ".join(_describe(p) for p in survivors))
            for process in survivors:
                kill(process)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(EXIT_AFTER_SUPERVISOR_TIMEOUT)
            unkillable = wait_gone(survivors, EXIT_AFTER_SUPERVISOR_TIMEOUT)
            if unkillable:
                problems.append("survived SIGKILL: " + ", ".join(_describe(p) for p in unkillable))
        leftovers = shm_segments(self.instance or f"{self.pid}-*")  # `<supervisor pid>-<hex>`
        if leftovers:
            problems.append("shared memory left behind: " + ", ".join(map(str, leftovers)))
            for segment in leftovers:
                with contextlib.suppress(OSError):
                    segment.unlink()
        shutil.rmtree(self.control_dir, ignore_errors=True)
        self._log.close()
        if problems:
            problems.append(self.log_tail())
        return problems


def _as_info(value: ReadyInfo | str) -> ReadyInfo | None:
    return value if isinstance(value, ReadyInfo) else None


class _CloseTimedOut(Exception):
    """Closing one client connection took too long (not a DeadlineExceeded: that must propagate)."""


def close_quietly(connection: pika.BlockingConnection) -> None:
    """Close a client connection, whatever state it or the broker is in, within 3 s."""
    with contextlib.suppress(pika.exceptions.AMQPError, OSError, _CloseTimedOut):
        if connection.is_open:
            with deadline(3.0, "closing a client connection", _CloseTimedOut):
                connection.close()


# --------------------------------------------------------------------------- client helpers


def worker_of(connection: Any) -> int:
    """Index of the Shoal worker process serving a pika or aio-pika connection.

    pika: `BlockingConnection._impl` is the underlying `pika.connection.Connection`, which keeps
    Connection.Start's table as `server_properties`. aio-pika: `Connection.transport` is an
    `UnderlayConnection` whose `.connection` is the aiormq connection with `server_properties`.
    """
    if isinstance(connection, pika.BlockingConnection):
        properties = connection._impl.server_properties
    else:
        properties = connection.transport.connection.server_properties
    assert properties and "shoal_worker" in properties, f"server_properties lack shoal_worker: {properties!r}"
    return int(properties["shoal_worker"])


# --------------------------------------------------------------------------- starting and stopping


def start_broker(directory: Path, workers: int = WORKERS, extra_args: Sequence[str] = ()) -> Broker:
    """Start `shoal serve` and wait (bounded) until it is ready; fails the test with its log."""
    return Broker(directory, workers, extra_args)


def kill_whole_broker(broker: Broker) -> None:
    """SIGKILL the supervisor (as a power cut would end it) and wait for its workers to follow."""
    workers = broker.worker_processes()
    broker.signal_supervisor(signal.SIGKILL)
    broker.popen.wait(10)
    assert not wait_gone(workers, 10), "workers outlived their SIGKILLed supervisor"


def finish(broker: Broker) -> None:
    problems = broker.stop()
    if problems:
        pytest.fail("broker did not shut down cleanly:\n" + "\n".join(problems), pytrace=False)



# Set by conftest.py's pytest_runtest_makereport: whether the test's call phase failed.
CALL_FAILED = pytest.StashKey[bool]()


def show_log_if_failed(request: pytest.FixtureRequest, instance: Broker) -> None:
    """Print the broker's log tail if the test failed (pytest shows it under "Captured stdout
    teardown" of that test)."""
    if request.node.stash.get(CALL_FAILED, False):
        print(instance.log_tail())
