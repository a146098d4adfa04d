"""A real celery worker process with Shoal as its broker.

The test writes a small celery app module into a temporary directory, starts
`celery -A <module> worker --pool=solo` as a subprocess against the broker URL (bounded, killed
by PID at the end, its log shown when a test fails), and drives it from the test process:

- tasks sent with `delay` run and their results come back through the `rpc://` result backend
  (task messages are published with confirms, consumed with basic.qos prefetch and acked late;
  replies go through a reply queue on the default exchange);
- remote control (`ping`, `cancel_consumer`, `add_consumer`) goes through celery's pidbox fanout
  exchange; cancel_consumer makes the worker send basic.cancel, so a task sent then waits in the
  queue until add_consumer consumes it again;
- celery's own connection recovery: every Shoal worker process is SIGKILLed; the celery worker
  notices, reconnects when the supervisor has replaced them, and runs new tasks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery

from tests.integration.harness import Broker, wait_until

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
RESULT_TIMEOUT = 20.0

APP_SOURCE = '''
import os
import time

from celery import Celery

app = Celery("{module}", broker=os.environ["SHOAL_CELERY_BROKER"], backend="rpc://")
app.conf.update(
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=100,
    broker_transport_options={{"confirm_publish": True}},
    broker_heartbeat=10,
    task_acks_late=True,
    worker_cancel_long_running_tasks_on_connection_loss=True,
    task_default_queue="{queue}",
    worker_prefetch_multiplier=1,
    result_expires=300,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
)


@app.task
def add(x, y):
    return x + y


@app.task
def worker_pid():
    return os.getpid()


@app.task(bind=True)
def delivery_info(self):
    info = self.request.delivery_info or {{}}
    return {{"routing_key": info.get("routing_key"), "redelivered": info.get("redelivered")}}
'''


@dataclass
class CeleryWorker:
    process: subprocess.Popen[bytes]
    log_path: Path
    hostname: str
    queue: str

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError as exc:
            return f"(no celery log: {exc})"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)


def _load_app(directory: Path, module: str, broker_url: str) -> ModuleType:
    os.environ["SHOAL_CELERY_BROKER"] = broker_url
    spec = importlib.util.spec_from_file_location(module, directory / f"{module}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded
    spec.loader.exec_module(loaded)
    return loaded


@contextlib.contextmanager
def celery_worker(
    broker: Broker, directory: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[CeleryWorker, ModuleType]]:
    module = f"shoal_celery_{uuid.uuid4().hex[:8]}"
    queue = f"celery.{module}"
    (directory / f"{module}.py").write_text(APP_SOURCE.format(module=module, queue=queue))
    hostname = f"{module}@shoal-test"
    log_path = directory / "celery-worker.log"
    env = {**os.environ, "SHOAL_CELERY_BROKER": broker.url, "PYTHONPATH": str(directory),
           "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", module, "worker", "--pool=solo", "--loglevel=INFO",
             "-n", hostname, "--without-mingle", "--task-events"],
            cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = CeleryWorker(process, log_path, hostname, queue)
    loaded = None
    try:
        loaded = _load_app(directory, module, broker.url)
        wait_until(lambda: "ready." in worker.log() or process.poll() is not None, START_TIMEOUT,
                   "the celery worker to be ready")
        assert process.poll() is None, f"celery worker exited with {process.returncode}:\n{worker.log()}"
        yield worker, loaded
    except BaseException:
        print(f"---- celery worker log ----\n{worker.log()}")
        raise
    finally:
        worker.stop()
        if loaded is not None:
            app: Celery = loaded.app
            with contextlib.suppress(Exception):
                app.close()
            sys.modules.pop(module, None)
        os.environ.pop("SHOAL_CELERY_BROKER", None)


@pytest.mark.deadline(120)
def test_celery_worker_runs_tasks_with_results_and_remote_control(
    shared_broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with celery_worker(shared_broker, tmp_path, request) as (worker, tasks):
        results = [tasks.add.delay(i, i) for i in range(10)]
        assert [r.get(timeout=RESULT_TIMEOUT) for r in results] == [2 * i for i in range(10)]
        assert tasks.worker_pid.delay().get(timeout=RESULT_TIMEOUT) == worker.process.pid
        info = tasks.delivery_info.delay().get(timeout=RESULT_TIMEOUT)
        assert info == {"routing_key": worker.queue, "redelivered": False}

        app: Celery = tasks.app
        pongs = app.control.ping(destination=[worker.hostname], timeout=5)
        assert pongs == [{worker.hostname: {"ok": "pong"}}]

        # cancel_consumer: the worker cancels its AMQP consumer; a task now waits in the queue.
        replies = app.control.cancel_consumer(worker.queue, destination=[worker.hostname], reply=True, timeout=5)
        assert replies and "ok" in replies[0][worker.hostname], replies

        def declared() -> Any:
            with app.connection_for_write() as connection:
                return connection.default_channel.queue_declare(worker.queue, passive=True)

        def depth() -> int:
            return int(declared().message_count)

        # Celery replies "ok" and cancels on its next loop turn (call_soon): publish once the
        # broker has seen the basic.cancel, or the worker may still take the task.
        wait_until(lambda: declared().consumer_count == 0, 30, "the worker's consumer cancelled")
        waiting = tasks.add.delay(20, 22)

        # It waits in the queue (a consumer would have taken it: unacked, not counted).
        wait_until(lambda: depth() == 1, 30, "the task to wait in the queue")
        assert waiting.state == "PENDING"
        time.sleep(0.5)
        assert depth() == 1
        replies = app.control.add_consumer(worker.queue, destination=[worker.hostname], reply=True, timeout=5)
        assert replies and "ok" in replies[0][worker.hostname], replies
        assert waiting.get(timeout=RESULT_TIMEOUT) == 42
        assert worker.process.poll() is None


@pytest.mark.deadline(120)
def test_celery_worker_reconnects_after_shoal_workers_are_killed(
    broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with celery_worker(broker, tmp_path, request) as (worker, tasks):
        assert tasks.add.delay(1, 2).get(timeout=RESULT_TIMEOUT) == 3
        old = broker.worker_pids
        for pid in old:
            os.kill(pid, signal.SIGKILL)
        for index, pid in enumerate(old):
            broker.wait_for_worker_replaced(index, pid)
        wait_until(lambda: "Connection to broker lost" in worker.log(), 20,
                   "the celery worker to notice the broker connection loss")
        # The test's own client connections died too: a new app instance, as a new client would.
        tasks.app.close()
        fresh = Celery(tasks.app.main, broker=broker.url, backend="rpc://")
        fresh.conf.update(tasks.app.conf)
        add = fresh.signature(f"{tasks.__name__}.add")
        result = add.delay(40, 2)
        assert result.get(timeout=60) == 42
        assert worker.process.poll() is None, "the celery worker died instead of reconnecting"
        fresh.close()
        log = worker.log()
        assert "Connected to amqp://" in log.split("Connection to broker lost", 1)[1], log
