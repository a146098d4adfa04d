"""`shoal ctl` against a running broker: rabbitmqctl's verbs over the control socket, and users
changed at runtime (issue 37) as pika sees them. One broker for the module (two workers, so a
change must reach both)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.ctl_helpers import ctl
from tests.integration.harness import REPO_ROOT, Broker, finish, start_broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("ctl") / "broker", workers=2)
    try:
        yield b
    finally:
        finish(b)


def login(broker: Broker, user: str, password: str) -> pika.BlockingConnection:
    return broker.connect(credentials=pika.PlainCredentials(user, password))


def grant(broker: Broker, user: str, password: str) -> None:
    """A user added at runtime has no permissions (RabbitMQ's rule): give it all on "/", then
    wait (bounded) until logins are let in on every worker (four held open at once land on
    both), the change having reached them."""
    done = ctl(broker, "set_permissions", user, ".*", ".*", ".*")
    assert done.returncode == 0, done.stderr
    limit = time.monotonic() + 10
    while True:
        opened: list[pika.BlockingConnection] = []
        try:
            for _ in range(4):
                opened.append(login(broker, user, password))
            return
        except pika.exceptions.ProbableAccessDeniedError:
            if time.monotonic() > limit:
                raise
            time.sleep(0.05)
        finally:
            for connection in opened:
                connection.close()


def test_list_queues_after_pika_declares(broker: Broker) -> None:
    ch = broker.connect().channel()
    ch.queue_declare("ctl-q1", durable=True)
    ch.queue_declare("ctl-q2", arguments={"x-max-length": 10})
    ch.basic_publish("", "ctl-q1", b"hi")
    ch.exchange_declare("ctl-x", "topic")
    ch.queue_bind("ctl-q1", "ctl-x", "a.#")
    done = ctl(broker, "list_queues", "name", "messages", "durable", "arguments")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ...",
                         "name\tmessages\tdurable\targuments"]
    assert "ctl-q1\t1\ttrue\t[]" in lines and 'ctl-q2\t0\tfalse\t[{"x-max-length",10}]' in lines
    bindings = ctl(broker, "-q", "list_bindings").stdout.splitlines()
    assert "ctl-x\texchange\tctl-q1\tqueue\ta.#\t[]" in bindings
    assert "\texchange\tctl-q1\tqueue\tctl-q1\t[]" in bindings
    exchanges = json.loads(ctl(broker, "list_exchanges", "--formatter", "json").stdout)
    assert {"name": "ctl-x", "type": "topic"} in exchanges


def test_add_user_then_pika_logs_in_and_change_password(broker: Broker) -> None:
    done = ctl(broker, "add_user", "carol", "pw1")
    assert done.returncode == 0 and done.stdout.startswith('Adding user "carol" ...\n'), done.stderr
    grant(broker, "carol", "pw1")
    for _ in range(4):  # each worker has its own table: several connections land on both
        assert login(broker, "carol", "pw1").is_open
    assert "carol\t[]" in ctl(broker, "-s", "list_users").stdout.splitlines()
    assert ctl(broker, "add_user", "carol", "x").returncode == 70
    done = ctl(broker, "change_password", "carol", input="pw2\n")  # from stdin
    assert done.returncode == 0, done.stderr
    for _ in range(4):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            login(broker, "carol", "pw1")
        assert login(broker, "carol", "pw2").is_open
    assert ctl(broker, "set_user_tags", "carol", "monitoring").returncode == 0
    assert "carol\t[monitoring]" in ctl(broker, "-s", "list_users").stdout.splitlines()


def test_delete_user_closes_its_connections_with_320(broker: Broker) -> None:
    assert ctl(broker, "add_user", "dave", "pw").returncode == 0
    grant(broker, "dave", "pw")
    connection = login(broker, "dave", "pw")
    other = broker.connect()  # guest's: stays open
    done = ctl(broker, "delete_user", "dave")
    assert done.returncode == 0 and done.stdout == 'Deleting user "dave" ...\n', done.stderr
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        limit = time.monotonic() + 5
        while time.monotonic() < limit:
            connection.process_data_events(0.1)
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == "CONNECTION_FORCED - user 'dave' is deleted"
    assert other.is_open
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, "dave", "pw")
    missing = ctl(broker, "delete_user", "dave")
    assert missing.returncode == 67 and missing.stderr == 'Error:\nUser "dave" does not exist\n'


def test_purge_and_delete_queue(broker: Broker) -> None:
    ch = broker.connect().channel()
    ch.queue_declare("ctl-purge")
    for _ in range(3):
        ch.basic_publish("", "ctl-purge", b"x")
    assert ctl(broker, "purge_queue", "ctl-purge").stdout == "Purging queue 'ctl-purge' in vhost '/' ...\n"
    assert ch.queue_declare("ctl-purge", passive=True).method.message_count == 0
    ch.basic_publish("", "ctl-purge", b"x")
    time.sleep(0.2)
    done = ctl(broker, "delete_queue", "ctl-purge")
    assert done.stdout.splitlines() == ["Deleting queue 'ctl-purge' on vhost '/' ...",
                                        "Queue was successfully deleted with 1 ready messages"]
    assert ctl(broker, "delete_queue", "ctl-purge").returncode == 64
    assert ctl(broker, "purge_queue", "ctl-purge").returncode == 69


def test_close_connection(broker: Broker) -> None:
    connection = broker.connect(client_properties={"product": "ctl-close"})
    rows = ctl(broker, "-q", "list_connections", "name", "client").stdout.splitlines()
    name = next(line.split("\t")[0] for line in rows if line.endswith("\tctl-close"))
    done = ctl(broker, "close_connection", name, "go away")
    assert done.returncode == 0 and done.stdout == f"Closing connection {name}, reason: go away...\n"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        limit = time.monotonic() + 5
        while time.monotonic() < limit:
            connection.process_data_events(0.1)
    assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - go away")


def test_export_import_round_trip(broker: Broker, tmp_path: Path) -> None:
    ch = broker.connect().channel()
    ch.exchange_declare("ctl-rt-x", "direct", durable=True)
    ch.queue_declare("ctl-rt-q", durable=True, arguments={"x-message-ttl": 60000})
    ch.queue_bind("ctl-rt-q", "ctl-rt-x", "rk")
    assert ctl(broker, "add_user", "erin", "pw").returncode == 0
    assert ctl(broker, "set_user_tags", "erin", "management").returncode == 0
    # a new user has no permissions (RabbitMQ's rule): the export carries erin's, the import
    # gives them back, or erin could not open "/"
    assert ctl(broker, "set_permissions", "erin", ".*", ".*", ".*").returncode == 0
    path = tmp_path / "defs.json"
    assert ctl(broker, "export_definitions", str(path)).returncode == 0
    exported = json.loads(path.read_text())
    assert ctl(broker, "export_definitions", "-").stdout.strip() == path.read_text()
    assert {"name": "erin", "tags": ["management"]}.items() <= next(
        u for u in exported["users"] if u["name"] == "erin").items()
    for verb in (("delete_queue", "ctl-rt-q"), ("delete_user", "erin")):
        assert ctl(broker, *verb).returncode == 0
    ch.exchange_delete("ctl-rt-x")
    done = ctl(broker, "import_definitions", str(path))
    assert done.returncode == 0, done.stderr
    queues = ctl(broker, "-s", "list_queues", "name", "arguments").stdout.splitlines()
    assert 'ctl-rt-q\t[{"x-message-ttl",60000}]' in queues
    assert "ctl-rt-x\texchange\tctl-rt-q\tqueue\trk\t[]" in ctl(broker, "-s", "list_bindings").stdout
    assert login(broker, "erin", "pw").is_open  # the stored password came back as it was
    again = json.loads(ctl(broker, "export_definitions", "-").stdout)
    for kind in ("queues", "exchanges", "bindings", "users"):
        assert sorted(map(json.dumps, again[kind])) == sorted(map(json.dumps, exported[kind]))


def test_status_await_startup_and_the_old_alias(broker: Broker) -> None:
    done = ctl(broker, "status")
    assert done.returncode == 0 and done.stdout.startswith("Status of node shoal@")
    assert f"OS PID: {broker.pid}" in done.stdout
    assert ctl(broker, "await_startup").returncode == 0
    old = subprocess.run([sys.executable, "-m", "cli.main", "list-connections", "--control",
                          str(broker.control_dir / "control.sock")],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert old.returncode == 0 and "deprecated" in old.stderr
