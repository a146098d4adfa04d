"""Durable exchanges, queues and bindings survive a restart of `shoal serve --data-dir DIR`, a
clean one or a SIGKILL; transient ones do not; one broker per data directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pika
import pytest

from tests.integration.harness import (
    HOST,
    REPO_ROOT,
    Broker,
    finish,
    kill_whole_broker,
    serve_command,
    shm_segments,
    start_broker,
)
from tests.integration.pika_helpers import drain_with_get, queue_exists


def exchange_exists(connection: pika.BlockingConnection, name: str) -> bool:
    channel = connection.channel()
    try:
        channel.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    channel.close()
    return True


def declare_topology(broker: Broker) -> None:
    channel = broker.connect().channel()
    channel.exchange_declare("orders", "topic", durable=True, arguments={"alternate-exchange": "unrouted"})
    channel.exchange_declare("unrouted", "fanout", durable=True)
    channel.exchange_declare("audit", "fanout", durable=True)
    channel.exchange_declare("scratch", "direct")  # transient
    channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 100})
    channel.queue_declare("lost", durable=True)
    channel.queue_declare("audit.log", durable=True)
    channel.queue_declare("scratch.q")  # transient
    channel.queue_declare("deleted", durable=True)
    channel.queue_delete("deleted")
    channel.queue_bind("orders.eu", "orders", "eu.#")
    channel.queue_bind("lost", "unrouted")
    channel.queue_bind("audit.log", "audit")
    channel.exchange_bind(destination="audit", source="orders", routing_key="eu.#")
    channel.queue_bind("scratch.q", "orders", "#")  # to a transient queue: not kept
    channel.queue_bind("orders.eu", "scratch", "k")  # from a transient exchange: not kept
    channel.queue_bind("orders.eu", "orders", "old.#")
    channel.queue_unbind("orders.eu", "orders", "old.#")


def check_topology(broker: Broker) -> None:
    connection = broker.connect()
    assert [queue_exists(connection, q) for q in ("orders.eu", "lost", "audit.log", "scratch.q", "deleted")] == [
        True, True, True, False, False]
    assert [exchange_exists(connection, x) for x in ("orders", "unrouted", "audit", "scratch")] == [
        True, True, True, False]
    channel = connection.channel()
    # The arguments came back: the same declare is equivalent, a different one is not.
    channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 100})
    channel.exchange_declare("orders", "topic", durable=True, arguments={"alternate-exchange": "unrouted"})
    # The bindings came back: eu.# to orders.eu and, through the exchange-to-exchange binding,
    # to audit.log; the rest to lost through the alternate exchange -- old.x too, as old.# was
    # unbound before the restart.
    channel.confirm_delivery()
    for key in ("eu.paris", "us.ny", "old.x"):
        channel.basic_publish("orders", key, key.encode())
    assert drain_with_get(channel, "orders.eu", 5) == [(b"eu.paris", False)]
    assert drain_with_get(channel, "audit.log", 5) == [(b"eu.paris", False)]
    assert drain_with_get(channel, "lost", 5) == [(b"us.ny", False), (b"old.x", False)]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        channel.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 5})
    assert err.value.reply_code == 406


def serve_refused(data: Path, control: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `shoal serve --data-dir DATA` expecting it not to start: the process and its lines."""
    done = subprocess.run(
        [*serve_command(), "serve", "--management-port", "0", "--host", HOST, "--port", "0", "--workers", "1",
         "--data-dir", str(data), "--control-socket", str(control)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    return done, (done.stdout + done.stderr).strip().splitlines()


@pytest.mark.deadline(120)
def test_durable_topology_survives_a_clean_restart_and_transient_does_not(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    first = start_broker(tmp_path / "first", extra_args=data)
    try:
        declare_topology(first)
    finally:
        finish(first)
    second = start_broker(tmp_path / "second", extra_args=data)
    try:
        check_topology(second)
        assert "restored 3 exchange(s), 3 queue(s), 4 binding(s)" in second.log_tail()
    finally:
        finish(second)


@pytest.mark.deadline(120)
def test_a_declare_ok_survives_a_sigkill_of_the_whole_broker(tmp_path: Path) -> None:
    """What was declared-ok is on disk: SIGKILL the supervisor (its workers follow) right after."""
    data = ["--data-dir", str(tmp_path / "data")]
    first = start_broker(tmp_path / "first", extra_args=data)
    try:
        declare_topology(first)
        kill_whole_broker(first)
        second = start_broker(tmp_path / "second", extra_args=data)  # the lock died with the first
        try:
            check_topology(second)
        finally:
            finish(second)
    finally:
        finish(first)


@pytest.mark.deadline(90)
def test_a_second_broker_on_the_same_data_dir_refuses_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_broker(tmp_path / "first", extra_args=["--data-dir", str(data)])
    try:
        done, output = serve_refused(data, tmp_path / "control.sock")
        assert done.returncode == 1
        assert len(output) == 1, output
        assert f"data directory {data} is in use by another broker (pid {first.pid})" in output[0]
        assert not (tmp_path / "control.sock").exists()
        # The first broker is untouched and still serves.
        channel = first.connect().channel()
        assert channel.queue_declare("", exclusive=True).method.queue
        assert shm_segments(first.instance)
    finally:
        finish(first)


@pytest.mark.deadline(60)
def test_a_damaged_definitions_file_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "definitions.db").write_bytes(b"not a database, " * 512)
    done, output = serve_refused(data, tmp_path / "control.sock")
    assert done.returncode == 1
    assert len(output) == 1, output
    assert f"cannot start: {data / 'definitions.db'}: " in output[0]
    assert "Traceback" not in done.stderr
