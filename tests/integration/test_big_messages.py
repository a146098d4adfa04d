"""Big messages with the default settings: RabbitMQ 3.x accepts bodies up to 128 MiB
(max_message_size) and client suites publish 20 MiB. A body lives in its publisher's worker
arena (256 MiB by default, sparse), so --max-message-size may be as large as the arena."""

from __future__ import annotations

import hashlib
import os

import pika

from tests.integration.conftest import Broker, Names


def _body(size: int) -> bytes:
    block = os.urandom(1 << 20)
    return (block * (size // len(block) + 1))[:size]


def test_20_and_100_mib_bodies_go_through_with_the_defaults(broker: Broker, names: Names) -> None:
    """pika publishes (with confirms) and consumes 20 MiB and 100 MiB bodies on a broker started
    with no options about sizes; both arrive intact, in order."""
    connection = broker.connect(blocked_connection_timeout=120)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names("big")
    channel.queue_declare(queue, auto_delete=True)
    sizes = [20 << 20, 100 << 20]
    digests = []
    for size in sizes:
        body = _body(size)
        digests.append(hashlib.sha256(body).hexdigest())
        channel.basic_publish("", queue, body)  # confirmed: raises on a nack or a 406
        del body
    got = []
    for _ in sizes:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        got.append((len(body), hashlib.sha256(body).hexdigest()))
    assert got == list(zip(sizes, digests))
