"""The management HTTP API with plain HTTP (urllib) and pika: RabbitMQ 3.x's shapes and codes."""

from __future__ import annotations

import time
import urllib.parse

import pika
import pika.exceptions
import pytest

from tests.integration.harness import Broker, close_quietly, wait_until
from tests.integration.management_helpers import HTTP, managed

__all__ = ["managed"]

Q = urllib.parse.quote


def test_overview_whoami_nodes_vhosts_users_permissions(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    o = http.get("/api/overview")
    for key in ("management_version", "rabbitmq_version", "cluster_name", "node", "listeners",
                "object_totals", "queue_totals", "message_stats", "exchange_types"):
        assert key in o, key
    assert {"connections", "channels", "exchanges", "queues", "consumers"} <= set(o["object_totals"])
    assert "rate" in o["queue_totals"]["messages_details"]
    assert http.get("/api/whoami") == {"name": "guest", "tags": ["administrator"]}
    (node,) = http.get("/api/nodes")
    assert node["name"] == o["node"] and node["running"] is True
    (vhost,) = http.get("/api/vhosts")
    assert vhost["name"] == "/" and "messages" in vhost
    assert http.get("/api/vhosts/%2F")["name"] == "/"
    (user,) = http.get("/api/users")
    assert user["name"] == "guest" and user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert http.get("/api/permissions") == [
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]
    assert http.get("/api/extensions") == []


def test_bad_credentials_are_401_with_the_realm(managed: tuple[Broker, int]) -> None:
    _, port = managed
    status, headers, body = HTTP(port, "guest", "wrong").request("GET", "/api/overview")
    assert status == 401 and body["error"] == "not_authorised"
    assert headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_errors_and_unknown_objects(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    status, _, body = http.request("GET", "/api/queues/%2F/no-such-queue")
    assert status == 404 and body == {"error": "Object Not Found", "reason": "Not Found"}
    assert http.request("GET", "/api/queues/other-vhost")[0] == 404
    status, _, body = http.request("GET", "/api/queues?page=99")
    assert status == 400 and body["error"] == "bad_request"


def test_queue_exchange_binding_lifecycle_publish_get_purge(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    assert http.request("PUT", "/api/exchanges/%2F/mx", {"type": "topic", "durable": False})[0] == 201
    assert http.request("PUT", "/api/exchanges/%2F/mx", {"type": "topic", "durable": False})[0] == 204
    assert http.request("PUT", "/api/queues/%2F/mq", {"durable": False, "arguments": {"x-max-length": 10}})[0] == 201
    status, headers, _ = http.request("POST", "/api/bindings/%2F/e/mx/q/mq", {"routing_key": "a.*"})
    assert status == 201 and headers["location"] == "a.%252A"  # RabbitMQ's quote_binding
    x = http.get("/api/exchanges/%2F/mx")
    assert x["type"] == "topic" and x["durable"] is False and x["vhost"] == "/"
    q = http.get("/api/queues/%2F/mq")
    assert q["arguments"] == {"x-max-length": 10} and q["messages"] == 0 and q["exclusive"] is False
    bindings = http.get("/api/queues/%2F/mq/bindings")
    assert [(b["source"], b["routing_key"], b["properties_key"]) for b in bindings] == [
        ("", "mq", "mq"), ("mx", "a.*", "a.%252A")]
    assert [b["destination"] for b in http.get("/api/exchanges/%2F/mx/bindings/source")] == ["mq"]
    assert http.get("/api/bindings/%2F/e/mx/q/mq/a.%252A")["routing_key"] == "a.*"

    publish = {"routing_key": "a.b", "payload": "hi", "payload_encoding": "string",
               "properties": {"content_type": "text/plain", "headers": {"h": 1}}}
    status, _, body = http.request("POST", "/api/exchanges/%2F/mx/publish", publish)
    assert (status, body) == (200, {"routed": True})
    status, _, body = http.request("POST", "/api/exchanges/%2F/mx/publish", dict(publish, routing_key="z"))
    assert (status, body) == (200, {"routed": False})
    status, _, body = http.request("POST", "/api/exchanges/%2F/amq.default/publish",
                                   {"routing_key": "mq", "payload": "/wA=", "payload_encoding": "base64",
                                    "properties": {}})
    assert (status, body) == (200, {"routed": True})
    wait_until(lambda: http.get("/api/queues/%2F/mq")["messages"] == 2, 10.0, "two messages")

    got = http.request("POST", "/api/queues/%2F/mq/get",
                       {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 1})[2]
    assert len(got) == 2
    assert got[0]["payload"] == "h" and got[0]["payload_bytes"] == 2
    assert got[0]["properties"] == {"content_type": "text/plain", "headers": {"h": 1}}
    assert got[1]["properties"] == [] and got[1]["payload_encoding"] == "base64"
    assert {"exchange", "routing_key", "message_count", "redelivered"} <= set(got[0])
    got = http.request("POST", "/api/queues/%2F/mq/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                          "encoding": "base64"})[2]
    assert got[0]["redelivered"] is True and got[0]["payload_encoding"] == "base64"
    assert http.request("DELETE", "/api/queues/%2F/mq?if-empty=true")[0] == 400
    assert http.request("DELETE", "/api/queues/%2F/mq/contents")[0] == 204
    wait_until(lambda: http.get("/api/queues/%2F/mq")["messages"] == 0, 10.0, "purged")

    assert http.request("DELETE", "/api/bindings/%2F/e/mx/q/mq/a.%252A")[0] == 204
    assert http.request("GET", "/api/bindings/%2F/e/mx/q/mq/a.%252A")[0] == 404
    assert http.request("DELETE", "/api/exchanges/%2F/mx?if-unused=true")[0] == 204
    assert http.request("DELETE", "/api/queues/%2F/mq")[0] == 204
    assert http.request("GET", "/api/queues/%2F/mq")[0] == 404


def test_pagination_filter_sort_columns(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    for i in range(7):
        http.request("PUT", f"/api/queues/%2F/page-{i}", {"durable": False})
    page = http.get("/api/queues?page=2&page_size=3&name=page-&sort=name&sort_reverse=true")
    assert page["filtered_count"] == 7 and page["page_count"] == 3 and page["item_count"] == 3
    assert [q["name"] for q in page["items"]] == ["page-3", "page-2", "page-1"]
    rows = http.get("/api/queues/%2F?columns=name,messages&name=^page-[01]$&use_regex=true&page=1")
    assert rows["items"] == [{"name": "page-0", "messages": 0}, {"name": "page-1", "messages": 0}]
    for i in range(7):
        http.request("DELETE", f"/api/queues/%2F/page-{i}")


def test_connections_channels_consumers_and_forced_close(managed: tuple[Broker, int]) -> None:
    broker, port = managed
    http = HTTP(port)
    conn = broker.connect()
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_consume(q, lambda *a: None, consumer_tag="ctag-x")
        connections = wait_until(lambda: http.get("/api/connections") or None, 10.0, "a connection")
        (c,) = connections
        assert " -> " in c["name"] and c["user"] == "guest" and c["protocol"] == "AMQP 0-9-1"
        assert c["peer_host"] == "127.0.0.1" and c["port"] == broker.port
        name = Q(c["name"], safe="")
        assert http.get(f"/api/connections/{name}")["name"] == c["name"]
        (consumer,) = wait_until(lambda: http.get("/api/consumers") or None, 10.0, "a consumer")
        assert consumer["consumer_tag"] == "ctag-x" and consumer["queue"] == {"name": q, "vhost": "/"}
        assert consumer["channel_details"]["connection_name"] == c["name"]
        chans = http.get(f"/api/connections/{name}/channels")
        assert chans and chans[0]["number"] == 1 and chans[0]["consumer_count"] == 1
        queue = http.get(f"/api/queues/%2F/{Q(q, safe='')}")
        assert queue["exclusive"] is True and queue["owner_pid_details"]["name"] == c["name"]
        status, _, _ = http.request("DELETE", f"/api/connections/{name}",
                                    headers={"X-Reason": "maintenance"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(0.2)
        assert closed.value.reply_code == 320
        assert "maintenance" in closed.value.reply_text
        wait_until(lambda: http.get("/api/connections") == [], 10.0, "no connection left")
    finally:
        close_quietly(conn)


def test_definitions_export_and_import(managed: tuple[Broker, int]) -> None:
    _, port = managed
    http = HTTP(port)
    http.request("PUT", "/api/exchanges/%2F/dx", {"type": "fanout", "durable": True})
    http.request("PUT", "/api/queues/%2F/dq", {"durable": True})
    http.request("POST", "/api/bindings/%2F/e/dx/q/dq", {"routing_key": "k"})
    d = http.get("/api/definitions")
    assert {"users", "vhosts", "permissions", "queues", "exchanges", "bindings"} <= set(d)
    assert not [x for x in d["exchanges"] if x["name"] == "" or x["name"].startswith("amq.")]
    assert not [b for b in d["bindings"] if b["source"] == ""]
    assert {"source": "dx", "vhost": "/", "destination": "dq", "destination_type": "queue",
            "routing_key": "k", "arguments": {}} in d["bindings"]
    http.request("DELETE", "/api/exchanges/%2F/dx")
    http.request("DELETE", "/api/queues/%2F/dq")
    assert http.request("POST", "/api/definitions", d)[0] in (201, 204)
    assert http.get("/api/queues/%2F/dq")["durable"] is True
    assert [b["routing_key"] for b in http.get("/api/exchanges/%2F/dx/bindings/source")] == ["k"]
    http.request("DELETE", "/api/exchanges/%2F/dx")
    http.request("DELETE", "/api/queues/%2F/dq")


def test_health_checks_and_aliveness(managed: tuple[Broker, int]) -> None:
    broker, port = managed
    http = HTTP(port)
    assert http.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert http.get("/api/health/checks/alarms") == {"status": "ok"}
    assert http.get("/api/health/checks/local-alarms") == {"status": "ok"}
    assert http.get(f"/api/health/checks/port-listener/{broker.port}") == {"status": "ok", "port": broker.port}
    status, _, body = http.request("GET", "/api/health/checks/port-listener/1")
    assert status == 503 and body["status"] == "failed"
    assert http.get("/api/health/checks/virtual-hosts") == {"status": "ok"}


def test_amqpstorm_management_client(managed: tuple[Broker, int]) -> None:
    pytest.importorskip("requests", reason="amqpstorm.management needs requests (the test extra has it)")
    from amqpstorm.management import ManagementApi

    _, port = managed
    api = ManagementApi(f"http://127.0.0.1:{port}", "guest", "guest", timeout=30)
    assert api.overview()["node"].startswith("shoal@")
    api.queue.declare("storm-q", durable=False)
    assert api.queue.get("storm-q")["name"] == "storm-q"
    assert "storm-q" in [q["name"] for q in api.queue.list()]
    api.basic.publish("body", "storm-q")
    wait_until(lambda: api.queue.get("storm-q")["messages"] == 1, 10.0, "one message")
    (message,) = api.basic.get("storm-q", requeue=False)
    assert message.body == "body"
    assert api.aliveness_test() == {"status": "ok"}
    api.queue.delete("storm-q")


def test_status_line_has_the_reason_phrase(managed: tuple[Broker, int]) -> None:
    """RabbitMQ writes ``HTTP/1.1 401 Unauthorized``; clients quote the phrase (requests:
    ``401 Client Error: Unauthorized``, which amqpstorm's management tests match)."""
    import http.client

    _, port = managed
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/api/overview")
        response = conn.getresponse()
        response.read()
        assert (response.status, response.reason) == (401, "Unauthorized")
    finally:
        conn.close()


def test_cluster_name_and_old_node_healthcheck(managed: tuple[Broker, int]) -> None:
    """GET /api/cluster-name and RabbitMQ 3.x's /api/healthchecks/node[/NODE] (amqpstorm's
    api.cluster_name() and api.healthchecks.get())."""
    _, port = managed
    http = HTTP(port)
    node = http.get("/api/overview")["node"]
    assert http.get("/api/cluster-name") == {"name": node}
    assert http.get("/api/healthchecks/node") == {"status": "ok"}
    assert http.get(f"/api/healthchecks/node/{Q(node, safe='')}") == {"status": "ok"}
    assert http.request("GET", "/api/healthchecks/node/nobody@nowhere")[0] == 404


def test_users_bulk_delete(managed: tuple[Broker, int]) -> None:
    """POST /api/users/bulk-delete: deletes in order; an unknown name is 400 no_such_user."""
    _, port = managed
    http = HTTP(port)
    for name in ("bulk-a", "bulk-b"):
        assert http.request("PUT", f"/api/users/{name}", {"password": "p", "tags": ""})[0] == 201
    assert http.request("POST", "/api/users/bulk-delete", {"users": ["bulk-a"]})[0] == 204
    assert http.request("GET", "/api/users/bulk-a")[0] == 404
    status, _, body = http.request("POST", "/api/users/bulk-delete", {"users": ["bulk-b", "nobody"]})
    assert (status, body["reason"]) == (400, ["no_such_user", "nobody"])
    assert http.request("GET", "/api/users/bulk-b")[0] == 404
    status, _, body = http.request("POST", "/api/users/bulk-delete", {})
    assert status == 400 and body["error"] == "bad_request"


def test_idle_since_for_an_idle_queue_only(managed: tuple[Broker, int]) -> None:
    """RabbitMQ writes ``idle_since`` (``2024-05-01T12:00:00.123+00:00``) for a queue whose
    counters stand still, and leaves it out otherwise (Flower's broker page shows it); never
    null. Channels carry ``user_who_performed_action`` as RabbitMQ's do."""
    import re

    broker, port = managed
    http = HTTP(port)
    assert http.request("PUT", "/api/queues/%2F/idle-q", {"durable": False})[0] == 201

    def idle() -> object:
        q = http.get("/api/queues/%2F/idle-q")
        assert q.get("idle_since", "") is not None
        return q.get("idle_since")

    wait_until(lambda: idle() is not None, timeout=20)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", str(idle()))
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = conn.channel()
        channel.basic_consume("idle-q", lambda *a: None)
        wait_until(lambda: len(http.get("/api/channels")) > 0, timeout=20)
        assert all(c["user_who_performed_action"] == "guest" for c in http.get("/api/channels"))
    finally:
        close_quietly(conn)
    assert http.request("DELETE", "/api/queues/%2F/idle-q")[0] == 204


def test_client_properties_and_idle_channels(managed: tuple[Broker, int]) -> None:
    """RabbitMQ 3.10 lists the client's properties and every open channel, idle ones too."""
    broker, port = managed
    http = HTTP(port)
    conn = broker.connect(client_properties={"connection_name": "mgmt-test"})
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)

        def listed() -> list[dict] | None:
            conns = http.get("/api/connections")
            return conns if conns and conns[0].get("client_properties", {}).get("product") else None

        (c,) = wait_until(listed, 10.0, "the connection with its client properties")
        assert c["client_properties"]["product"] == "Pika Python Client Library"
        assert c["client_properties"]["connection_name"] == "mgmt-test"
        assert isinstance(c["client_properties"]["capabilities"], dict)
        assert c["user_provided_name"] == "mgmt-test"
        name = Q(c["name"], safe="")
        assert http.get(f"/api/connections/{name}")["user_provided_name"] == "mgmt-test"

        def idle_channel() -> list[dict] | None:
            chans = http.get("/api/channels")
            return chans if chans and chans[0]["prefetch_count"] == 7 else None

        (chan,) = wait_until(idle_channel, 10.0, "the idle channel with its prefetch count")
        assert chan["number"] == ch.channel_number and chan["consumer_count"] == 0
        assert chan["name"] == f"{c['name']} ({ch.channel_number})"
        assert chan["connection_details"]["name"] == c["name"] and chan["state"] == "running"
        assert chan["confirm"] is False and chan["transactional"] is False
        (same,) = http.get(f"/api/connections/{name}/channels")
        assert same["number"] == ch.channel_number and same["prefetch_count"] == 7
    finally:
        close_quietly(conn)
