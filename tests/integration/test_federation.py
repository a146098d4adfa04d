"""Federation (issue 39) between Shoal brokers on this host: exchange federation follows the
downstream's bindings, a three-node ring with max-hops 1 delivers each message once per node,
queue federation moves messages to where the consumers are, a link outlives a SIGKILL of its
upstream and of its downstream, and links are listed at /api/federation-links. Needs no RabbitMQ."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.ctl_helpers import ctl
from tests.integration.harness import (
    HOST,
    Broker,
    finish,
    kill_whole_broker,
    start_broker,
    wait_until,
)
from tests.integration.management_helpers import HTTP, free_port, start_with_management

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def url(port: int) -> str:
    return f"amqp://guest:guest@{HOST}:{port}/%2f"


def federate(downstream: Broker, upstream_port: int, name: str = "up", pattern: str = "^fed",
             apply_to: str = "exchanges", **keys: Any) -> None:
    """``upstream_port``'s broker as an upstream of ``downstream``, for objects matching
    ``pattern`` (set_parameter and set_policy through ``shoal ctl``)."""
    value = {"uri": url(upstream_port), "reconnect-delay": 1,
             **{k.replace("_", "-"): v for k, v in keys.items()}}
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


def link(up: Broker, down: Broker, up_port: int, exchange: str, queue: str) -> None:
    """``exchange`` on both, federated from ``up`` to ``down`` and bound there to ``queue`` with
    ``#``; returns once the binding is upstream."""
    declare(up, exchange)
    declare(down, exchange, queue, "#")
    federate(down, up_port)
    wait_until(lambda: bound_upstream(up, exchange) == ["#"], 30, "the binding propagates")


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


def ring_bindings_propagated(upstream: Broker, max_hops: int) -> bool:
    """The ring's "#" binding reached ``upstream``'s exchange: once with max-hops 1; with more
    hops each binding also goes onwards (carrying its hops), so "#" may be listed more than once."""
    keys = bound_upstream(upstream, "fed.ring")
    return keys == ["#"] if max_hops == 1 else set(keys) == {"#"}


@pytest.mark.deadline(180)
@pytest.mark.parametrize(("max_hops", "received_from"), [
    # each node's own messages and its upstream's, once each, and no further
    pytest.param(1, (0, 1), id="max-hops-1"),
    # hops alone would bring each message back to where it was published; each node's
    # cluster_name in x-received-from stops it there (the upstream exchange drops what would
    # return to its downstream), so every node gets every message once
    pytest.param(3, (0, 1, 2), id="max-hops-3-by-the-nodes-names"),
])
def test_a_ring_delivers_once_per_node(tmp_path: Path, max_hops: int, received_from: tuple[int, ...]) -> None:
    """A -> B -> C -> A (each node's upstream is the one before it): a message published at one
    node reaches the queue bound at every node it may reach (``received_from``: the nodes that
    many places before it in the ring) once, and goes no further."""
    nodes = [start_broker(tmp_path / name) for name in "abc"]
    try:
        for node in nodes:
            declare(node, "fed.ring", "ring-q", "#")
        for i, node in enumerate(nodes):
            federate(node, nodes[i - 1].port, max_hops=max_hops)
        for node in nodes:
            wait_until(lambda node=node: running(node), 30, "each link runs")
        for i in range(3):
            wait_until(lambda i=i: ring_bindings_propagated(nodes[i - 1], max_hops), 30,
                       "each binding propagates")
        for i, node in enumerate(nodes):
            publish(node, "fed.ring", [f"from-{i}-{n}".encode() for n in range(5)])
        for mine, node in enumerate(nodes):
            expected = Counter({f"from-{(mine - back) % 3}-{n}".encode(): 1
                                for back in received_from for n in range(5)})
            assert Counter(drain(node, "ring-q", idle=2.0)) == expected
    finally:
        for node in nodes:
            finish(node)


@pytest.mark.deadline(120)
def test_queue_federation_moves_messages_to_the_consumers(
        pair: tuple[Broker, Broker, int]) -> None:
    """A federated queue with consumers pulls from the upstream queue of its name; without
    consumers it leaves the upstream's messages where they are."""
    up, down, _ = pair
    for broker in (up, down):
        conn = broker.connect()
        conn.channel().queue_declare("fed-work", durable=True)
        conn.close()
    publish(up, "", [f"w{i}".encode() for i in range(20)], key="fed-work")
    federate(down, up.port, apply_to="queues")
    wait_until(lambda: running(down), 30, "the link runs")
    time.sleep(2.0)
    assert depth(up, "fed-work") == 20  # no consumer downstream: nothing moves
    got = drain(down, "fed-work", idle=3.0)
    assert sorted(got) == sorted(f"w{i}".encode() for i in range(20))
    assert depth(up, "fed-work") == 0
    row = links(down)[0]
    assert row["type"] == "queue" and row["queue"] == "fed-work"
    assert row["upstream_queue"] == "fed-work"


