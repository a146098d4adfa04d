"""Overload, with real clients: purging and deleting a large queue answer at once, other clients
keep being served, and every body is freed (its arena space is used again); one ack, nack or
channel close settling tens of thousands of deliveries at once works like a small one.

The supervisor frees a purged or deleted queue's bodies a slice at a time between other work
(broker.topology.vhost, "bounded steps"); this checks what a client can see of that, never a time:
- queue.purge-ok / queue.delete-ok carry the message count, and the queue is empty (or, declared
  again, new and empty) in the very next answer;
- a client on another queue gets its answers meanwhile;
- the queue is filled again, three times in all, into an arena that holds fewer than two
  fillings: that only completes if every body of the previous filling was freed.
"""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.integration.harness import close_quietly, finish, start_broker, wait_until
from tests.integration.rawclient import RawClient, publish_frames, unique_name

N = 200_000
BODY = b"0123456789abcdef"  # a 16-byte body + a 14-byte content header: a 48-byte arena block
ARENA_MB = 16  # 200,000 blocks of 48 bytes fill 57% of it: a second filling needs the first freed
CHUNK = 1000


@pytest.mark.deadline(300)
def test_purging_and_deleting_a_large_queue_answer_at_once_and_free_every_body(tmp_path: Path) -> None:
    # No paging: the refills must find the freed arena space, not space paging made.
    broker = start_broker(tmp_path / "broker", extra_args=[
        "--arena-mb", str(ARENA_MB), "--max-message-size", str(1 << 20),
        "--memory-paging-ratio", "0"])
    queue, other = unique_name("big"), unique_name("other")
    try:
        publisher = RawClient.opened(broker.port)
        admin = broker.connect()
        channel = admin.channel()
        channel.queue_declare(queue)
        bystander = broker.connect()
        by_channel = bystander.channel()
        by_channel.queue_declare(other)

        def depth() -> int:
            return channel.queue_declare(queue, passive=True).method.message_count

        def fill() -> None:
            frames = b"".join(publish_frames(1, "", queue, BODY)) * CHUNK
            for _ in range(N // CHUNK):
                publisher.send(frames)
            wait_until(lambda: depth() == N, 120, f"{N} messages in the queue (arena space freed?)")

        def bystander_served(text: bytes) -> None:
            by_channel.basic_publish("", other, text)
            method, _, body = by_channel.basic_get(other, auto_ack=True)
            assert method is not None and body == text

        fill()
        purged = channel.queue_purge(queue)
        assert purged.method.message_count == N
        assert depth() == 0
        bystander_served(b"after purge")

        fill()
        deleted = channel.queue_delete(queue)
        assert deleted.method.message_count == N
        bystander_served(b"after delete")
        assert channel.queue_declare(queue).method.message_count == 0

        fill()
        assert channel.queue_delete(queue).method.message_count == N
        publisher.close()
        close_quietly(bystander)
        close_quietly(admin)
    finally:
        finish(broker)


SETTLED = 30_000  # entry ids of 3 and 5 octets: one Settle of them all would outgrow a 64 KiB ring


@pytest.mark.deadline(300)
def test_one_ack_nack_or_close_settling_tens_of_thousands_of_deliveries(tmp_path: Path) -> None:
    """A consumer without prefetch holds every message of a queue; a single basic.nack with
    multiple=true requeues them all, a single basic.ack with multiple=true settles them all
    and a channel close requeues them all. The worker sends such a settle as several bounded
    records (the smallest request ring, 64 KiB, could not hold it as one: the worker failed
    and its clients were disconnected); the connection carries on, and nothing is lost."""
    broker = start_broker(tmp_path / "broker", extra_args=["--ring-kb", "64"])
    queue = unique_name("held")
    try:
        publisher = RawClient.opened(broker.port)
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare(queue)
        publisher.send(b"".join(publish_frames(1, "", queue, BODY)) * SETTLED)

        def depth() -> int:
            return channel.queue_declare(queue, passive=True).method.message_count

        wait_until(lambda: depth() == SETTLED, 60, f"{SETTLED} messages in the queue")

        def take_all(expect_redelivered: bool) -> int:
            """Consume everything without prefetch, then cancel; the last delivery tag."""
            tags: list[int] = []

            def on_message(ch: object, method: pika.spec.Basic.Deliver, props: object, body: bytes) -> None:
                assert method.redelivered == expect_redelivered and body == BODY
                tags.append(method.delivery_tag)

            tag = channel.basic_consume(queue, on_message)
            wait_until(lambda: connection.process_data_events(0.05) or len(tags) >= SETTLED, 60,
                       f"{SETTLED} deliveries")
            channel.basic_cancel(tag)
            assert len(tags) == SETTLED and tags == sorted(set(tags))
            return tags[-1]

        channel.basic_nack(take_all(False), multiple=True, requeue=True)
        wait_until(lambda: depth() == SETTLED, 60, "every delivery requeued by one nack")

        take_all(True)
        channel.close()  # the channel's unacked deliveries go back, a slice per step
        channel = connection.channel()
        wait_until(lambda: depth() == SETTLED, 60, "every delivery requeued by the close")

        channel.basic_ack(take_all(True), multiple=True)
        wait_until(lambda: depth() == 0, 60, "nothing left after one ack")
        channel.close()
        channel = connection.channel()
        assert depth() == 0, "an acked message came back"
        assert connection.is_open
        publisher.close()
        close_quietly(connection)
    finally:
        finish(broker)


FANOUT = 3000  # queues: a publish to them is offered to them in three steps (broker.runtime.dispatch)


@pytest.mark.deadline(300)
def test_publishes_to_a_fanout_of_thousands_of_queues_reach_every_queue_in_order(tmp_path: Path) -> None:
    """A fanout exchange bound to 3,000 queues: each message is offered to them a slice per
    supervisor step (a step holding the supervisor for all 3,000 held every other client up).
    Published with confirms and mandatory, each is confirmed (an ack, after its last queue),
    none is returned, every queue holds every message in publish order, and a consumer acking
    the first copies at once does not lose the others'."""
    broker = start_broker(tmp_path / "broker")
    exchange = unique_name("wide")
    queues = [unique_name(f"w{i}") for i in range(FANOUT)]
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare(exchange, "fanout")
        for name in queues:
            channel.queue_declare(name)
            channel.queue_bind(name, exchange)
        consumer_conn = broker.connect()
        consumer = consumer_conn.channel()
        acked: list[bytes] = []

        def on_message(ch: object, method: pika.spec.Basic.Deliver, props: object, body: bytes) -> None:
            consumer.basic_ack(method.delivery_tag)
            acked.append(body)

        consumer.basic_consume(queues[0], on_message)
        returned: list[bytes] = []
        channel.add_on_return_callback(lambda ch, method, props, body: returned.append(body))
        channel.confirm_delivery()
        bodies = [f"m{i}".encode() for i in range(5)]
        for body in bodies:
            channel.basic_publish(exchange, "", body, mandatory=True)  # raises if nacked
        wait_until(lambda: consumer_conn.process_data_events(0.05) or len(acked) == len(bodies),
                   60, "the first queue's copies consumed")
        assert acked == bodies and returned == []
        counts = [channel.queue_declare(name, passive=True).method.message_count
                  for name in queues[1:]]
        assert counts == [len(bodies)] * (FANOUT - 1)
        for name in (queues[1], queues[FANOUT // 2], queues[-1]):
            got = []
            for _ in bodies:
                method, _, body = channel.basic_get(name, auto_ack=True)
                assert method is not None
                got.append(body)
            assert got == bodies
        close_quietly(consumer_conn)
        close_quietly(connection)
    finally:
        finish(broker)


BOUND = 5000  # bindings of one exchange: they go over several supervisor steps once it is deleted


@pytest.mark.deadline(300)
def test_an_exchange_bound_thousands_of_times_is_deleted_at_once_and_can_be_declared_again(
        tmp_path: Path) -> None:
    """exchange.delete of a direct exchange bound to 5,000 queues answers at once and the
    exchange is gone (passive declare: 404); declared again at once as auto-delete and bound to
    two of the same queues, it routes by its own bindings only; deleting a queue only the old
    exchange was bound to leaves it, deleting the two it is bound to auto-deletes it."""
    broker = start_broker(tmp_path / "broker")
    exchange = unique_name("bound")
    queues = [unique_name(f"b{i}") for i in range(BOUND)]
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct")
        for i, name in enumerate(queues):
            channel.queue_declare(name)
            channel.queue_bind(name, exchange, f"k{i}")
        channel.exchange_delete(exchange)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.exchange_declare(exchange, passive=True)
        assert closed.value.reply_code == 404
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct", auto_delete=True)
        channel.queue_bind(queues[0], exchange, "new")
        channel.queue_bind(queues[-1], exchange, "new")
        channel.confirm_delivery()
        channel.basic_publish(exchange, "new", b"by the new bindings", mandatory=True)
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(exchange, "k7", b"by an old binding", mandatory=True)
        for name in (queues[0], queues[-1]):
            method, _, body = channel.basic_get(name, auto_ack=True)
            assert method is not None and body == b"by the new bindings"
        assert channel.queue_declare(queues[7], passive=True).method.message_count == 0
        channel.queue_delete(queues[1])
        channel.exchange_declare(exchange, passive=True)  # still there
        channel.queue_delete(queues[0])
        channel.queue_delete(queues[-1])
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.exchange_declare(exchange, passive=True)
        assert closed.value.reply_code == 404
        close_quietly(connection)
    finally:
        finish(broker)


@pytest.mark.deadline(300)
def test_a_queue_bound_thousands_of_times_is_deleted_at_once_and_can_be_declared_again(
        tmp_path: Path) -> None:
    """queue.delete of a queue bound 5,000 times to a topic exchange answers at once; declared
    again at once under its name, the queue gets nothing through the old bindings (a mandatory
    publish matching one comes back) and what its new binding routes; the exchange keeps
    working for the other queues."""
    broker = start_broker(tmp_path / "broker")
    exchange, queue, other = unique_name("topic"), unique_name("many"), unique_name("other")
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_declare(other)
        channel.queue_bind(other, exchange, "other.#")
        for i in range(BOUND):
            channel.queue_bind(queue, exchange, f"a.b{i}.#")
        assert channel.queue_delete(queue).method.message_count == 0
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "new")
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(exchange, "a.b7.c", b"by an old binding", mandatory=True)
        channel.basic_publish(exchange, "new", b"by the new binding", mandatory=True)
        channel.basic_publish(exchange, "other.x", b"to the other queue", mandatory=True)
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"by the new binding"
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        method, _, body = channel.basic_get(other, auto_ack=True)
        assert method is not None and body == b"to the other queue"
        close_quietly(connection)
    finally:
        finish(broker)


@pytest.mark.deadline(300)
def test_an_exchange_thousands_of_exchanges_are_bound_to_is_deleted_at_once(tmp_path: Path) -> None:
    """exchange.delete of a fanout exchange that 5,000 exchange-to-exchange bindings lead to
    (2,500 keys from one direct exchange, one from each of 2,500 more) answers at once; a
    mandatory publish through one of the old bindings comes back meanwhile, the auto-delete
    sources go with their only binding, and the exchange declared again at once under its name
    gets only what its new binding routes."""
    broker = start_broker(tmp_path / "broker")
    target, sink = unique_name("dest"), unique_name("sink")
    wide = unique_name("wide")
    sources = [unique_name(f"s{i}") for i in range(BOUND // 2)]
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare(target, "fanout")
        channel.queue_declare(sink)
        channel.queue_bind(sink, target)
        channel.exchange_declare(wide, "direct")
        for i in range(BOUND // 2):
            channel.exchange_bind(target, wide, f"k{i}")
        for name in sources:
            channel.exchange_declare(name, "fanout", auto_delete=True)
            channel.exchange_bind(target, name)
        channel.exchange_delete(target)
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(wide, "k7", b"by an old binding", mandatory=True)
        channel.exchange_declare(target, "fanout")
        channel.queue_bind(sink, target)
        channel.exchange_bind(target, wide, "new")
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(wide, "k8", b"by an old binding", mandatory=True)
        channel.basic_publish(wide, "new", b"by the new binding", mandatory=True)
        method, _, body = channel.basic_get(sink, auto_ack=True)
        assert method is not None and body == b"by the new binding"
        assert channel.queue_declare(sink, passive=True).method.message_count == 0
        for name in (sources[0], sources[-1]):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.exchange_declare(name, passive=True)
            assert closed.value.reply_code == 404, "an auto-delete source outlived its only binding"
            channel = connection.channel()
        close_quietly(connection)
    finally:
        finish(broker)


EXCLUSIVE = 1000  # exclusive queues of one connection: more than a closing step deletes


@pytest.mark.deadline(300)
def test_a_connection_with_a_thousand_exclusive_queues_closes(tmp_path: Path) -> None:
    """A connection holding 1,000 exclusive queues, a message in each, closes: another
    connection finds every queue gone soon after (passive declare: 404; meanwhile 405
    RESOURCE_LOCKED, as from RabbitMQ until a queue has seen its owner go, never the queue as
    its own), then declares the same names as its own exclusive queues, empty."""
    broker = start_broker(tmp_path / "broker")
    names = [unique_name(f"x{i}") for i in range(EXCLUSIVE)]
    try:
        owner = broker.connect()
        channel = owner.channel()
        for name in names:
            channel.queue_declare(name, exclusive=True)
            channel.basic_publish("", name, b"held by an exclusive queue")
        channel.queue_declare(names[-1], passive=True)  # a round trip: all declared and routed
        owner.close()

        other = broker.connect()
        answers: set[int] = set()

        def gone(name: str) -> bool:
            probe = other.channel()
            try:
                probe.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as closed:
                answers.add(closed.reply_code)
                return closed.reply_code == 404
            raise AssertionError(f"{name} is still there, and this connection may use it")

        for name in (names[-1], names[EXCLUSIVE // 2], names[0]):
            wait_until(lambda name=name: gone(name), timeout=30)
        assert answers <= {404, 405}
        channel = other.channel()
        for name in names[:10] + names[-10:]:
            assert channel.queue_declare(name, exclusive=True).method.message_count == 0
        close_quietly(other)
    finally:
        finish(broker)


CONSUMERS = 2000  # consumers of one channel: more than a step takes off their queues


@pytest.mark.deadline(300)
def test_a_channel_with_thousands_of_consumers_closes_while_another_consumes(tmp_path: Path) -> None:
    """A channel with 2,000 consumers of a queue closes (close-ok at once; they leave the queue
    over the next steps): another connection's consumer of the queue gets every message
    published right after, in order and none redelivered (none went to a closed consumer and
    came back); an auto-delete queue whose only consumers, 1,000 of them, were on a closed
    channel goes once the last has left."""
    broker = start_broker(tmp_path / "broker")
    queue, auto = unique_name("many"), unique_name("auto")
    try:
        many = broker.connect()
        crowd = many.channel()
        crowd.queue_declare(queue)
        crowd.queue_declare(auto, auto_delete=True)
        for _ in range(CONSUMERS):
            crowd.basic_consume(queue, lambda *args: None)
        crowd_auto = many.channel()
        for _ in range(CONSUMERS // 2):
            crowd_auto.basic_consume(auto, lambda *args: None)

        other = broker.connect()
        taker = other.channel()
        got: list[tuple[bytes, bool]] = []

        def take(ch: object, method: pika.spec.Basic.Deliver, _: object, body: bytes) -> None:
            got.append((body, method.redelivered))
            taker.basic_ack(method.delivery_tag)

        taker.basic_consume(queue, take)
        publisher = broker.connect()
        out = publisher.channel()

        crowd.close()
        bodies = [f"after the close {i}".encode() for i in range(300)]
        for body in bodies:
            out.basic_publish("", queue, body)

        def all_taken() -> bool:
            other.process_data_events(time_limit=0.05)
            return len(got) >= len(bodies)

        wait_until(all_taken, 60, "every message reached the live consumer")
        assert got == [(body, False) for body in bodies]
        wait_until(lambda: out.queue_declare(queue, passive=True).method.consumer_count == 1,
                   30, "the closed channel's consumers left the queue")

        crowd_auto.close()

        def auto_gone() -> bool:
            probe = publisher.channel()
            try:
                probe.queue_declare(auto, passive=True)
            except pika.exceptions.ChannelClosedByBroker as closed:
                assert closed.reply_code == 404
                return True
            probe.close()
            return False

        wait_until(auto_gone, 30, "the auto-delete queue went with its last consumer")
        for connection in (many, other, publisher):
            close_quietly(connection)
    finally:
        finish(broker)


@pytest.mark.deadline(300)
def test_a_queue_with_thousands_of_consumers_is_deleted(tmp_path: Path) -> None:
    """Another connection deletes a queue that 2,000 consumers of one channel use: delete-ok at
    once, and every consumer gets its basic.cancel (consumer_cancel_notify; the broker tells
    them a slice per step), each once; the channel stays open and serves."""
    broker = start_broker(tmp_path / "broker")
    queue = unique_name("crowded")
    try:
        many = broker.connect()
        crowd = many.channel()
        crowd.queue_declare(queue)
        cancelled: list[str] = []
        crowd.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tags = [crowd.basic_consume(queue, lambda *args: None) for _ in range(CONSUMERS)]

        admin = broker.connect()
        assert admin.channel().queue_delete(queue).method.message_count == 0

        def all_cancelled() -> bool:
            many.process_data_events(time_limit=0.05)
            return len(cancelled) >= CONSUMERS

        wait_until(all_cancelled, 60, "every consumer was told its queue went")
        assert sorted(cancelled) == sorted(tags) and crowd.consumer_tags == []
        crowd.queue_declare(queue)
        crowd.basic_publish("", queue, b"still serving")
        method, _, body = crowd.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"still serving"
        for connection in (many, admin):
            close_quietly(connection)
    finally:
        finish(broker)


@pytest.mark.deadline(300)
def test_channels_with_hundreds_of_consumers_churning_lose_and_double_nothing(tmp_path: Path) -> None:
    """Five times over, a channel subscribes 600 consumers (more than a step takes off a queue)
    to a queue being published to, takes deliveries with prefetch 5, acks every other one and
    closes, its unacked deliveries going back while its consumers are still leaving the queue;
    the rest are consumed at the end. Every message published is acked exactly once."""
    broker = start_broker(tmp_path / "broker")
    queue = unique_name("churn")
    try:
        publisher = broker.connect()
        out = publisher.channel()
        out.confirm_delivery()
        out.queue_declare(queue)
        published: list[bytes] = []

        def publish(n: int) -> None:
            for _ in range(n):
                body = f"m{len(published)}".encode()
                out.basic_publish("", queue, body)
                published.append(body)

        consumers = broker.connect()
        acked: list[bytes] = []
        for _ in range(5):
            crowd = consumers.channel()
            crowd.basic_qos(prefetch_count=5)
            seen = 0

            def take(ch: object, method: pika.spec.Basic.Deliver, _: object, body: bytes,
                     crowd: object = crowd) -> None:
                nonlocal seen
                seen += 1
                if seen % 2:
                    acked.append(body)
                    crowd.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

            for _ in range(600):
                crowd.basic_consume(queue, take)
            publish(400)
            deadline = 0
            while seen < 200 and deadline < 100:
                consumers.process_data_events(time_limit=0.05)
                deadline += 1
            crowd.close()  # about half of what it took is unacked: back to the queue

        rest = consumers.channel()
        publish(100)

        def drained() -> bool:
            while True:
                method, _, body = rest.basic_get(queue, auto_ack=False)
                if method is None:
                    return len(acked) >= len(published)
                acked.append(body)
                rest.basic_ack(method.delivery_tag)

        wait_until(drained, 120, "every message acked")
        assert sorted(acked) == sorted(published), "a message lost or acked twice"
        for connection in (publisher, consumers):
            close_quietly(connection)
    finally:
        finish(broker)
