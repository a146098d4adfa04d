"""Policies on a running broker (issue 36 §4): shoal ctl set_policy / clear_policy / list_policies
against queues pika declared and filled."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.harness import REPO_ROOT, Broker, finish, start_broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("policies") / "broker", workers=1)
    try:
        yield b
    finally:
        finish(b)


def ctl(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "ctl", "--control-socket",
         str(broker.control_dir / "control.sock"), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)


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
