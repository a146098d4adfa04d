"""Node's amqplib (from npm) against Shoal.

`tests/integration/node/compat.mjs` holds the scenarios; this module installs the amqplib
version pinned in `node/package.json` (and `package-lock.json`) into `node/node_modules` once
(`npm ci`, bounded; skipped when the right version is already there), then runs
`node compat.mjs <scenario> <url>` with a bounded timeout and reads the JSON lines it prints.

Covered (`basics`): publisher confirms (createConfirmChannel + waitForConfirms), mandatory returns
(the channel's 'return' event), basic.qos (prefetch honoured), consume / ack, cancel from the
client and from the broker (a null message), get / nack / reject, a 404 closing one channel
only. `recover`: amqplib 2.x's opt-in connection recovery (`connect(url, {recovery: {setup}})`)
after the worker its connection is on is SIGKILLed: setup runs again, consumption resumes and the
unacked message comes back redelivered. Also bindExchange, messageTtl with dead-lettering and
direct reply-to.

The test is skipped only when `node` or `npm` is not on PATH; an npm install that fails is a
test failure.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Broker

NODE_DIR = Path(__file__).resolve().parent / "node"
SCRIPT = NODE_DIR / "compat.mjs"
WANTED_VERSION = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]["amqplib"]
INSTALL_TIMEOUT = 300
SCENARIO_TIMEOUT = 75.0


def _installed_version() -> str | None:
    try:
        return json.loads((NODE_DIR / "node_modules" / "amqplib" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def node() -> str:
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        pytest.skip("Node's amqplib compatibility test needs `node` and `npm` on PATH; not found")
    if _installed_version() != WANTED_VERSION:
        command = [npm_bin, "ci" if (NODE_DIR / "package-lock.json").exists() else "install",
                   "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            done = subprocess.run(command, check=False, cwd=NODE_DIR, capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"`{' '.join(command)}` in {NODE_DIR} took over {INSTALL_TIMEOUT} s: {exc.output}")
        if done.returncode != 0:
            pytest.fail(f"`{' '.join(command)}` in {NODE_DIR} failed ({done.returncode}):\n"
                        f"{done.stdout}\n{done.stderr}")
        assert _installed_version() == WANTED_VERSION, f"npm installed amqplib {_installed_version()}"
    return node_bin


class NodeScenario:
    """`node compat.mjs <scenario> <url>` as a subprocess; its JSON lines read on a thread."""

    def __init__(self, node: str, scenario: str, url: str):
        self.process = subprocess.Popen(
            [node, str(SCRIPT), scenario, url], cwd=NODE_DIR, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, event: str, timeout: float = SCENARIO_TIMEOUT) -> dict[str, Any]:
        """Read events until `event` (bounded); fail on a 'failed' event or an early exit."""
        limit = time.monotonic() + timeout
        while True:
            remaining = limit - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {event!r} from node within {timeout:g} s; seen: {self.seen}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"node exited before {event!r}: {self.seen}\n{self._stderr()}")
            try:
                item = json.loads(line)
            except ValueError:
                self.seen.append({"event": "output", "line": line.rstrip()})
                continue
            self.seen.append(item)
            if item.get("event") == "failed":
                raise AssertionError(f"node scenario failed: {item.get('error')}\n{self._stderr()}")
            if item.get("event") == event:
                return item

    def _stderr(self) -> str:
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            return "(node still running)"
        assert self.process.stderr is not None
        return self.process.stderr.read()[-4000:]

    def finish(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only node itself
        self.process.wait(10)


@pytest.fixture
def scenario(node: str) -> Iterator[Any]:
    started: list[NodeScenario] = []

    def start(name: str, url: str) -> NodeScenario:
        run = NodeScenario(node, name, url)
        started.append(run)
        return run

    yield start
    for run in started:
        run.finish()


def test_amqplib_basics(shared_broker: Broker, scenario: Any) -> None:
    run = scenario("basics", shared_broker.url)
    connected = run.expect("connected")
    assert connected["amqplib"] == WANTED_VERSION
    done = run.expect("done")
    assert done["scenario"] == "basics"
    events = [item["event"] for item in run.seen]
    for step in ("confirmed", "returned", "consumed", "get-nack-reject", "broker-cancel"):
        assert step in events, events
    assert run.process.wait(10) == 0


def test_amqplib_close_after_pipelined_publishes_gets_close_ok(shared_broker: Broker, scenario: Any) -> None:
    """amqplib writes connection.close ahead of publishes it still buffers: the broker answers
    close-ok and reads on until the client closes, so close() resolves (no EPIPE / reset)."""
    run = scenario("pipelined-close", shared_broker.url)
    run.expect("done", timeout=60)
    assert [item["round"] for item in run.seen if item["event"] == "closed"] == [0, 1, 2, 3, 4]
    assert run.process.wait(10) == 0


def test_amqplib_recovery_after_its_worker_is_killed(broker: Broker, scenario: Any) -> None:
    run = scenario("recover", broker.url)
    index = int(run.expect("kill-me")["worker"])
    victim = broker.worker_pids[index]
    os.kill(victim, signal.SIGKILL)
    broker.wait_for_worker_replaced(index, victim)
    recovered = run.expect("recovered")
    assert recovered["connects"] >= 2 and recovered["disconnects"] >= 1
    run.expect("done")
    assert run.process.wait(10) == 0


@pytest.mark.parametrize("name", ["exchange-bind", "ttl-dead-letter", "direct-reply-to"])
def test_amqplib_issue_4_features(shared_broker: Broker, scenario: Any, name: str) -> None:
    """Exchange-to-exchange bindings (bindExchange), queue TTL with dead-lettering (assertQueue's
    messageTtl / deadLetterExchange options, the x-death header), direct reply-to."""
    run = scenario(name, shared_broker.url)
    run.expect("done", timeout=30)
    assert run.process.wait(10) == 0
