"""Virtual host declare/delete/bind/publish rules, with RabbitMQ's reply codes and texts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from broker.errors import (
    AccessRefused,
    CommandInvalid,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from broker.messages.message import Message
from broker.topology.vhost import VirtualHost
from tests.broker.support import attach, consumer, message

ME, OTHER = ("w0", 1), ("w1", 2)


@pytest.fixture
def dropped() -> list[Message]:
    return []


@pytest.fixture
def vhost(dropped: list[Message]) -> VirtualHost:
    return VirtualHost("/", on_drop=dropped.append)


# ---------------------------------------------------------------------------- exchanges


def test_standard_exchanges_are_predeclared(vhost: VirtualHost) -> None:
    """The default exchange and amq.direct/fanout/topic/headers/match exist from the start."""
    types = {name: ex.type for name, ex in vhost.exchanges.items()}
    assert types == {
        "": "direct", "amq.direct": "direct", "amq.fanout": "fanout",
        "amq.topic": "topic", "amq.headers": "headers", "amq.match": "headers",
    }
    assert vhost.declare_exchange("amq.topic", "topic", durable=True) is vhost.exchanges["amq.topic"]


def test_passive_declare_of_missing_exchange_is_not_found(vhost: VirtualHost) -> None:
    """exchange.declare passive on a missing exchange: 404 "no exchange 'x' in vhost '/'"."""
    with pytest.raises(NotFound) as err:
        vhost.declare_exchange("x", "direct", passive=True)
    assert err.value.reply_code == 404 and err.value.reply_text == "no exchange 'x' in vhost '/'"
    assert "x" not in vhost.exchanges


def test_declaring_reserved_amq_exchange_is_access_refused(vhost: VirtualHost) -> None:
    """Creating an exchange named amq.* is refused with 403 (the prefix is reserved)."""
    with pytest.raises(AccessRefused) as err:
        vhost.declare_exchange("amq.custom", "direct")
    assert err.value.reply_text == "exchange name 'amq.custom' contains reserved prefix 'amq.*'"


def test_redeclaring_exchange_with_another_type_is_precondition_failed(vhost: VirtualHost) -> None:
    """Redeclare with a different type: 406 with RabbitMQ's "inequivalent arg" text."""
    vhost.declare_exchange("x", "direct")
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_exchange("x", "fanout")
    assert err.value.reply_code == 406 and not err.value.hard
    assert err.value.reply_text == (
        "inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout' but current is 'direct'"
    )


@pytest.mark.parametrize("field", ["durable", "auto_delete", "internal"])
def test_redeclaring_exchange_with_other_flags_is_precondition_failed(vhost: VirtualHost, field: str) -> None:
    """Redeclare with a different durable/auto_delete/internal: 406 naming the field."""
    vhost.declare_exchange("x", "topic")
    flags: dict[str, Any] = {field: True}
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_exchange("x", "topic", **flags)
    assert err.value.reply_text == (
        f"inequivalent arg '{field}' for exchange 'x' in vhost '/': received 'true' but current is 'false'"
    )


def test_redeclaring_exchange_with_other_alternate_exchange_is_precondition_failed(vhost: VirtualHost) -> None:
    """RabbitMQ compares the alternate-exchange argument on redeclare."""
    vhost.declare_exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_exchange("x", "direct")
    assert err.value.reply_text == (
        "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
        "received none but current is the value 'ae' of type 'longstr'"
    )


def test_default_exchange_cannot_be_declared_or_deleted(vhost: VirtualHost) -> None:
    """Operations on the default exchange are refused: 403 "operation not permitted on the default exchange"."""
    for action in (
        lambda: vhost.declare_exchange("", "direct"),
        lambda: vhost.declare_exchange("", "direct", passive=True),
        lambda: vhost.delete_exchange(""),
    ):
        with pytest.raises(AccessRefused, match=r"^operation not permitted on the default exchange$"):
            action()
    assert "" in vhost.exchanges


