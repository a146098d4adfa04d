"""AMQPStorm against Shoal.

AMQPStorm reads the socket on its own thread and hands deliveries over through
`Channel.process_data_events`; RPCs (declare, qos, consume, confirms) block on its RPC table.
Covered: publish / consume / ack, basic.get with nack and reject, basic.qos, publisher confirms
(`confirm_deliveries`: publish returns True once acked), mandatory returns (raised as
AMQPMessageError under confirms), client- and broker-initiated cancel, exchange-to-exchange
bindings, transactions (`channel.tx` and its context manager), and AMQPStorm's own
reconnect (`Connection.open()` on a connection that failed): the worker it is on is SIGKILLed,
`check_for_errors` raises AMQPConnectionError, `open()` reconnects and the unacked message comes
back redelivered.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from amqpstorm import AMQPConnectionError, AMQPMessageError, Connection

from tests.integration.harness import HOST, Broker, wait_until
from tests.integration.rawclient import unique_name


@pytest.fixture
def connect(shared_broker: Broker) -> Iterator[Callable[..., Connection]]:
    opened: list[Connection] = []

    def factory(broker: Broker = shared_broker, **options: Any) -> Connection:
        options.setdefault("timeout", 5)
        connection = Connection(HOST, "guest", "guest", port=broker.port, **options)
        opened.append(connection)
        return connection

    yield factory
    for connection in opened:
        connection.close()


def _consume_until(channel: Any, predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= limit:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        channel.process_data_events()
        time.sleep(0.01)


def _consume_for(channel: Any, seconds: float) -> None:
    limit = time.monotonic() + seconds
    while time.monotonic() < limit:
        channel.process_data_events()
        time.sleep(0.01)


def test_publish_consume_ack_with_qos_confirms_and_cancel(connect: Callable[..., Connection]) -> None:
    connection = connect()
    channel = connection.channel()
    channel.confirm_deliveries()
    queue = unique_name("amqpstorm")
    declared = channel.queue.declare(queue, durable=False, auto_delete=False)
    assert (declared["queue"], declared["message_count"]) == (queue, 0)
    for i in range(6):
        assert channel.basic.publish(f"m{i}", queue, properties={"message_id": str(i), "content_type": "text/plain"})

    channel.basic.qos(prefetch_count=2)
    received: list[Any] = []
    tag = channel.basic.consume(received.append, queue, no_ack=False)
    _consume_until(channel, lambda: len(received) >= 2, what="two deliveries")
    _consume_for(channel, 0.3)
    assert len(received) == 2, "basic.qos prefetch_count=2 was not honoured"
    acked = 0
    while len(received) < 6:
        seen = len(received)
        for message in received[acked:seen]:
            message.ack()
        acked = seen
        _consume_until(channel, lambda seen=seen: len(received) > seen, what="more deliveries")
    for message in received[acked:]:
        message.ack()
    assert [m.body for m in received] == [f"m{i}" for i in range(6)]
    assert [m.properties["message_id"] for m in received] == [str(i) for i in range(6)]
    assert not any(m.redelivered for m in received)

    channel.basic.cancel(tag)
    assert channel.consumer_tags == []
    assert channel.basic.publish("after cancel", queue)
    _consume_for(channel, 0.2)
    assert len(received) == 6
    assert channel.queue.declare(queue, passive=True)["message_count"] == 1
    channel.queue.delete(queue)


def test_mandatory_return_raises_under_confirms(connect: Callable[..., Connection]) -> None:
    channel = connect().channel()
    channel.confirm_deliveries()
    with pytest.raises(AMQPMessageError) as caught:
        channel.basic.publish("lost", unique_name("nowhere"), exchange="amq.direct", mandatory=True)
    assert caught.value.error_code == 312
    queue = channel.queue.declare("", exclusive=True)["queue"]
    assert channel.basic.publish("routed", queue, mandatory=True) is True


def test_get_nack_and_reject(connect: Callable[..., Connection]) -> None:
    channel = connect().channel()
    queue = channel.queue.declare("", exclusive=True)["queue"]
    for body in ("a", "b", "c"):
        channel.basic.publish(body, queue)
    wait_until(lambda: channel.queue.declare(queue, passive=True)["message_count"] == 3, 5, "three messages")
    first = channel.basic.get(queue, no_ack=False)
    assert first.body == "a" and not first.redelivered
    first.nack(requeue=True)
    again = channel.basic.get(queue, no_ack=False)
    assert again.body == "a" and again.redelivered
    again.reject(requeue=False)
    assert [channel.basic.get(queue, no_ack=True).body for _ in range(2)] == ["b", "c"]
    assert channel.basic.get(queue) is None


def test_broker_cancel_removes_the_consumer(connect: Callable[..., Connection]) -> None:
    connection = connect()
    channel = connection.channel()
    queue = channel.queue.declare(unique_name("doomed"), auto_delete=False)["queue"]
    channel.basic.consume(lambda message: None, queue)
    assert channel.consumer_tags
    connect().channel().queue.delete(queue)
    wait_until(lambda: not channel.consumer_tags, 10, "basic.cancel from the broker")
    assert channel.is_open and connection.is_open


def test_bad_login_is_a_connection_error(shared_broker: Broker) -> None:
    with pytest.raises(AMQPConnectionError) as caught:
        Connection(HOST, "guest", "wrong", port=shared_broker.port, timeout=5)
    assert "ACCESS_REFUSED" in str(caught.value) or caught.value.error_code == 403


def test_reopen_after_its_worker_is_killed(broker: Broker, connect: Callable[..., Connection]) -> None:
    connection = connect(broker, heartbeat=2)
    channel = connection.channel()
    queue = unique_name("amqpstorm-recover")
    channel.queue.declare(queue, auto_delete=False)
    channel.basic.publish("held", queue)
    received: list[Any] = []
    channel.basic.consume(received.append, queue, no_ack=False)
    _consume_until(channel, lambda: received, what="the first delivery")

    index = int(connection.server_properties["shoal_worker"])
    victim = broker.worker_pids[index]
    os.kill(victim, signal.SIGKILL)

    def failed() -> bool:
        try:
            connection.check_for_errors()
        except AMQPConnectionError:
            return True
        return False

    wait_until(failed, 10, "AMQPStorm to notice the connection loss")
    broker.wait_for_worker_replaced(index, victim)
    connection.open()  # AMQPStorm's own reconnect: same object, fresh socket and channels
    assert connection.is_open
    channel = connection.channel()
    channel.basic.qos(prefetch_count=5)
    again: list[Any] = []
    tag = channel.basic.consume(again.append, queue, no_ack=False)
    _consume_until(channel, lambda: again, what="the held message after reconnecting")
    assert (again[0].body, again[0].redelivered) == ("held", True)
    again[0].ack()
    channel.basic.publish("after recovery", queue)
    _consume_until(channel, lambda: len(again) >= 2, what="a new message after recovery")
    assert again[1].body == "after recovery"
    again[1].ack()
    channel.basic.cancel(tag)
    assert channel.queue.declare(queue, passive=True)["message_count"] == 0
    channel.queue.delete(queue)


def test_exchange_to_exchange_binding(connect: Callable[..., Connection]) -> None:
    channel = connect().channel()
    source, destination = unique_name("src"), unique_name("dst")
    channel.exchange.declare(source, "fanout", auto_delete=True)
    channel.exchange.declare(destination, "fanout", auto_delete=True)
    queue = channel.queue.declare("", exclusive=True)["queue"]
    channel.queue.bind(queue, destination)
    channel.exchange.bind(destination, source)
    channel.basic.publish("through", "", exchange=source)
    wait_until(lambda: channel.queue.declare(queue, passive=True)["message_count"] == 1, 2,
               "the message through the exchange binding")


def test_transactions(connect: Callable[..., Connection]) -> None:
    channel = connect().channel()
    queue = channel.queue.declare("", exclusive=True)["queue"]
    channel.tx.select()
    channel.basic.publish("rolled back", queue)
    channel.tx.rollback()
    with channel.tx:  # commits on leaving the block
        channel.basic.publish("committed", queue)
    assert channel.basic.get(queue, no_ack=True).body == "committed"
    assert channel.basic.get(queue) is None
