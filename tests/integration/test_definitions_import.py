"""Definitions from RabbitMQ 3.10.8 (issue 37): ``shoal serve --load-definitions`` (and
rabbitmq.conf's ``load_definitions``) and ``shoal ctl import_definitions`` take a real
``rabbitmqadmin export`` (fixtures/rabbitmq-3.10.8-definitions.json: made-up passwords, alice's
is ``alice-pass-1``, bob's ``bob-pass-2``, guest's ``guest``); the users log in with their
RabbitMQ passwords, the objects exist and the permissions hold; the second vhost ``other`` is
added with its queue and permissions, and guest logs into it; what Shoal lacks (the global
parameter ``internal_cluster_id``) is named in the log; a malformed file stops the start with
one line and exit code 1."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.ctl_helpers import ctl
from tests.integration.harness import REPO_ROOT, Broker, finish, serve_command

FIXTURE = Path(__file__).parent / "fixtures" / "rabbitmq-3.10.8-definitions.json"
PASSWORDS = {"alice": "alice-pass-1", "bob": "bob-pass-2", "guest": "guest"}


def login(broker: Broker, user: str) -> pika.BlockingConnection:
    return broker.connect(credentials=pika.PlainCredentials(user, PASSWORDS[user]))


def check_imported(broker: Broker) -> None:
    """RabbitMQ's users, permissions, topic permissions, queues, exchanges and bindings."""
    alice = login(broker, "alice").channel()
    assert alice.queue_declare("orders.eu", passive=True).method.message_count == 0
    alice.basic_publish("orders", "eu.1", b"to orders.eu")  # orders -topic-> orders.eu
    alice.basic_publish("orders", "bob.1", b"to bob.inbox")  # orders -> bob.ex -fanout-> bob.inbox
    for queue in ("orders.eu", "bob.inbox"):
        method, _, body = alice.basic_get(queue, auto_ack=True)
        assert method is not None and body == f"to {queue}".encode(), queue
    bob_connection = login(broker, "bob")
    bob = bob_connection.channel()
    bob.queue_declare("bob.inbox", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bob.queue_purge("orders.eu")  # configure is ^bob\..* only
    assert refused.value.reply_code == 403
    bob = bob_connection.channel()
    bob.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bob.basic_publish("amq.topic", "alice.x", b"x")  # topic permission: ^bob\..* only
    assert "access to topic 'alice.x'" in refused.value.reply_text
    login(broker, "guest").close()
    users = {u["user"]: u["tags"] for u in json.loads(
        ctl(broker, "--formatter", "json", "list_users").stdout)}
    assert users["alice"] == ["administrator"]
    assert sorted(users["bob"]) == ["management", "monitoring"]  # RabbitMQ's ["monitoring,management"]


def check_other_vhost(broker: Broker) -> None:
    """The export's second vhost: added, its queue in it (not in "/"), guest's permissions on
    it; guest logs into it."""
    vhosts = json.loads(ctl(broker, "--formatter", "json", "list_vhosts").stdout)
    assert {v["name"] for v in vhosts} >= {"/", "other"}, vhosts
    with broker.connect(virtual_host="other") as conn:
        ch = conn.channel()
        assert ch.queue_declare("elsewhere", passive=True).method.queue == "elsewhere"
    with broker.connect() as conn, pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        conn.channel().queue_declare("elsewhere", passive=True)
    assert gone.value.reply_code == 404


def test_load_definitions_at_start_and_again_at_restart(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker", 2, extra_args=["--load-definitions", str(FIXTURE)])
    try:
        check_imported(broker)
        log = broker.log_tail()
        for named in ("global parameter 'internal_cluster_id'",):
            assert any(named in line and "WARNING" in line for line in log.splitlines()), named
        check_other_vhost(broker)
        policies = ctl(broker, "list_policies").stdout
        assert "ttl-orders" in policies
    finally:
        finish(broker)
    again = Broker(tmp_path / "broker", 2, extra_args=["--load-definitions", str(FIXTURE)])
    try:  # the same file at every boot, as RabbitMQ: nothing replaced, nothing refused
        check_imported(again)
        log = again.log_tail()
        assert "replaced by the file's" not in log.split("listening on")[-1]
        assert "0 skipped" in log
        check_other_vhost(again)
    finally:
        finish(again)


def test_load_definitions_from_rabbitmq_conf(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(f"load_definitions = {FIXTURE}\n")
    os.chmod(conf, 0o600)
    broker = Broker(tmp_path / "broker", 1, extra_args=["--config", str(conf)])
    try:
        check_imported(broker)
    finally:
        finish(broker)


def test_ctl_import_names_what_is_unsupported(tmp_path: Path) -> None:
    body = json.loads(FIXTURE.read_text())
    body["users"].append({"name": "carol", "password_hash": "x", "tags": "",
                          "hashing_algorithm": "rabbit_password_hashing_sha512"})
    body["explanation"] = "not a key of RabbitMQ's export"
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(body))
    broker = Broker(tmp_path / "broker", 2)
    try:
        result = ctl(broker, "import_definitions", str(path))
        assert result.returncode == 0, result.stderr
        check_imported(broker)
        check_other_vhost(broker)
        for named in ("internal_cluster_id",
                      "user 'carol': password hashing rabbit_password_hashing_sha512",
                      "key 'explanation'"):
            assert named in result.stderr, named
            assert named in broker.log_tail(), named
    finally:
        finish(broker)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"users": {"name": "x"}}',
                                  '{"queues": ["q"]}'])
def test_a_malformed_file_stops_the_start_with_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "defs.json"
    path.write_text(text)
    result = subprocess.run(
        [*serve_command(), "serve", "--port", "0", "--management-port", "0",
         "--data-dir", str(tmp_path / "data"), "--load-definitions", str(path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cannot start: --load-definitions {path}: ")
    assert not (tmp_path / "data").exists()


def test_load_definitions_at_start_without_slash(tmp_path: Path) -> None:
    """--load-definitions on a broker without "/" (--default-vhost app): each object goes into
    the vhost it names, a vhost not there is added first, and "/" is not made."""
    body = {"vhosts": [{"name": "app"}, {"name": "extra"}],
            "permissions": [{"user": "guest", "vhost": "extra", "configure": ".*",
                             "write": ".*", "read": ".*"}],
            "queues": [{"name": "in-app", "vhost": "app", "durable": True},
                       {"name": "in-extra", "vhost": "extra", "durable": True}],
            "exchanges": [{"name": "x-extra", "vhost": "extra", "type": "fanout"}],
            "bindings": [{"source": "x-extra", "vhost": "extra", "destination": "in-extra",
                          "destination_type": "queue", "routing_key": ""}]}
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(body))
    broker = Broker(tmp_path / "broker", 1, extra_args=[
        "--default-vhost", "app", "--load-definitions", str(path)])
    try:
        broker.connect(virtual_host="app").channel().queue_declare("in-app", passive=True)
        extra = broker.connect(virtual_host="extra").channel()
        extra.basic_publish("x-extra", "", b"routed in extra")
        method, _, message = extra.basic_get("in-extra", auto_ack=True)
        assert method is not None and message == b"routed in extra"
        vhosts = json.loads(ctl(broker, "--formatter", "json", "list_vhosts").stdout)
        assert sorted(v["name"] for v in vhosts) == ["app", "extra"]
        assert "0 skipped" in broker.log_tail()
    finally:
        finish(broker)
