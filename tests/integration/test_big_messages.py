"""Big messages with the default settings: RabbitMQ 3.x accepts bodies up to 128 MiB
(max_message_size) and client suites publish 20 MiB. A body over a sixteenth of its worker's
arena gets a shared-memory segment of its own (ipc.arena, "Large bodies"), unlinked when the
last reference goes, at a worker's death if it never got published, and at shutdown."""

from __future__ import annotations

import hashlib
import os
import signal

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands

from tests.integration.harness import Broker, shm_segments, wait_until
from tests.integration.pika_helpers import Names
from tests.integration.rawclient import RawClient, publish_frames

MiB = 1 << 20


def _body(size: int) -> bytes:
    block = os.urandom(MiB)
    return (block * (size // len(block) + 1))[:size]


def _large_segments(broker: Broker) -> list[str]:
    return [p.name for p in shm_segments(broker.read_ready().instance) if ".b" in p.name]


@pytest.mark.deadline(180)
def test_20_and_100_mib_bodies_go_through_with_the_defaults(broker: Broker, names: Names) -> None:
    """pika publishes (with confirms) and consumes 20 MiB and 100 MiB bodies on a broker started
    with no options about sizes; both arrive intact, in order; each had a segment of its own
    while queued, unless paged out to disk, and none is left once they are acked."""
    connection = broker.connect(blocked_connection_timeout=120)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names("big")
    channel.queue_declare(queue, auto_delete=True)
    sizes = [20 * MiB, 100 * MiB]
    digests = []
    for size in sizes:
        body = _body(size)
        digests.append(hashlib.sha256(body).hexdigest())
        channel.basic_publish("", queue, body)  # confirmed: raises on a nack or a 406
        del body
    # 120 MiB queued passes the default arena's paging mark (40% of 256 MiB): the newest body,
    # the 100 MiB one, is paged out to the data directory and its segment goes; the 20 MiB one
    # keeps its own (broker.storage.paging).
    wait_until(lambda: len(_large_segments(broker)) == 1, 30, "the 100 MiB body paged out")
    assert "message bodies are paged out" in broker.log_tail()
    channel.basic_qos(prefetch_count=1)
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=60):
        assert method is not None, "no delivery within 60 s"
        got.append((len(body), hashlib.sha256(body).hexdigest()))
        channel.basic_ack(method.delivery_tag)
        if len(got) == len(sizes):
            break
    channel.cancel()
    assert got == list(zip(sizes, digests, strict=True))
    wait_until(lambda: not _large_segments(broker), 10, "the acked bodies' segments to go")


@pytest.mark.deadline(180)
def test_a_body_over_max_message_size_is_refused_as_rabbitmq_does(broker: Broker, names: Names) -> None:
    """A body one byte over the default 128 MiB closes the channel with 406 and RabbitMQ's
    words (rabbit_channel:check_msg_size); the connection and the broker carry on."""
    connection = broker.connect(blocked_connection_timeout=120)
    channel = connection.channel()
    queue = names("over")
    channel.queue_declare(queue, auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.basic_publish("", queue, bytes(128 * MiB + 1))
        channel.queue_declare(queue, passive=True)
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728")
    other = connection.channel()
    assert other.queue_declare(queue, passive=True).method.message_count == 0
    assert not _large_segments(broker)


@pytest.mark.deadline(240)
def test_sigkilled_workers_holding_a_big_body_leave_nothing_behind(broker: Broker, names: Names) -> None:
    """A 20 MiB body survives the SIGKILL of the worker that delivered it (requeued) and of
    the worker whose arena holds it (replaced on the same region); it is redelivered intact,
    its segment goes with its ack, and after the broker stops nothing is left in /dev/shm --
    with another big body still queued at the stop."""
    by_worker = broker.connections_on_workers([0, 1])
    publisher, consumer = by_worker[0], by_worker[1]
    queue = names("big")
    channel = publisher.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    body = _body(20 * MiB)
    channel.basic_publish("", queue, body)
    assert [name.split(".w")[1][0] for name in _large_segments(broker)] == ["0"]

    held = consumer.channel()
    held.basic_qos(prefetch_count=1)
    method, _, first = next(held.consume(queue, inactivity_timeout=60))
    assert method is not None and first == body  # delivered, not acked
    for index in (1, 0):  # the consumer's worker, then the publisher's
        old = broker.worker_pids[index]
        os.kill(old, signal.SIGKILL)
        broker.wait_for_worker_replaced(index, old)

    fresh = broker.connect()
    again = fresh.channel()
    wait_until(lambda: again.queue_declare(queue, passive=True).method.message_count == 1, 20,
               "the unacked body to be requeued")
    method, _, redelivered = again.basic_get(queue)
    assert method is not None and method.redelivered and redelivered == body
    again.basic_ack(method.delivery_tag)
    wait_until(lambda: not _large_segments(broker), 10, "the acked body's segment to go")

    again.confirm_delivery()
    again.basic_publish("", queue, body)  # still queued when the broker stops
    assert len(_large_segments(broker)) == 1
    instance = broker.read_ready().instance
    assert broker.stop() == []
    assert shm_segments(instance) == []


@pytest.mark.deadline(120)
def test_a_big_body_is_stored_from_its_header_on_and_let_go_when_its_connection_fails(
        broker: Broker, names: Names) -> None:
    """A 20 MiB body's segment exists as soon as its content header is read (its frames are
    received straight into it); a method frame between two of its body frames is 505
    UNEXPECTED_FRAME, and the segment goes with the connection. The worker carries on."""
    queue = names("big")
    with RawClient.opened(broker.port) as client:
        client.send_method(1, commands.Queue.Declare(queue=queue))
        client.read_until(commands.Queue.DeclareOk)
        frames = publish_frames(1, "", queue, _body(20 * MiB))
        client.send(*frames[:5])  # basic.publish, the content header, three body frames
        wait_until(lambda: len(_large_segments(broker)) == 1, 10, "the body's segment")
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))
        close = client.expect_connection_close()
        assert close.reply_code == 505
    wait_until(lambda: not _large_segments(broker), 10, "the half-received body's segment to go")
    check = broker.connect().channel()
    assert check.queue_declare(queue, passive=True).method.message_count == 0


