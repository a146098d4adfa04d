"""Message statistics over the management API and Prometheus, after known traffic from pika.

Publish N to a queue (confirmed), consume and ack M, get one with and one without an ack,
publish mandatory and non-mandatory messages nowhere: the counters are exact, a rate appears
once two samples differ (never asserted against wall time), and /metrics and
/metrics/per-object parse with prometheus_client's parser with RabbitMQ's names, types, labels.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import HOST, Broker, close_quietly, finish, start_broker, wait_until
from tests.integration.management_helpers import HTTP, free_port

N, M = 20, 12


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, int, int]]:
    http_port, prom_port = free_port(), free_port()
    b = start_broker(tmp_path_factory.mktemp("stats"), extra_args=[
        "--management-port", str(http_port), "--prometheus-port", str(prom_port)])
    http = HTTP(http_port)

    def up() -> bool:
        try:
            return http.request("GET", "/api/overview")[0] == 200
        except OSError:
            return False

    wait_until(up, 30.0, "the management API answers")
    try:
        yield b, http_port, prom_port
    finally:
        finish(b)


def traffic(b: Broker) -> None:
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("stats-q")
        ch.confirm_delivery()
        for i in range(N):
            ch.basic_publish("", "stats-q", f"m{i}".encode())
        ch.basic_publish("", "nowhere", b"dropped")
        ch.basic_publish("", "nowhere", b"returned", mandatory=True)  # pika raises on a return
    except pika.exceptions.UnroutableError:
        pass
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=M)  # exactly M delivered: acked after the cancel
        got, last = 0, 0
        for method, _, _ in ch.consume("stats-q", inactivity_timeout=5):
            assert method is not None
            got, last = got + 1, method.delivery_tag
            if got == M:
                break
        ch.cancel()  # the M stay unacknowledged on the channel, none requeued
        ch.basic_ack(last, multiple=True)
        method, _, _ = ch.basic_get("stats-q", auto_ack=False)
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        method, _, _ = ch.basic_get("stats-q", auto_ack=True)
        assert method is not None
    finally:
        close_quietly(conn)


def scrape(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    family = families[name]
    matching = [s.value for s in family.samples
                if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, family.samples)
    return float(matching[0])


def test_counters_rates_and_prometheus_after_known_traffic(broker: tuple[Broker, int, int]) -> None:
    b, http_port, prom_port = broker
    http = HTTP(http_port)
    http.get("/api/overview")  # a first sample, before the traffic
    traffic(b)
    expected = {"publish": N, "deliver": M, "get": 1, "get_no_ack": 1, "ack": M + 1,
                "deliver_no_ack": 0, "redeliver": 0}

    def counted() -> dict[str, Any] | None:
        status, _, q = http.request("GET", "/api/queues/%2F/stats-q")
        if status != 200:  # not in the latest sample yet (it is at most a second old)
            return None
        stats = q.get("message_stats", {})
        ok = all(stats.get(k) == v for k, v in expected.items())
        return q if ok else None

    q = wait_until(counted, 30.0, "the queue's counters")
    stats = q["message_stats"]
    assert stats["deliver_get"] == M + 2
    assert q["messages"] == N - M - 2
    overview = wait_until(lambda: (o := http.get("/api/overview"))["message_stats"].get("ack") == M + 1
                          and o, 30.0, "the overview's counters")
    o_stats = overview["message_stats"]
    assert o_stats["publish"] == N + 2  # two unroutable ones were received too
    assert o_stats["confirm"] == N + 2
    assert (o_stats["drop_unroutable"], o_stats["return_unroutable"]) == (1, 1)
    assert o_stats["deliver"] == M and o_stats["get"] == 1 and o_stats["get_no_ack"] == 1
    for key in ("messages", "messages_ready", "messages_unacknowledged"):
        assert key in overview["queue_totals"] and f"{key}_details" in overview["queue_totals"]
    # A rate: the sampler's samples differ by the traffic (the API refreshes a read older than a
    # second; the first sample above came before the traffic).
    wait_until(lambda: http.get("/api/overview")["message_stats"]["publish_details"]["rate"] > 0,
               30.0, "a publish rate")
    (vhost,) = http.get("/api/vhosts")
    assert vhost["message_stats"]["ack"] == M + 1
    default = http.get("/api/exchanges/%2F/amq.default")
    assert default["message_stats"]["publish_in"] == N + 2
    assert default["message_stats"]["publish_out"] == N

    agg = scrape(prom_port, "/metrics")
    assert agg["rabbitmq_global_messages_received"].type == "counter"
    assert value(agg, "rabbitmq_global_messages_received", protocol="amqp091") == N + 2
    assert value(agg, "rabbitmq_global_messages_confirmed", protocol="amqp091") == N + 2
    assert value(agg, "rabbitmq_global_messages_routed", protocol="amqp091") == N
    assert value(agg, "rabbitmq_global_messages_unroutable_dropped", protocol="amqp091") == 1
    assert value(agg, "rabbitmq_global_messages_unroutable_returned", protocol="amqp091") == 1
    assert value(agg, "rabbitmq_global_messages_acknowledged", protocol="amqp091",
                 queue_type="rabbit_classic_queue") == M + 1
    assert value(agg, "rabbitmq_global_messages_delivered_consume_manual_ack",
                 queue_type="rabbit_classic_queue") == M
    assert value(agg, "rabbitmq_global_messages_delivered_get_auto_ack",
                 queue_type="rabbit_classic_queue") == 1
    assert value(agg, "rabbitmq_global_messages_delivered", queue_type="rabbit_classic_queue") == M + 2
    assert agg["rabbitmq_queue_messages_ready"].type == "gauge"
    assert value(agg, "rabbitmq_queue_messages_ready") == N - M - 2
    assert value(agg, "rabbitmq_queues") >= 1 and agg["rabbitmq_queues"].type == "gauge"
    for name in ("rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers",
                 "rabbitmq_queue_messages_unacked", "rabbitmq_queue_messages"):
        assert agg[name].type == "gauge", name
    assert value(agg, "rabbitmq_process_resident_memory_bytes") > 0
    for alarm in ("memory_used_watermark", "free_disk_space_watermark", "file_descriptor_limit"):
        assert agg[f"rabbitmq_alarms_{alarm}"].type == "unknown"
        assert value(agg, f"rabbitmq_alarms_{alarm}") == 0
    (identity,) = agg["rabbitmq_identity_info"].samples
    assert identity.labels["rabbitmq_endpoint"] == "aggregated"
    assert identity.labels["rabbitmq_node"].startswith("shoal@") and identity.labels["rabbitmq_cluster"]
    (build,) = agg["rabbitmq_build_info"].samples
    assert build.labels["product_name"] == "Shoal" and build.labels["rabbitmq_version"]
    assert "queue" not in agg["rabbitmq_queue_messages_ready"].samples[0].labels

    per = scrape(prom_port, "/metrics/per-object")
    assert value(per, "rabbitmq_queue_messages_ready", vhost="/", queue="stats-q") == N - M - 2
    assert value(per, "rabbitmq_queue_consumers", vhost="/", queue="stats-q") == 0
    assert value(per, "rabbitmq_queue_messages_published", vhost="/", queue="stats-q") == N
    assert value(per, "rabbitmq_queue_messages_acked", vhost="/", queue="stats-q") == M + 1
    assert value(per, "rabbitmq_queue_messages_delivered_ack", vhost="/", queue="stats-q") == M
    assert value(per, "rabbitmq_exchange_messages_published", vhost="/", exchange="") == N + 2
    (identity,) = per["rabbitmq_identity_info"].samples
    assert identity.labels["rabbitmq_endpoint"] == "per-object"

