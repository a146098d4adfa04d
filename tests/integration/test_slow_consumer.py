"""A slow consumer beside other publishers, with real clients (pika).

Credit flow holds back only the publishers feeding a queue whose consumer waits on the
supervisor; a consumer that acks one message every few milliseconds on a deep queue waits on
its client, not on us. The test asserts what the supervisor did (its count of grants held back
per connection, read on the control socket), never a time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pika
import pytest

from broker.runtime.credit_flow import FLOW_BACKLOG
from tests.integration.harness import Broker, close_quietly
from tests.integration.rawclient import unique_name

CONFIRMED = 1000  # more than twice workers' PUBLISH_CREDIT: the publisher needs its credit back
ACK_EVERY_S = 0.02  # the slow consumer takes this long over each message (50 a second)


def control(broker: Broker, command: str) -> dict[str, Any]:
    """One request on the broker's control socket, as ``shoal list-connections`` sends it."""
    path = json.loads(broker.ready_file.read_text())["control"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(json.dumps({"command": command}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer


def withheld_from(broker: Broker, product: str) -> int:
    """Grants of publish credit the supervisor held back from the connection whose client
    calls itself ``product``."""
    rows = control(broker, "list_connections")["connections"]
    (row,) = [row for row in rows if row["client"] == product]
    counts = {(w["worker"], w["conn"]): w["grants"] for w in control(broker, "credit_flow")["withheld"]}
    return counts.get((row["worker"], row["conn"]), 0)


class SlowConsumer:
    """A pika consumer with its own connection on its own thread (pika is not thread-safe:
    the connection is made, used and closed there): prefetch 10, each message acked on its own
    ACK_EVERY_S after it arrived, so that its prefetch is full between acks."""

    def __init__(self, broker: Broker, queue: str) -> None:
        self.acked = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broker.connection_parameters(), queue),
                                        daemon=True)
        self._thread.start()

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        time.sleep(ACK_EVERY_S)  # a slow application
        channel.basic_ack(method.delivery_tag)
        self.acked += 1

    def _run(self, parameters: pika.ConnectionParameters, queue: str) -> None:
        try:
            connection = pika.BlockingConnection(parameters)
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=10)
                channel.basic_consume(queue, self._on_message)
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.1)
            finally:
                close_quietly(connection)
        except Exception as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.error is None, f"the slow consumer failed: {self.error!r}"


@pytest.mark.deadline(120)
def test_a_slow_consumer_does_not_hold_back_a_publisher_to_another_queue(broker: Broker) -> None:
    """A consumer acking 50 messages a second on a deep queue A, its prefetch full between
    acks: a publisher with confirms to queue B gets every confirm, and the supervisor never
    held back its credit (RabbitMQ lets A grow and every publisher keeps its rate)."""
    a, b = unique_name("slow-a"), unique_name("other-b")
    admin = broker.connect()
    setup = admin.channel()
    setup.queue_declare(a)
    setup.queue_declare(b)
    for _ in range(FLOW_BACKLOG * 3):  # A's backlog: its consumer always has more to take
        setup.basic_publish("", a, b"x" * 100)
    slow = SlowConsumer(broker, a)
    publisher = broker.connect(client_properties={"product": "publisher to B"})
    try:
        channel = publisher.channel()
        channel.confirm_delivery()
        while slow.acked < 5:  # A's consumer is under way: served at each ack, full between
            publisher.process_data_events(time_limit=0.05)
        for i in range(CONFIRMED):
            channel.basic_publish("", b, str(i).encode(), mandatory=True)  # raises unless confirmed
        assert setup.queue_declare(b, passive=True).method.message_count == CONFIRMED
        assert slow.acked > 5  # the slow consumer kept going meanwhile
        assert withheld_from(broker, "publisher to B") == 0
    finally:
        slow.stop()
    setup.queue_delete(a)
    setup.queue_delete(b)