def test_unknown_exchange_type_is_command_invalid(vhost: VirtualHost) -> None:
    """exchange.declare with an unknown type: 503 COMMAND_INVALID, a connection error."""
    with pytest.raises(CommandInvalid) as err:
        vhost.declare_exchange("x", "foo")
    assert err.value.hard and err.value.reply_text == "invalid exchange type 'foo'"


def test_system_exchanges_cannot_be_deleted(vhost: VirtualHost) -> None:
    """Deleting an amq.* exchange: 403 "deletion of system exchange ... not allowed"."""
    with pytest.raises(AccessRefused) as err:
        vhost.delete_exchange("amq.direct")
    assert err.value.reply_text == "deletion of system exchange 'amq.direct' in vhost '/' not allowed"


def test_deleting_missing_exchange_succeeds(vhost: VirtualHost) -> None:
    """RabbitMQ 3.x: exchange.delete of a missing exchange replies delete-ok."""
    vhost.delete_exchange("nope")
    assert "nope" not in vhost.exchanges


def test_delete_exchange_if_unused_refuses_bound_exchange(vhost: VirtualHost) -> None:
    """exchange.delete if-unused with bindings: 406 "exchange 'x' in vhost '/' in use"."""
    vhost.declare_exchange("x", "direct")
    vhost.declare_queue("q", owner=ME)
    vhost.bind_queue("q", "x", "k", owner=ME)
    with pytest.raises(PreconditionFailed, match=r"^exchange 'x' in vhost '/' in use$"):
        vhost.delete_exchange("x", if_unused=True)
    vhost.delete_exchange("x")
    assert "x" not in vhost.exchanges
    assert vhost.publish("", message("q")) [0] == 1  # the queue and its default binding survive


def test_auto_delete_exchange_goes_with_its_last_binding(vhost: VirtualHost) -> None:
    """An auto-delete exchange is deleted when its last binding is removed."""
    vhost.declare_exchange("x", "fanout", auto_delete=True)
    vhost.declare_queue("q1", owner=ME)
    vhost.declare_queue("q2", owner=ME)
    vhost.bind_queue("q1", "x", "", owner=ME)
    vhost.bind_queue("q2", "x", "", owner=ME)
    vhost.unbind_queue("q1", "x", "", owner=ME)
    assert "x" in vhost.exchanges
    vhost.delete_queue("q2", owner=ME)
    assert "x" not in vhost.exchanges


def test_publish_to_internal_exchange_is_access_refused(vhost: VirtualHost) -> None:
    """basic.publish to an internal exchange: 403 "cannot publish to internal exchange ..."."""
    vhost.declare_exchange("i", "fanout", internal=True)
    with pytest.raises(AccessRefused, match=r"^cannot publish to internal exchange 'i' in vhost '/'$"):
        vhost.publish("i", message())


def test_publish_to_missing_exchange_is_not_found(vhost: VirtualHost) -> None:
    """basic.publish to a missing exchange: 404 "no exchange 'x' in vhost '/'"."""
    with pytest.raises(NotFound, match=r"^no exchange 'x' in vhost '/'$"):
        vhost.publish("x", message())


# ------------------------------------------------------------------------------- queues