@pytest.mark.deadline(240)
def test_a_link_outlives_a_sigkill_of_its_upstream(tmp_path: Path) -> None:
    """on-confirm: every message the upstream confirmed reaches the downstream after the
    upstream is killed and started again (the link reconnects after reconnect-delay)."""
    up_port = free_port()
    up = Broker(tmp_path / "up", port=up_port)
    down = start_broker(tmp_path / "down")
    try:
        link(up, down, up_port, "fed.k", "kill-q")
        bodies = [f"k{i}".encode() for i in range(2000)]
        publish(up, "fed.k", bodies[:1000])
        wait_until(lambda: depth(down, "kill-q") > 0, 30, "messages arrive")
        kill_whole_broker(up)
        up.stop()
        wait_until(lambda: any(r["status"] == "error" for r in links(down)), 30,
                   "the link shows the error")
        (tmp_path / "up" / "ready.json").unlink(missing_ok=True)
        up = Broker(tmp_path / "up", port=up_port)
        publish(up, "fed.k", bodies[1000:])
        wait_until(lambda: running(down), 60, "the link runs again")
        got = Counter(drain(down, "kill-q", idle=3.0, limit=120))
        assert set(bodies) <= set(got)  # none lost (a redelivered one may come twice)
        assert set(got) <= set(bodies)
    finally:
        finish(down)
        finish(up)


def upstream_queue_depth(broker: Broker, exchange: str) -> int:
    """Messages in ``broker``'s ``federation: EXCHANGE -> NODE`` queue (of a link to it)."""
    done = ctl(broker, "list_queues", "name", "messages", "--formatter", "json")
    assert done.returncode == 0, done.stderr
    return sum(int(row["messages"]) for row in json.loads(done.stdout)
               if row["name"].startswith(f"federation: {exchange} -> "))


@pytest.mark.deadline(240)
def test_a_link_outlives_a_sigkill_of_its_downstream(tmp_path: Path) -> None:
    """on-confirm: every message the upstream confirmed, before and while the downstream is
    killed, reaches the downstream once it is started again on its port and data directory (the
    upstream's durable federation queue holds them meanwhile)."""
    up = start_broker(tmp_path / "up")
    down_port = free_port()
    down = Broker(tmp_path / "down", port=down_port)
    try:
        link(up, down, up.port, "fed.d", "down-q")
        bodies = [f"d{i}".encode() for i in range(3000)]
        publish(up, "fed.d", bodies[:1500])
        wait_until(lambda: depth(down, "down-q") > 0, 30, "messages arrive")
        kill_whole_broker(down)
        down.stop()
        publish(up, "fed.d", bodies[1500:])
        assert upstream_queue_depth(up, "fed.d") >= 1500  # kept upstream while the link is down
        (tmp_path / "down" / "ready.json").unlink(missing_ok=True)
        down = Broker(tmp_path / "down", port=down_port)
        wait_until(lambda: running(down), 60, "the link runs again")
        wait_until(lambda: upstream_queue_depth(up, "fed.d") == 0, 60, "the upstream drains")
        got = Counter(drain(down, "down-q", idle=3.0, limit=120))
        assert set(got) == set(bodies)  # none lost, nothing else
        duplicates = sum(got.values()) - len(got)
        assert duplicates <= 1000  # only redeliveries of what was unconfirmed (one prefetch)
    finally:
        finish(down)
        finish(up)


def test_validation_failed_as_rabbitmq(pair: tuple[Broker, Broker, int]) -> None:
    """Upstreams, sets and the policy keys are refused with RabbitMQ's Validation failed."""
    _, _, http_port = pair
    http = HTTP(http_port)
    cases = [
        ("federation-upstream", {"exchange": "x"}, 'Key "uri" not found in u'),
        ("federation-upstream", {"uri": "amqp://", "max-hops": "2"},
         'max-hops should be a number, actually was <<"2">>'),
        ("federation-upstream", {"uri": "amqp://", "ack-mode": "maybe"},
         "ack-mode should be one of"),
        ("federation-upstream", {"uri": "amqp://", "colour": 1}, "Unrecognised terms"),
        ("federation-upstream-set", [{"max-hops": 2}], 'Key "upstream" not found in u'),
    ]
    for component, value, reason in cases:
        status, _, answer = http.request("PUT", f"/api/parameters/{component}/%2f/u",
                                         {"value": value})
        assert status == 400 and "Validation failed" in answer["reason"], answer
        assert reason in answer["reason"], answer
    status, _, answer = http.request("PUT", "/api/policies/%2f/p", {
        "pattern": ".", "definition": {"federation-upstream": "a",
                                       "federation-upstream-set": "b"}})
    assert status == 400
    assert "cannot specify federation-upstream and federation-upstream-set" in answer["reason"]
    ok = {"uri": ["amqp://", "amqp://localhost"], "max-hops": 2, "trust-user-id": True}
    status, _, _ = http.request("PUT", "/api/parameters/federation-upstream/%2f/u",
                                {"value": ok})
    assert status == 201
    exported = http.get("/api/definitions")["parameters"]
    assert exported == [{"value": ok, "vhost": "/", "component": "federation-upstream",
                         "name": "u"}]
