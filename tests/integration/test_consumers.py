"""Consumers beyond the basics: exclusive consumers, broker-initiated cancel,
browsers (non-acquiring consumers), a channel's consumers sharing a global prefetch, and
channel misuse errors."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame, header

from tests.integration.harness import Broker
from tests.integration.pika_helpers import Names, pump, pump_until


def test_exclusive_consumer_conflict_is_403(shared_broker: Broker, names: Names) -> None:
    """A second consumer on a queue with an exclusive consumer (or an exclusive
    consumer on a queue in use) gets 403 ACCESS_REFUSED, as RabbitMQ replies."""
    connection = shared_broker.connect()
    queue = names("q")
    first = connection.channel()
    first.queue_declare(queue)
    first.basic_consume(queue, lambda *a: None, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        connection.channel().basic_consume(queue, lambda *a: None)
    assert caught.value.reply_code == 403

    other = names("other")
    second = connection.channel()
    second.queue_declare(other)
    second.basic_consume(other, lambda *a: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        connection.channel().basic_consume(other, lambda *a: None, exclusive=True)
    assert caught.value.reply_code == 403
    assert connection.is_open


def test_queue_deletion_cancels_consumers_of_other_connections(shared_broker: Broker, names: Names) -> None:
    """Deleting a queue sends basic.cancel to its consumers (consumer_cancel_notify)."""
    queue = names("q")
    consumer_conn, admin_conn = shared_broker.connect(), shared_broker.connect()
    consumer = consumer_conn.channel()
    consumer.queue_declare(queue)
    cancelled: list[object] = []
    consumer.add_on_cancel_callback(lambda method: cancelled.append(method))
    tag = consumer.basic_consume(queue, lambda *a: None)
    admin_conn.channel().queue_delete(queue)
    pump_until([consumer_conn], lambda: cancelled, what="basic.cancel from the broker")
    assert cancelled[0].method.consumer_tag == tag
    assert consumer_conn.is_open


def test_browser_sees_messages_without_taking_them(shared_broker: Broker, names: Names) -> None:
    """A consumer with x-browse=true is non-acquiring: it is sent every message,
    and the messages stay on the queue for acquiring consumers."""
    queue = names("q")
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    seen: list[bytes] = []
    channel.basic_consume(queue, lambda ch, m, p, body: seen.append(body), auto_ack=True,
                          arguments={"x-browse": True})
    pump_until([connection], lambda: len(seen) >= 5, what="the browser to see five messages")
    assert seen == [f"m{i}".encode() for i in range(5)]
    taken = []
    getter = connection.channel()
    while (got := getter.basic_get(queue, auto_ack=True))[0] is not None:
        taken.append(got[2])
    assert taken == seen


def test_browser_is_notified_of_new_messages(shared_broker: Broker, names: Names) -> None:
    """Non-acquiring consumers are always notified of a new message, alongside
    the one acquiring consumer that takes it."""
    queue = names("q")
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    seen: list[bytes] = []
    taken: list[bytes] = []
    channel.basic_consume(queue, lambda ch, m, p, body: seen.append(body), auto_ack=True,
                          arguments={"x-browse": True})
    channel.basic_consume(queue, lambda ch, m, p, body: taken.append(body), auto_ack=True)
    pump([connection], 0.2)
    for i in range(3):
        channel.basic_publish("", queue, f"n{i}".encode())
    pump_until([connection], lambda: len(seen) >= 3 and len(taken) >= 3,
               what="browser and consumer to get three each")
    assert seen == taken == [b"n0", b"n1", b"n2"]


def _raw_session(port: int) -> socket.socket:
    """A hand-driven client for sequences no client library sends: handshake and channel 1."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    _read_until(sock, commands.Connection.Start)
    sock.sendall(frame.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest"), 0))
    tune = _read_until(sock, commands.Connection.Tune)
    sock.sendall(frame.marshal(commands.Connection.TuneOk(
        channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0), 0))
    sock.sendall(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    _read_until(sock, commands.Connection.OpenOk)
    return sock


def _read_until(sock: socket.socket, kind: type, buffer: bytearray | None = None):
    buffer = bytearray() if buffer is None else buffer
    while True:
        while len(buffer) >= 7:
            size = struct.unpack_from(">I", buffer, 3)[0]
            if len(buffer) < size + 8:
                break
            _, _, value = frame.unmarshal(bytes(buffer[: size + 8]))
            del buffer[: size + 8]
            if isinstance(value, kind):
                return value
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("broker closed the socket")
        buffer += data


def test_a_global_prefetch_is_shared_evenly_by_a_channels_queues(shared_broker: Broker, names: Names) -> None:
    """A celery worker's shape: one channel consuming three queues with backlogs under
    basic.qos global=true, each message acked on its own. Each queue gets about a third of the
    deliveries, as from RabbitMQ (measured: 236-305 of every 1,000 from each of four queues);
    before the shared pull the queue consumed first took two thirds (634-701 of 1,000)."""
    conn = shared_broker.connect()
    ch = conn.channel()
    queues = [names(f"q{i}") for i in range(3)]
    for queue in queues:
        ch.queue_declare(queue)
        for _ in range(300):
            ch.basic_publish("", queue, b"work")
    # Every queue has its whole backlog before the first consume (publishes still on their way
    # would give the queue consumed first a head start).
    for queue in queues:
        pump_until([conn], lambda queue=queue: ch.queue_declare(queue, passive=True).method.message_count == 300,
                   what=f"{queue}'s 300 messages")
    ch.basic_qos(prefetch_count=12, global_qos=True)
    order: list[str] = []

    def on_message(channel: Any, method: Any, _properties: Any, _body: bytes) -> None:
        order.append(method.routing_key)
        channel.basic_ack(method.delivery_tag)

    for queue in queues:
        ch.basic_consume(queue, on_message)
    pump_until([conn], lambda: len(order) >= 450, what="450 deliveries")
    first = order[:450]
    assert all(first.count(queue) >= 90 for queue in queues), [first.count(q) for q in queues]
    pump_until([conn], lambda: len(order) == 900, what="every delivery")
    for queue in queues:
        ch.queue_delete(queue)
    conn.close()


def test_method_on_unopened_channel_is_504_and_spares_other_clients(shared_broker: Broker) -> None:
    """A method on a channel that was never opened closes the connection with
    504 CHANNEL_ERROR; another client on the broker carries on."""
    bystander = shared_broker.connect()
    sock = _raw_session(shared_broker.port)
    try:
        sock.sendall(frame.marshal(commands.Queue.Declare(queue="x"), 7))
        close = _read_until(sock, commands.Connection.Close)
        assert close.reply_code == 504
    finally:
        sock.close()
    channel = bystander.channel()
    channel.queue_declare("", exclusive=True)
    assert bystander.is_open


def test_content_header_without_publish_is_505(shared_broker: Broker) -> None:
    """A content header that follows no basic.publish is 505 UNEXPECTED_FRAME."""
    sock = _raw_session(shared_broker.port)
    try:
        sock.sendall(frame.marshal(commands.Channel.Open(), 1))
        _read_until(sock, commands.Channel.OpenOk)
        sock.sendall(frame.marshal(header.ContentHeader(0, 3, commands.Basic.Properties()), 1))
        close = _read_until(sock, commands.Connection.Close)
        assert close.reply_code == 505
    finally:
        sock.close()