def test_server_named_queue_has_rabbitmq_shape(vhost: VirtualHost) -> None:
    """queue.declare with an empty name creates "amq.gen-" + 22 url-safe characters."""
    names = {vhost.declare_queue("", owner=ME).name for _ in range(20)}
    assert len(names) == 20
    assert all(re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", n) for n in names)


def test_passive_declare_of_missing_queue_is_not_found(vhost: VirtualHost) -> None:
    """queue.declare passive on a missing queue: 404 "no queue 'q' in vhost '/'"."""
    with pytest.raises(NotFound) as err:
        vhost.declare_queue("q", owner=ME, passive=True)
    assert err.value.reply_text == "no queue 'q' in vhost '/'"
    assert "q" not in vhost.queues


def test_passive_declare_returns_the_queue(vhost: VirtualHost) -> None:
    """A passive declare of an existing queue returns it with its counts."""
    q = vhost.declare_queue("q", owner=ME, durable=True)
    vhost.publish("", message("q"))
    found = vhost.declare_queue("q", owner=OTHER, passive=True)
    assert found is q and found.message_count == 1


def test_declaring_reserved_amq_queue_is_access_refused(vhost: VirtualHost) -> None:
    """Declaring a queue named amq.* is refused with 403 (the prefix is reserved)."""
    with pytest.raises(AccessRefused, match=r"^queue name 'amq\.q' contains reserved prefix 'amq\.\*'$"):
        vhost.declare_queue("amq.q", owner=ME)


def test_redeclaring_queue_with_other_durability_is_precondition_failed(vhost: VirtualHost) -> None:
    """Redeclare with a different durable flag: 406 with RabbitMQ's text."""
    vhost.declare_queue("q", owner=ME)
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_queue("q", owner=ME, durable=True)
    assert err.value.reply_text == (
        "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
    )


def test_redeclaring_queue_with_other_auto_delete_or_arguments_is_precondition_failed(vhost: VirtualHost) -> None:
    """Redeclare with a different auto_delete or x-argument: 406 naming it."""
    vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 2000})
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'auto_delete'"):
        vhost.declare_queue("q", owner=ME, auto_delete=True, arguments={"x-message-ttl": 2000})
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000})
    assert err.value.reply_text == (
        "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
        "received the value '1000' of type 'signedint' but current is the value '2000' of type 'signedint'"
    )
    # Arguments RabbitMQ does not check, and an explicit classic queue type, are equivalent.
    same = vhost.declare_queue(
        "q", owner=ME, arguments={"x-message-ttl": 2000, "x-queue-type": "classic", "custom": 1}
    )
    assert same is vhost.queues["q"]


def test_exclusive_queue_of_another_connection_is_resource_locked(vhost: VirtualHost) -> None:
    """Another connection using an exclusive queue: 405 "cannot obtain exclusive access to locked queue"."""
    vhost.declare_queue("q", owner=ME, exclusive=True)
    expected = (
        "cannot obtain exclusive access to locked queue 'q' in vhost '/'. It could be originally "
        "declared on another connection or the exclusive property value does not match that of "
        "the original declaration."
    )
    for action in (
        lambda: vhost.declare_queue("q", owner=OTHER, exclusive=True),
        lambda: vhost.declare_queue("q", owner=OTHER, passive=True),
        lambda: vhost.queue("q", owner=OTHER),
        lambda: vhost.purge_queue("q", owner=OTHER),
        lambda: vhost.delete_queue("q", owner=OTHER),
        lambda: vhost.bind_queue("q", "amq.direct", "k", owner=OTHER),
    ):
        with pytest.raises(ResourceLocked) as err:
            action()
        assert err.value.reply_code == 405 and err.value.reply_text == expected
    assert vhost.queue("q", owner=ME) is vhost.queues["q"]


def test_exclusive_flag_mismatch_on_redeclare_is_resource_locked(vhost: VirtualHost) -> None:
    """RabbitMQ: redeclaring with another exclusive flag is 405, even on the owning connection."""
    vhost.declare_queue("shared", owner=ME)
    with pytest.raises(ResourceLocked):
        vhost.declare_queue("shared", owner=ME, exclusive=True)
    vhost.declare_queue("mine", owner=ME, exclusive=True)
    with pytest.raises(ResourceLocked):
        vhost.declare_queue("mine", owner=ME)
    assert vhost.declare_queue("mine", owner=ME, exclusive=True) is vhost.queues["mine"]


def test_exclusive_queue_is_never_durable(vhost: VirtualHost) -> None:
    """RabbitMQ: an exclusive queue dies with its connection, so it is declared non-durable."""
    q = vhost.declare_queue("q", owner=ME, exclusive=True, durable=True)
    assert not q.durable
    assert vhost.declare_queue("q", owner=ME, exclusive=True, durable=True) is q


