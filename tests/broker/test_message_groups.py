"""Message groups (Qpid qpid.group_header_key / qpid.shared_msg_group): one consumer per group at a time."""

from __future__ import annotations

from collections.abc import Mapping

from broker.messages.message import Message
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, keys, message

SHARED = {"qpid.group_header_key": "grp", "qpid.shared_msg_group": 1}
STANDARD = {"qpid.group_header_key": "grp"}


def _grouped(vhost: VirtualHost, arguments: Mapping[str, object], *groups: str | None) -> tuple[Queue, list[Message]]:
    q = vhost.declare_queue("q", owner=ME, arguments=arguments)
    sent = [message(headers=None if g is None else {"grp": g}) for g in groups]
    for m in sent:
        vhost.publish("", m)
    return q, sent


def test_other_consumers_skip_a_group_held_by_a_consumer(vhost: VirtualHost) -> None:
    """While a consumer holds unacked messages of a group, other consumers skip that group's messages."""
    q, sent = _grouped(vhost, SHARED, "g1", "g1", "g2")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert [e.message for e in q.pull(a, 1)[0]] == [sent[0]]
    assert [e.message for e in q.pull(b, 10)[0]] == [sent[2]]
    assert [e.message for e in q.pull(a, 10)[0]] == [sent[1]]


def test_settling_the_last_message_frees_the_group_and_notifies(vhost: VirtualHost) -> None:
    """Shared groups: when the holder settles its last message of the group, a blocked message becomes available."""
    q, sent = _grouped(vhost, SHARED, "g", "g")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    (first,), _ = q.pull(a, 1)
    assert q.pull(b, 10) == ([], False)
    assert keys(q.settle(first)) == ["b"]
    assert [e.message for e in q.pull(b, 10)[0]] == [sent[1]]


def test_requeueing_the_last_message_frees_the_group(vhost: VirtualHost) -> None:
    """A group whose in-flight message is requeued may go to any consumer, starting at that message."""
    q, sent = _grouped(vhost, SHARED, "g", "g")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    (first,), _ = q.pull(a, 1)
    q.release(first)
    assert [e.message for e in q.pull(b, 10)[0]] == sent


def test_new_message_of_a_held_group_notifies_its_holder(vhost: VirtualHost) -> None:
    """A new message of a group held by a consumer wakes that consumer, not another."""
    q, _ = _grouped(vhost, SHARED, "g")
    a, b = consumer("a"), consumer("b")
    attach(q, a)
    q.pull(a, 1)
    attach(q, b)
    assert keys(q.consumers.interested()) == ["a", "b"]
    assert vhost.publish("", message(headers={"grp": "g"}))[1] == [a]
    assert vhost.publish("", message(headers={"grp": "other"}))[1] == [b]


def test_shared_groups_put_ungrouped_messages_in_the_default_group(vhost: VirtualHost) -> None:
    """Qpid: messages without the group header form the default group "qpid.no-group", one consumer at a time."""
    q, _ = _grouped(vhost, SHARED, None, None)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    q.pull(a, 1)
    assert q.pull(b, 10) == ([], False)


def test_standard_groups_stay_with_their_consumer_until_it_goes(vhost: VirtualHost) -> None:
    """Standard groups (Broker-J): a group stays assigned after acks, until its consumer is removed."""
    q, sent = _grouped(vhost, STANDARD, "g", "g")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    (first,), _ = q.pull(a, 1)
    assert q.settle(first) == []
    assert q.pull(b, 10) == ([], False)
    assert keys(vhost.remove_consumer(q, a)) == ["b"]
    assert [e.message for e in q.pull(b, 10)[0]] == [sent[1]]


def test_standard_groups_let_ungrouped_messages_go_to_anyone(vhost: VirtualHost) -> None:
    """Standard groups: a message without the group header belongs to no group."""
    q, _ = _grouped(vhost, STANDARD, None, None)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert len(q.pull(a, 1)[0]) == 1 and len(q.pull(b, 1)[0]) == 1


def test_basic_get_skips_held_groups_and_holds_its_own(vhost: VirtualHost) -> None:
    """basic.get takes no message of a group a consumer holds; in shared mode it holds its group until settled."""
    q, sent = _grouped(vhost, SHARED, "g1", "g2", "g2")
    a = consumer("a")
    attach(q, a)
    q.pull(a, 1)  # a holds g1
    got = q.get()
    assert got is not None and got.message is sent[1]
    assert q.pull(a, 10) == ([], False)  # g2 is held by the get
    q.settle(got)
    assert [e.message for e in q.pull(a, 10)[0]] == [sent[2]]


def test_messages_of_a_group_keep_their_order(vhost: VirtualHost) -> None:
    """Within a group messages are delivered in order, whichever consumer frees and takes the group."""
    q, sent = _grouped(vhost, SHARED, "g", "h", "g", "h", "g")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    taken_a, _ = q.pull(a, 10)
    taken_b, _ = q.pull(b, 10)
    assert [e.message for e in taken_a] == [sent[0], sent[1], sent[2], sent[3], sent[4]]
    assert taken_b == []
