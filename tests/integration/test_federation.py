"""Federation (issue 39) between Shoal brokers on this host: exchange federation follows the
downstream's bindings, a three-node ring with max-hops 1 delivers each message once per node,
queue federation moves messages to where the consumers are, a link outlives a SIGKILL of its
upstream, and links are listed at /api/federation-links. Needs no RabbitMQ."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.harness import (
    HOST,
    REPO_ROOT,
    Broker,
    finish,
    start_broker,
    wait_until,
)
from tests.integration.management_helpers import HTTP, start_with_management

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def ctl(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "ctl", "--control-socket",
         str(broker.control_dir / "control.sock"), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)


def url(port: int) -> str:
    return f"amqp://guest:guest@{HOST}:{port}/%2f"


def federate(downstream: Broker, upstream_port: int, name: str = "up", pattern: str = "^fed",
             apply_to: str = "exchanges", **keys: Any) -> None:
    """``upstream_port``'s broker as an upstream of ``downstream``, for objects matching
    ``pattern`` (set_parameter and set_policy through ``shoal ctl``)."""
    value = {"uri": url(upstream_port), "reconnect-delay": 1, **keys}
    done = ctl(downstream, "set_parameter", "federation-upstream", name, json.dumps(value))
    assert done.returncode == 0, done.stderr
    done = ctl(downstream, "set_policy", f"fed-{name}", pattern,
               json.dumps({"federation-upstream": name}), "--apply-to", apply_to)
    assert done.returncode == 0, done.stderr


def declare(broker: Broker, exchange: str, queue: str | None = None, key: str = "#") -> None:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True)
        if queue is not None:
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, exchange, key)
    finally:
        conn.close()


def publish(broker: Broker, exchange: str, bodies: list[bytes], key: str = "k") -> None:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish(exchange, key, body, PERSISTENT)
    finally:
        conn.close()


def drain(broker: Broker, queue: str, idle: float = 1.5, limit: float = 60.0) -> list[bytes]:
    """Every message of ``queue`` (consumed and acked) until none came for ``idle`` seconds."""
    conn = broker.connect()
    got: list[bytes] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        end = time.monotonic() + limit
        for method, _, body in ch.consume(queue, inactivity_timeout=idle):
            if body is None or method is None or time.monotonic() > end:
                break
            got.append(body)
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
    finally:
        conn.close()
    return got


def depth(broker: Broker, queue: str) -> int:
    conn = broker.connect()
    try:
        return int(conn.channel().queue_declare(queue, durable=True).method.message_count)
    finally:
        conn.close()


def links(broker: Broker) -> list[dict[str, Any]]:
    done = ctl(broker, "federation_status", "--formatter", "json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout or "[]"))


def running(broker: Broker, count: int = 1) -> bool:
    return sum(row["status"] == "running" for row in links(broker)) >= count


def bound_upstream(broker: Broker, exchange: str) -> list[str]:
    """The routing keys ``exchange`` is bound with to federation exchanges on ``broker``."""
    done = ctl(broker, "list_bindings", "source_name", "destination_name", "routing_key",
               "--formatter", "json")
    assert done.returncode == 0, done.stderr
    return sorted(row["routing_key"] for row in json.loads(done.stdout)
                  if row["source_name"] == exchange
                  and row["destination_name"].startswith("federation: "))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Broker, Broker, int]]:
    up = start_broker(tmp_path / "up")
    down, http_port = start_with_management(tmp_path / "down")
    try:
        yield up, down, http_port
    finally:
        finish(down)
        finish(up)


@pytest.mark.deadline(120)
def test_exchange_federation_follows_the_downstream_bindings(
        pair: tuple[Broker, Broker, int]) -> None:
    """A federated exchange receives what is published upstream for its own bindings; a new
    binding downstream propagates, an unbind stops it (exchange.bind / unbind upstream)."""
    up, down, http_port = pair
    declare(up, "fed.x")
    declare(down, "fed.x", "fed-q", "a.*")
    federate(down, up.port)
    wait_until(lambda: running(down), 30, "the link runs")
    wait_until(lambda: bound_upstream(up, "fed.x") == ["a.*"], 30, "the binding propagates")
    publish(up, "fed.x", [b"a1", b"a2"], key="a.1")
    publish(up, "fed.x", [b"b1"], key="b.1")  # no binding downstream for it
    assert sorted(drain(down, "fed-q")) == [b"a1", b"a2"]
    # a new binding downstream propagates
    conn = down.connect()
    conn.channel().queue_bind("fed-q", "fed.x", "b.#")
    wait_until(lambda: bound_upstream(up, "fed.x") == ["a.*", "b.#"], 30, "the new binding")
    publish(up, "fed.x", [b"b2"], key="b.2")
    assert drain(down, "fed-q") == [b"b2"]
    # and unbinding stops it
    conn.channel().queue_unbind("fed-q", "fed.x", "b.#")
    conn.close()
    wait_until(lambda: bound_upstream(up, "fed.x") == ["a.*"], 30, "the unbind propagates")
    publish(up, "fed.x", [b"b3"], key="b.3")
    publish(up, "fed.x", [b"a3"], key="a.3")
    got = drain(down, "fed-q")
    assert got == [b"a3"]
    # the status row, RabbitMQ's shape, over HTTP
    rows = HTTP(http_port).get("/api/federation-links")
    assert len(rows) == 1
    row = rows[0]
    assert row["type"] == "exchange" and row["exchange"] == "fed.x" and row["upstream"] == "up"
    assert row["upstream_exchange"] == "fed.x" and row["status"] == "running"
    assert row["uri"] == f"amqp://{HOST}:{up.port}/%2f" and "guest" not in row["uri"]
    assert row["vhost"] == "/" and row["local_connection"]
    assert HTTP(http_port).get("/api/federation-links/%2f") == rows