def test_every_queue_is_bound_to_the_default_exchange_by_name(vhost: VirtualHost) -> None:
    """Every queue is bound to the default exchange with its name as routing key."""
    q = vhost.declare_queue("orders", owner=ME)
    assert vhost.exchanges[""].is_bound("orders")
    routed, _ = vhost.publish("", message("orders"))[:2]
    assert routed == 1 and q.message_count == 1
    assert vhost.publish("", message("nobody"))[:2] == (0, [])


def test_binding_to_or_from_the_default_exchange_is_access_refused(vhost: VirtualHost) -> None:
    """queue.bind/unbind on the default exchange: 403 "operation not permitted on the default exchange"."""
    vhost.declare_queue("q", owner=ME)
    with pytest.raises(AccessRefused, match="default exchange"):
        vhost.bind_queue("q", "", "other", owner=ME)
    with pytest.raises(AccessRefused, match="default exchange"):
        vhost.unbind_queue("q", "", "q", owner=ME)
    assert vhost.exchanges[""].route("other") == set()


def test_binding_missing_queue_or_exchange_is_not_found(vhost: VirtualHost) -> None:
    """queue.bind naming a missing exchange or queue: 404 naming it."""
    vhost.declare_queue("q", owner=ME)
    with pytest.raises(NotFound, match=r"^no exchange 'x' in vhost '/'$"):
        vhost.bind_queue("q", "x", "k", owner=ME)
    with pytest.raises(NotFound, match=r"^no queue 'nope' in vhost '/'$"):
        vhost.bind_queue("nope", "amq.direct", "k", owner=ME)


def test_unbinding_a_missing_queue_or_exchange_succeeds(vhost: VirtualHost) -> None:
    """RabbitMQ 3.10 answers queue.unbind-ok when the queue, the exchange or both are gone
    (checked against rabbitmq-server 3.10.8): aio-pika's RPC.close unbinds its auto-delete
    queue from an auto-delete exchange that went with the queue's last consumer."""
    vhost.declare_queue("q", owner=ME)
    vhost.unbind_queue("nope", "amq.direct", "k", owner=ME)
    vhost.unbind_queue("q", "nope", "k", owner=ME)
    vhost.unbind_queue("nope", "nope", "k", owner=ME)
    other = ("another", "connection")
    vhost.declare_queue("theirs", owner=other, exclusive=True)
    vhost.bind_queue("theirs", "amq.direct", "k", owner=other)
    with pytest.raises(ResourceLocked):  # an existing exclusive queue is still theirs
        vhost.unbind_queue("theirs", "amq.direct", "k", owner=ME)


def test_unbinding_a_missing_binding_succeeds(vhost: VirtualHost) -> None:
    """RabbitMQ 3.x replies unbind-ok for a binding that does not exist."""
    vhost.declare_queue("q", owner=ME)
    vhost.unbind_queue("q", "amq.direct", "never-bound", owner=ME)
    assert not vhost.exchanges["amq.direct"].has_bindings


def test_bind_then_publish_routes_each_matching_queue_once(vhost: VirtualHost) -> None:
    """basic.publish enqueues on every matched queue exactly once; refs count the queues."""
    vhost.declare_exchange("logs", "topic")
    q1, q2 = vhost.declare_queue("q1", owner=ME), vhost.declare_queue("q2", owner=ME)
    vhost.bind_queue("q1", "logs", "app.*", owner=ME)
    vhost.bind_queue("q1", "logs", "#.error", owner=ME)
    vhost.bind_queue("q2", "logs", "#", owner=ME)
    m = message("app.error")
    routed, notify = vhost.publish("logs", m)[:2]
    assert routed == 2 and notify == []
    assert m.refs == 2 and q1.message_count == 1 and q2.message_count == 1


def test_publish_returns_consumers_to_notify(vhost: VirtualHost) -> None:
    """basic.publish returns the consumers to notifyWork: one interested acquiring consumer per queue."""
    q = vhost.declare_queue("q", owner=ME)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    routed, notify = vhost.publish("", message("q"))[:2]
    assert routed == 1 and notify == [a]


