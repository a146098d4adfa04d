"""Dynamic shovels (issue 39) between two Shoal brokers on this host: declared over the management
API and with ``shoal ctl``, listed with their state at /api/shovels, at-least-once across a
SIGKILL of the destination, stopped with their parameter, restarted with their source broker,
and deleted after ``src-delete-after`` ``queue-length``. Needs no RabbitMQ."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

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


def publish(broker: Broker, queue: str, bodies: list[bytes]) -> None:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, PERSISTENT)
    finally:
        conn.close()


def drain(broker: Broker, queue: str, idle: float = 1.5, limit: float = 60.0) -> list[bytes]:
    """Every message of ``queue`` (consumed and acked) until none came for ``idle`` seconds."""
    conn = broker.connect()
    got: list[bytes] = []
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
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


def held(broker: Broker, queue: str) -> int:
    """The queue's messages, ready and delivered but not acked (rabbitmqctl's ``messages``)."""
    listed = ctl(broker, "-q", "list_queues", "name", "messages", "--no-table-headers")
    counts = dict(line.split("\t") for line in listed.stdout.splitlines() if "\t" in line)
    return int(counts[queue])


@contextlib.contextmanager
def state_on_failure(src: Broker, dst: Broker) -> Iterator[None]:
    """Print what both brokers hold (queues, consumers, channels) when the block fails, for
    its report: where a shovel stopped."""
    try:
        yield
    except AssertionError:
        for name, broker in (("source", src), ("destination", dst)):
            for args in (("list_queues", "name", "messages", "messages_ready",
                          "messages_unacknowledged", "consumers"), ("list_consumers",),
                         ("list_channels",)):
                out = ctl(broker, *args)
                print(f"{name} {args[0]}:\n{out.stdout}{out.stderr}")
        raise


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Broker, int, Broker]]:
    src, http_port = start_with_management(tmp_path / "src")
    dst = start_broker(tmp_path / "dst")
    try:
        yield src, http_port, dst
    finally:
        finish(src)
        finish(dst)


def shovels(http: HTTP) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in http.get("/api/shovels")}


def running(http: HTTP, name: str) -> bool:
    return shovels(http).get(name, {}).get("state") == "running"


@pytest.mark.deadline(120)
def test_shovel_over_http_moves_every_message_once_and_stops_with_its_parameter(
        pair: tuple[Broker, int, Broker]) -> None:
    src, http_port, dst = pair
    http = HTTP(http_port)
    bodies = [f"m{i}".encode() for i in range(3000)]
    publish(src, "sh-in", bodies)
    status, _, answer = http.request("PUT", "/api/parameters/shovel/%2f/move", {"value": {
        "src-uri": "amqp://", "src-queue": "sh-in", "dest-uri": url(dst.port),
        "dest-queue": "sh-out", "reconnect-delay": 1}})
    assert status == 201, answer
    wait_until(lambda: running(http, "move"), 30, "the shovel runs")
    row = shovels(http)["move"]
    assert row["type"] == "dynamic" and row["vhost"] == "/" and row["src_queue"] == "sh-in"
    assert row["dest_uri"] == f"amqp://guest:***@{HOST}:{dst.port}/%2f"
    wait_until(lambda: depth(src, "sh-in") == 0, 60, "the source queue is drained")
    got = drain(dst, "sh-out")
    assert Counter(got) == Counter(bodies)  # every message once, none lost, none twice
    param = http.get("/api/parameters/shovel/%2f/move")
    assert param["component"] == "shovel" and param["value"]["src-queue"] == "sh-in"
    assert [p["name"] for p in http.get("/api/parameters")] == ["move"]
    # RabbitMQ's validation: 400 with the reason
    status, _, answer = http.request("PUT", "/api/parameters/shovel/%2f/bad", {"value": {
        "src-uri": "amqp://", "dest-uri": "amqp://"}})
    assert status == 400 and "Must specify 'src-exchange' or 'src-queue'" in answer["reason"]
    exported = http.get("/api/definitions")["parameters"][0]
    assert exported == {"value": param["value"], "vhost": "/", "component": "shovel",
                        "name": "move"}
    # deleting the parameter stops the shovel
    status, _, _ = http.request("DELETE", "/api/parameters/shovel/%2f/move")
    assert status == 204
    assert "move" not in shovels(http)
    time.sleep(1.0)
    publish(src, "sh-in", [b"after"])
    time.sleep(2.0)
    assert depth(src, "sh-in") == 1
    assert http.get("/api/parameters") == []
    # definitions: exported with the parameter, imported back (then it runs again)
    status, _, _ = http.request("POST", "/api/definitions", {"parameters": [exported]})
    assert status in (200, 201, 204)
    assert [p["name"] for p in http.get("/api/parameters/shovel/%2f")] == ["move"]
    wait_until(lambda: depth(src, "sh-in") == 0, 30, "the imported shovel runs")


@pytest.mark.deadline(240)
def test_a_killed_destination_loses_no_confirmed_message(tmp_path: Path) -> None:
    src = start_broker(tmp_path / "src")
    dst_port = free_port()
    dst = Broker(tmp_path / "dst", port=dst_port)
    try:
        total = 20000
        bodies = [f"k{i}".encode() for i in range(total)]
        publish(src, "kill-in", bodies[: total // 2])
        value = {"src-uri": url(src.port), "src-queue": "kill-in", "dest-uri": url(dst_port),
                 "dest-queue": "kill-out", "reconnect-delay": 1, "src-prefetch-count": 1000}
        done = ctl(src, "set_parameter", "shovel", "killer", json.dumps(value))
        assert done.returncode == 0, done.stderr
        listed = ctl(src, "list_parameters")
        assert "killer" in listed.stdout and "kill-in" in listed.stdout
        wait_until(lambda: depth(dst, "kill-out") > 1000, 60, "messages reach the destination")
        publish(src, "kill-in", bodies[total // 2:])  # more while the link is down soon
        kill_whole_broker(dst)
        dst.stop()
        # the link is down: terminated, with the reason, until the destination is back
        wait_until(lambda: "terminated" in ctl(src, "shovel_status").stdout, 30,
                   "the shovel shows terminated")
        (tmp_path / "dst" / "ready.json").unlink(missing_ok=True)  # the killed one's
        dst = Broker(tmp_path / "dst", port=dst_port)  # same port, same data directory
        wait_until(lambda: depth(src, "kill-in") == 0, 120, "the source queue is drained")
        got = drain(dst, "kill-out", idle=3.0, limit=120)
        counts = Counter(got)
        missing = set(bodies) - set(counts)
        duplicates = sum(n - 1 for n in counts.values())
        print(f"{len(got)} received, {duplicates} duplicates, {len(missing)} missing")
        assert not missing  # at-least-once: every message confirmed to the source arrives
        assert set(counts) <= set(bodies)
    finally:
        finish(src)
        finish(dst)


@pytest.mark.deadline(240)
def test_source_restart_restarts_the_shovel_and_queue_length_deletes_itself(
        tmp_path: Path) -> None:
    src_port = free_port()
    src = Broker(tmp_path / "src", port=src_port)
    dst = start_broker(tmp_path / "dst")
    try:
        value = {"src-uri": "amqp://", "src-queue": "rs-in", "dest-uri": url(dst.port),
                 "dest-queue": "rs-out", "reconnect-delay": 1}
        assert ctl(src, "set_parameter", "shovel", "keeper", json.dumps(value)).returncode == 0
        publish(src, "rs-in", [b"before"])
        wait_until(lambda: depth(dst, "rs-out") == 1, 30, "the first message moves")
        # and its ack is back at the source: stopped before, the message is unacked at the
        # stop, so it is restored and forwarded again after the restart (at-least-once: the
        # destination then holds three, and the wait for two below can miss it).
        wait_until(lambda: held(src, "rs-in") == 0, 30, "the source has the shovel's ack")
        src.stop()
        src = Broker(tmp_path / "src", port=src_port)
        assert "keeper" in ctl(src, "list_parameters").stdout
        publish(src, "rs-in", [b"after"])
        with state_on_failure(src, dst):
            wait_until(lambda: depth(dst, "rs-out") == 2, 60, "the restarted shovel moves it")
        assert ctl(src, "clear_parameter", "shovel", "keeper").returncode == 0
        # src-delete-after queue-length: what is there when it starts, then it deletes itself
        publish(src, "len-in", [f"l{i}".encode() for i in range(50)])
        once = {"src-uri": "amqp://", "src-queue": "len-in", "dest-uri": url(dst.port),
                "dest-queue": "len-out", "src-delete-after": "queue-length",
                "src-prefetch-count": 7}
        assert ctl(src, "set_parameter", "shovel", "once", json.dumps(once)).returncode == 0
        wait_until(lambda: "once" not in ctl(src, "list_parameters").stdout, 60,
                   "the shovel deletes itself")
        assert depth(dst, "len-out") == 50
        publish(src, "len-in", [b"later"])
        time.sleep(1.5)
        assert depth(src, "len-in") == 1
        bad = ctl(src, "set_parameter", "shovel", "bad", json.dumps({**once, "ack-mode": "x"}))
        assert bad.returncode != 0 and "ack-mode" in bad.stderr
    finally:
        finish(src)
        finish(dst)


@pytest.mark.deadline(120)
def test_a_clean_stop_stops_the_shovels_before_the_workers_close_their_clients(
        tmp_path: Path) -> None:
    """As RabbitMQ stops its shovel plugin before its queues: a message a client holds unacked
    at the stop goes back to the queue when the worker closes that client, and no shovel is
    left consuming to forward it with an ack that would never be stored (it would come back
    after the restart and be forwarded twice)."""
    src_port = free_port()
    src = Broker(tmp_path / "src", port=src_port)
    dst = start_broker(tmp_path / "dst")
    holder = None
    try:
        publish(src, "so-in", [b"held"])
        holder = pika.BlockingConnection(pika.ConnectionParameters(  # not closed by src.stop()
            HOST, src_port, client_properties={"connection_name": "holder"}))
        ch = holder.channel()
        got: list[bytes] = []
        ch.basic_consume("so-in", lambda _c, _m, _p, body: got.append(body))
        wait_until(lambda: bool(holder.process_data_events(0.05)) or got == [b"held"], 10,
                   "the holder has the message")
        value = {"src-uri": "amqp://", "src-queue": "so-in", "dest-uri": url(dst.port),
                 "dest-queue": "so-out"}
        assert ctl(src, "set_parameter", "shovel", "stopper", json.dumps(value)).returncode == 0
        wait_until(lambda: "running" in ctl(src, "shovel_status").stdout, 30, "the shovel runs")
        src.stop()
        lines = (tmp_path / "src" / "broker.log").read_text().splitlines()
        [label] = {line.split("connection ", 1)[1].split(" ", 1)[0] for line in lines
                   if "client-provided name: holder" in line}
        stopped = next(i for i, line in enumerate(lines) if "the links process stopped" in line)
        closed = next(i for i, line in enumerate(lines)
                      if f"closing AMQP connection {label} " in line)
        assert stopped < closed  # the shovel gone before the holder's message went back
        assert depth(dst, "so-out") == 0
        src = Broker(tmp_path / "src", port=src_port)  # the message comes back, once
        wait_until(lambda: depth(dst, "so-out") == 1, 30, "the restarted shovel moves it")
        time.sleep(1.0)
        assert drain(dst, "so-out") == [b"held"]
    finally:
        if holder is not None:
            with contextlib.suppress(Exception):
                holder.close()
        finish(src)
        finish(dst)


@pytest.mark.deadline(120)
def test_exchange_to_exchange_with_forward_headers_and_properties(
        pair: tuple[Broker, int, Broker]) -> None:
    src, http_port, dst = pair
    http = HTTP(http_port)
    conn = dst.connect()
    ch = conn.channel()
    ch.exchange_declare("x-in", "topic", durable=True)
    ch.queue_declare("x-out", durable=True)
    ch.queue_bind("x-out", "x-in", "audit.#")
    conn.close()
    conn = src.connect()
    ch = conn.channel()
    ch.exchange_declare("x-src", "topic", durable=True)
    conn.close()
    status, _, answer = http.request("PUT", "/api/parameters/shovel/%2f/xx", {"value": {
        "src-uri": "amqp://", "src-exchange": "x-src", "src-exchange-key": "audit.*",
        "dest-uri": [url(dst.port)], "dest-exchange": "x-in", "ack-mode": "on-publish",
        "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
        "dest-publish-properties": {"delivery_mode": 2, "app_id": "shovelled"}}})
    assert status == 201, answer
    wait_until(lambda: running(http, "xx"), 30, "the shovel runs")
    conn = src.connect()
    ch = conn.channel()
    ch.basic_publish("x-src", "audit.login", b"one", pika.BasicProperties(headers={"k": "v"}))
    ch.basic_publish("x-src", "other.login", b"not bound")
    conn.close()
    wait_until(lambda: depth(dst, "x-out") == 1, 30, "the message crosses")
    conn = dst.connect()
    try:
        method, props, body = conn.channel().basic_get("x-out", auto_ack=True)
    finally:
        conn.close()
    assert body == b"one" and method.routing_key == "audit.login"  # its own key kept
    assert props.delivery_mode == 2 and props.app_id == "shovelled"
    headers = props.headers
    assert headers["k"] == "v" and isinstance(headers["x-shovelled-timestamp"], int)
    [forwarded] = headers["x-shovelled"]
    assert forwarded["shovel-name"] == "xx" and forwarded["src-exchange"] == "x-src"
    assert forwarded["dest-exchange"] == "x-in" and forwarded["shovel-type"] == "dynamic"


@pytest.mark.deadline(120)
def test_the_declared_destination_queue_gets_dest_queue_args(
        pair: tuple[Broker, int, Broker]) -> None:
    """dest-queue-args are the arguments of the destination queue the shovel declares."""
    src, http_port, dst = pair
    http = HTTP(http_port)
    status, _, answer = http.request("PUT", "/api/parameters/shovel/%2f/capped", {"value": {
        "src-uri": "amqp://", "src-queue": "args-in", "src-consumer-args": {"x-priority": 2},
        "dest-uri": url(dst.port), "dest-queue": "args-out",
        "dest-queue-args": {"x-max-length": 2}}})
    assert status == 201, answer
    wait_until(lambda: running(http, "capped"), 30, "the shovel runs")
    publish(src, "args-in", [f"m{i}".encode() for i in range(5)])
    # Drained and acked: every message confirmed by the destination (the shovel's on-confirm ack
    # mode), not only delivered to the shovel (a passive declare's count leaves those out).
    wait_until(lambda: held(src, "args-in") == 0, 30, "every message is moved and acked")
    conn = dst.connect()
    try:
        ch = conn.channel()
        declared = ch.queue_declare("args-out", durable=True, arguments={"x-max-length": 2})
        assert declared.method.message_count == 2  # x-max-length 2 dropped the oldest three
        kept = [ch.basic_get("args-out", auto_ack=True)[2] for _ in range(2)]
    finally:
        conn.close()
    assert kept == [b"m3", b"m4"]