@pytest.mark.deadline(120)
def test_a_channel_closed_by_the_broker_mid_body_frees_its_segment_and_the_rest_is_dropped(
        broker: Broker, names: Names) -> None:
    """The broker closes a channel (404: its previous publish named a missing exchange) while a
    20 MiB body on it is half received: the segment taken for that body goes at once, the rest
    of its frames are read and dropped (the channel is closing), and after close-ok the same
    connection publishes and consumes on another channel, bodies intact."""
    queue = names("q")
    with RawClient.opened(broker.port) as client:
        client.send_method(1, commands.Queue.Declare(queue=queue))
        client.read_until(commands.Queue.DeclareOk)
        frames = publish_frames(1, "", queue, _body(20 * MiB))
        client.send(*publish_frames(1, names("missing"), "k", b"first"),
                    *frames[:3], frames[3][:60_000])  # mid-way through a body frame
        close = client.read_until(commands.Channel.Close, channel=1)
        assert close.reply_code == 404
        wait_until(lambda: not _large_segments(broker), 10, "the closed channel's segment to go")
        client.send(frames[3][60_000:], *frames[4:])
        client.send_method(1, commands.Channel.CloseOk())
        client.open_channel(2)
        small = os.urandom(1000)
        client.send(*publish_frames(2, "", queue, small))
        client.send_method(2, commands.Basic.Get(queue=queue, no_ack=True))
        client.read_until(commands.Basic.GetOk, channel=2)
        got = client.read_until(pamqp_body.ContentBody, channel=2)
        assert bytes(got.value) == small
    assert not _large_segments(broker)



@pytest.mark.deadline(120)
def test_an_ack_ahead_of_the_read_changes_no_byte_the_client_gets(broker: Broker, names: Names) -> None:
    """A client acks deliveries whose 256 KiB bodies it has not read yet: their frames still
    wait in the broker's output as views of the arena blocks (sent with sendmsg, not copied)
    when the ack lets the supervisor free those blocks, and the next publishes reuse them. The
    worker copies what it still views before the Settle goes: every body the client then
    reads is the one that was published."""
    queue = names("ahead")
    publisher = broker.connect()
    pch = publisher.channel()
    pch.confirm_delivery()
    pch.queue_declare(queue)
    count, size = 40, 256 << 10
    with RawClient.opened(broker.port) as consumer:
        consumer.send_method(1, commands.Basic.Qos(prefetch_count=count))
        consumer.read_until(commands.Basic.QosOk)
        consumer.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
        consumer.read_until(commands.Basic.ConsumeOk)
        bodies = [os.urandom(size) for _ in range(count)]
        for body in bodies:
            pch.basic_publish("", queue, body)  # confirmed: in its block before the next
        # Delivered as far as the worker's output bound lets it (more than the sockets hold:
        # the rest waits in the worker), then nothing moves while the client reads nothing.
        counts: list[int] = []

        def settled() -> bool:
            counts.append(pch.queue_declare(queue, passive=True).method.message_count)
            return len(counts) > 3 and counts[-1] == counts[-4] < count

        wait_until(settled, 20, "deliveries waiting for the client")
        delivered = count - counts[-1]
        consumer.send_method(1, commands.Basic.Ack(delivery_tag=delivered, multiple=True))
        more = [os.urandom(size) for _ in range(count)]
        for body in more:
            pch.basic_publish("", queue, body)  # into the blocks the ack freed
        got: list[bytes] = []
        current = bytearray()
        while len(got) < 2 * count:
            frame = consumer.read_frame(30)
            assert frame is not None, "the broker closed the connection"
            if isinstance(frame.value, pamqp_body.ContentBody):
                current += frame.value.value
                if len(current) == size:
                    got.append(bytes(current))
                    current.clear()
                    if len(got) > delivered:  # acked ahead up to there
                        consumer.send_method(1, commands.Basic.Ack(delivery_tag=len(got)))
    assert [hashlib.sha256(b).hexdigest() for b in got] == [
        hashlib.sha256(b).hexdigest() for b in bodies + more]
    pch.queue_delete(queue)
    publisher.close()