def test_unroutable_publish_leaves_message_to_the_runtime(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A message routed nowhere has no references and on_drop is not called (the runtime returns or frees it)."""
    m = message("nowhere")
    assert vhost.publish("amq.direct", m)[:2] == (0, [])
    assert m.refs == 0 and dropped == []


def test_purge_queue_returns_count(vhost: VirtualHost, dropped: list[Message]) -> None:
    """queue.purge returns the number of messages purged and drops their bodies."""
    vhost.declare_queue("q", owner=ME)
    for _ in range(3):
        vhost.publish("", message("q"))
    assert vhost.purge_queue("q", owner=ME) == 3
    assert len(dropped) == 3 and vhost.queues["q"].message_count == 0


def test_delete_queue_if_unused_and_if_empty(vhost: VirtualHost) -> None:
    """queue.delete if-unused/if-empty: 406 "... in use" / "... not empty"; otherwise the count and consumers."""
    q = vhost.declare_queue("q", owner=ME)
    c = consumer("c")
    q.add_consumer(c)
    vhost.publish("", message("q"))
    with pytest.raises(PreconditionFailed, match=r"^queue 'q' in vhost '/' in use$"):
        vhost.delete_queue("q", owner=ME, if_unused=True)
    with pytest.raises(PreconditionFailed, match=r"^queue 'q' in vhost '/' not empty$"):
        vhost.delete_queue("q", owner=ME, if_empty=True)
    assert vhost.delete_queue("q", owner=ME) == (1, [c])
    assert "q" not in vhost.queues and not vhost.exchanges[""].is_bound("q")


def test_deleting_missing_queue_succeeds(vhost: VirtualHost) -> None:
    """RabbitMQ 3.x: queue.delete of a missing queue replies delete-ok with 0 messages."""
    assert vhost.delete_queue("nope", owner=ME) == (0, [])


def test_deleted_queue_loses_its_bindings(vhost: VirtualHost) -> None:
    """Deleting a queue removes its bindings; a new queue of the same name starts unbound."""
    vhost.declare_queue("q", owner=ME)
    vhost.bind_queue("q", "amq.fanout", "", owner=ME)
    vhost.delete_queue("q", owner=ME)
    assert not vhost.exchanges["amq.fanout"].has_bindings
    vhost.declare_queue("q", owner=ME)
    assert vhost.publish("amq.fanout", message())[:2] == (0, [])


def test_auto_delete_queue_goes_with_last_consumer(vhost: VirtualHost, dropped: list[Message]) -> None:
    """If the queue is auto-delete and the subscription removed is the last one, the queue is deleted."""
    q = vhost.declare_queue("q", owner=ME, auto_delete=True)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    vhost.publish("", message("q"))
    vhost.remove_consumer(q, a)
    assert "q" in vhost.queues
    assert vhost.remove_consumer("q", b) == []
    assert "q" not in vhost.queues and q.deleted
    assert len(dropped) == 1


def test_auto_delete_queue_without_consumers_stays(vhost: VirtualHost) -> None:
    """An auto-delete queue that never had a consumer is not deleted (basic.get users keep it)."""
    q = vhost.declare_queue("q", owner=ME, auto_delete=True)
    vhost.publish("", message("q"))
    assert q.get() is not None
    assert "q" in vhost.queues and not q.should_auto_delete


def test_exclusive_queues_go_with_their_connection(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Exclusive queues belong to their connection and are deleted when it closes."""
    mine = vhost.declare_queue("mine", owner=ME, exclusive=True)
    vhost.declare_queue("theirs", owner=OTHER, exclusive=True)
    vhost.declare_queue("shared", owner=ME)
    c = consumer("c")
    mine.add_consumer(c)
    vhost.publish("", message("mine"))
    assert vhost.queues_owned_by(ME) == [mine]
    assert vhost.delete_owned_queues(ME) == [c]
    assert set(vhost.queues) == {"theirs", "shared"}
    assert vhost.queues_owned_by(ME) == [] and len(dropped) == 1
