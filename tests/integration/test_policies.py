"""Policies on a running broker (issue 36 §4): shoal ctl set_policy / clear_policy / list_policies
against queues pika declared and filled, a restart with --data-dir, definitions export/import, the
management API's /api/policies and the queue fields, and rabbitmqadmin's policy verbs. One broker
(management on) serves every test but the restart; each test clears the policies it sets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.ctl_helpers import ctl
from tests.integration.harness import Broker, finish, start_broker, wait_until
from tests.integration.management_helpers import HTTP, managed

__all__ = ["managed"]


@pytest.fixture(scope="module")
def broker(managed: tuple[Broker, int]) -> Broker:
    return managed[0]


def test_max_length_policy_drops_the_head_into_the_dlx_and_clearing_restores(broker: Broker) -> None:
    ch = broker.connect().channel()
    ch.exchange_declare("pol-dlx", "fanout")
    ch.queue_declare("pol-dead")
    ch.queue_bind("pol-dead", "pol-dlx")
    ch.queue_declare("pol-q")
    for i in range(10):
        ch.basic_publish("", "pol-q", str(i).encode())
    done = ctl(broker, "set_policy", "--priority", "1", "--apply-to", "queues", "cap", "^pol-q$",
               '{"max-length": 4, "dead-letter-exchange": "pol-dlx"}')
    assert done.returncode == 0, done.stderr
    assert ch.queue_declare("pol-q", passive=True).method.message_count == 4
    assert ch.queue_declare("pol-dead", passive=True).method.message_count == 6
    _method, _, body = ch.basic_get("pol-q", auto_ack=True)
    assert body == b"6"
    listed = json.loads(ctl(broker, "list_policies", "--formatter", "json").stdout)
    assert listed == [{"vhost": "/", "name": "cap", "pattern": "^pol-q$", "apply-to": "queues",
                       "definition": {"max-length": 4, "dead-letter-exchange": "pol-dlx"},
                       "priority": 1}]
    assert ctl(broker, "clear_policy", "cap").returncode == 0
    for _ in range(10):
        ch.basic_publish("", "pol-q", b"more")
    assert ch.queue_declare("pol-q", passive=True).method.message_count == 13


def test_invalid_definition_is_refused_with_rabbitmqs_text(broker: Broker) -> None:
    refused = ctl(broker, "set_policy", "bad", ".*", '{"max-length": -1}')
    assert refused.returncode != 0
    assert "Validation failed\n\n-1 is not a valid maximum length" in refused.stderr


# --------------------------------------------------------------------------- message-ttl


def _count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_message_ttl_policy_applies_to_messages_enqueued_after_it(broker: Broker) -> None:
    """RabbitMQ computes a message's expiry when it is enqueued: a message-ttl policy set on a
    queue that holds messages leaves those without one, and expires the ones that come after."""
    ch = broker.connect().channel()
    ch.queue_declare("pol-ttl-q")
    ch.queue_declare("pol-ttl-probe")
    for i in range(3):
        ch.basic_publish("", "pol-ttl-q", f"before-{i}".encode())
    done = ctl(broker, "set_policy", "--apply-to", "queues", "ttl", "^pol-ttl-", '{"message-ttl": 200}')
    assert done.returncode == 0, done.stderr
    try:
        for i in range(3):
            ch.basic_publish("", "pol-ttl-q", f"after-{i}".encode())
        ch.basic_publish("", "pol-ttl-probe", b"probe")
        # The probe, enqueued last, expires alone at the head of its queue: once it is gone the
        # 'after' messages are past their expiry too.
        wait_until(lambda: _count(ch, "pol-ttl-probe") == 0, 15.0, "the probe message expired")
        got = [ch.basic_get("pol-ttl-q", auto_ack=True)[2] for _ in range(3)]
        assert got == [b"before-0", b"before-1", b"before-2"]
        # Now at the head, the 'after' messages are dropped as expired.
        wait_until(lambda: _count(ch, "pol-ttl-q") == 0, 15.0, "the 'after' messages expired")
        assert ch.basic_get("pol-ttl-q", auto_ack=True)[0] is None
    finally:
        assert ctl(broker, "clear_policy", "ttl").returncode == 0
    ch.basic_publish("", "pol-ttl-q", b"no ttl now")
    ch.basic_publish("", "pol-ttl-probe", b"no ttl now")
    wait_until(lambda: _count(ch, "pol-ttl-probe") == 1, 5.0, "the probe enqueued")
    assert _count(ch, "pol-ttl-q") == 1
    ch.queue_delete("pol-ttl-q")
    ch.queue_delete("pol-ttl-probe")


# --------------------------------------------------------------------------- restart


@pytest.mark.deadline(120)
def test_policies_survive_a_restart_and_apply_to_the_restored_durable_queue(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    first = start_broker(tmp_path / "first", workers=1, extra_args=data)
    try:
        ch = first.connect().channel()
        ch.queue_declare("pol-durable", durable=True)
        done = ctl(first, "set_policy", "--priority", "3", "--apply-to", "queues", "keep-two",
                   "^pol-durable$", '{"max-length": 2}')
        assert done.returncode == 0, done.stderr
        assert ctl(first, "set_operator_policy", "op-cap", "^pol-", '{"message-ttl": 600000}'
                   ).returncode == 0
        listed_first = json.loads(ctl(first, "list_policies", "--formatter", "json").stdout)
    finally:
        finish(first)
    second = start_broker(tmp_path / "second", workers=1, extra_args=data)
    try:
        assert json.loads(ctl(second, "list_policies", "--formatter", "json").stdout) == listed_first
        ops = json.loads(ctl(second, "list_operator_policies", "--formatter", "json").stdout)
        assert [(p["name"], p["definition"]) for p in ops] == [("op-cap", {"message-ttl": 600000})]
        ch = second.connect().channel()
        for i in range(5):
            ch.basic_publish("", "pol-durable", str(i).encode(),
                             pika.BasicProperties(delivery_mode=2))
        assert _count(ch, "pol-durable") == 2
        assert ch.basic_get("pol-durable", auto_ack=True)[2] == b"3"
        rows = ctl(second, "-s", "list_queues", "name", "policy").stdout.splitlines()
        assert "pol-durable\tkeep-two" in rows
    finally:
        finish(second)


# --------------------------------------------------------------------------- definitions


def test_definitions_round_trip_through_shoal_ctl(broker: Broker, tmp_path: Path) -> None:
    assert ctl(broker, "set_policy", "--priority", "7", "--apply-to", "exchanges", "rt-ctl",
               "^rt-x", '{"alternate-exchange": "rt-ae"}').returncode == 0
    path = tmp_path / "defs.json"
    try:
        assert ctl(broker, "export_definitions", str(path)).returncode == 0
        exported = json.loads(path.read_text())
        mine = {"vhost": "/", "name": "rt-ctl", "pattern": "^rt-x", "apply-to": "exchanges",
                "definition": {"alternate-exchange": "rt-ae"}, "priority": 7}
        assert mine in exported["policies"]
        assert ctl(broker, "clear_policy", "rt-ctl").returncode == 0
        assert "rt-ctl" not in ctl(broker, "-s", "list_policies").stdout
        done = ctl(broker, "import_definitions", str(path))
        assert done.returncode == 0, done.stderr
        listed = json.loads(ctl(broker, "list_policies", "--formatter", "json").stdout)
        assert mine in listed
    finally:
        ctl(broker, "clear_policy", "rt-ctl")


def test_definitions_round_trip_through_the_management_api(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    body = {"pattern": "^rt-q", "definition": {"max-length": 9}, "apply-to": "queues",
            "priority": 4}
    assert http.request("PUT", "/api/policies/%2F/rt-http", body)[0] == 201
    try:
        exported = http.get("/api/definitions")
        mine = {"vhost": "/", "name": "rt-http", **body}
        assert mine in exported["policies"]
        assert http.request("DELETE", "/api/policies/%2F/rt-http")[0] == 204
        assert http.request("GET", "/api/policies/%2F/rt-http")[0] == 404
        status, _, answer = http.request("POST", "/api/definitions", exported)
        assert status in (201, 204), (status, answer)
        assert http.get("/api/policies/%2F/rt-http") == mine
    finally:
        http.request("DELETE", "/api/policies/%2F/rt-http")


# --------------------------------------------------------------------------- management API


def test_policy_http_put_get_delete_and_the_queue_fields(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    assert http.request("PUT", "/api/queues/%2F/mp-q", {"durable": False,
                                                        "arguments": {"x-max-length": 5}})[0] == 201
    body = {"pattern": "^mp-", "definition": {"max-length": 3, "overflow": "reject-publish"},
            "apply-to": "queues", "priority": 2}
    assert http.request("PUT", "/api/policies/%2F/mp", body)[0] == 201
    try:
        assert http.get("/api/policies/%2F/mp") == {"vhost": "/", "name": "mp", **body}
        assert [p["name"] for p in http.get("/api/policies/%2F")] == ["mp"]
        assert http.request("PUT", "/api/policies/%2F/mp", dict(body, priority=5))[0] == 204
        assert http.get("/api/policies/%2F/mp")["priority"] == 5

        def fields() -> tuple[Any, Any]:
            q = http.get("/api/queues/%2F/mp-q")
            return q["policy"], q["effective_policy_definition"]

        # the smaller max-length wins over the queue's own x-max-length; the rest is the policy's
        wait_until(lambda: fields() == ("mp", {"max-length": 3, "overflow": "reject-publish"}),
                   10.0, "the queue shows its policy")
        assert http.get("/api/queues/%2F/mp-q")["arguments"] == {"x-max-length": 5}

        status, _, answer = http.request("PUT", "/api/policies/%2F/bad",
                                         {"pattern": "^mp-", "definition": {"max-length": "x"}})
        assert status == 400 and answer["error"] == "bad_request"
        assert answer["reason"].startswith("Validation failed")
        assert '<<"x">> is not a valid maximum length' in answer["reason"]
        assert http.request("GET", "/api/policies/%2F/bad")[0] == 404
        assert http.request("PUT", "/api/policies/%2F/bad", {"definition": {}})[0] == 400

        assert http.request("DELETE", "/api/policies/%2F/mp")[0] == 204
        wait_until(lambda: fields() == (None, {}), 10.0, "the queue without a policy")
        assert http.request("DELETE", "/api/policies/%2F/mp")[0] == 404
        assert http.request("GET", "/api/policies/%2F/mp")[0] == 404
    finally:
        http.request("DELETE", "/api/policies/%2F/mp")
        http.request("DELETE", "/api/queues/%2F/mp-q")


ADMIN = shutil.which("rabbitmqadmin") or None
if os.environ.get("SHOAL_RABBITMQADMIN") and Path(os.environ["SHOAL_RABBITMQADMIN"]).is_file():
    ADMIN = os.environ["SHOAL_RABBITMQADMIN"]


@pytest.mark.skipif(ADMIN is None, reason="rabbitmqadmin is neither on PATH nor at "
                    "$SHOAL_RABBITMQADMIN (.ci/run fetches it from Debian's rabbitmq-server package)")
def test_rabbitmqadmin_declares_lists_and_deletes_a_policy(managed: tuple[Broker, int]) -> None:
    _, port = managed
    assert ADMIN is not None

    def admin(*args: str) -> str:
        done = subprocess.run([sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(port), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    admin("declare", "policy", "name=p", "pattern=^x", 'definition={"max-length":2}')
    try:
        rows = json.loads(admin("-f", "raw_json", "list", "policies"))
        assert {"vhost": "/", "name": "p", "pattern": "^x", "apply-to": "all",
                "definition": {"max-length": 2}, "priority": 0} in rows
        assert "^x" in admin("list", "policies")
        http = HTTP(port)
        http.request("PUT", "/api/queues/%2F/x-admin", {"durable": False})
        wait_until(lambda: http.get("/api/queues/%2F/x-admin")["policy"] == "p", 10.0,
                   "the queue shows the policy rabbitmqadmin declared")
        admin("delete", "policy", "name=p")
        assert "p" not in [r["name"] for r in json.loads(admin("-f", "raw_json", "list", "policies"))]
    finally:
        HTTP(port).request("DELETE", "/api/policies/%2F/p")
        HTTP(port).request("DELETE", "/api/queues/%2F/x-admin")
