"""Body references stay exact under every feature: each body is handed back once, never while in use."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.messages.message import Message
from broker.queues.queue_entry import QueueEntry
from broker.topology.vhost import VirtualHost
from tests.broker.support import EPOCH, ME, message

QUEUES: dict[str, dict[str, Any]] = {
    "plain": {},
    "ttl": {"x-message-ttl": 500, "x-dead-letter-exchange": "dlx"},
    "short": {"x-max-length": 2, "x-dead-letter-exchange": "dlx"},
    "refuse": {"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "dlx"},
    "prio": {"x-max-priority": 5, "x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"},
    "groups": {"qpid.shared_msg_group": 1, "holdOnPublishEnabled": True},
    "loop": {"x-dead-letter-exchange": "dlx", "x-message-ttl": 300},
}

publish = st.tuples(
    st.just("publish"),
    st.sampled_from(["", "amq.fanout", "fan"]),
    st.sampled_from([*sorted(QUEUES), "dlq", "nowhere"]),
    st.one_of(st.none(), st.sampled_from(["0", "200", "900"])),
    st.integers(0, 9),
    st.sampled_from([None, "a", "b"]),
)
ops = st.one_of(
    publish,
    st.tuples(st.sampled_from(["get", "release", "settle", "discard"]), st.sampled_from([*sorted(QUEUES), "dlq"])),
    st.tuples(st.just("tick"), st.floats(0.0, 0.6)),
    st.tuples(st.just("purge"), st.sampled_from(sorted(QUEUES))),
)


def _setup() -> tuple[VirtualHost, list[Message]]:
    dropped: list[Message] = []
    vhost = VirtualHost("/", on_drop=dropped.append, epoch_offset=EPOCH)
    vhost.declare_exchange("dlx", "fanout")
    vhost.declare_exchange("fan", "fanout", arguments={"alternate-exchange": "amq.fanout"})
    vhost.declare_queue("dlq", owner=ME)
    vhost.bind_queue("dlq", "dlx", "", owner=ME)
    for name, arguments in QUEUES.items():
        vhost.declare_queue(name, owner=ME, arguments=arguments)
        vhost.bind_queue(name, "amq.fanout", "", owner=ME)
    vhost.bind_queue("loop", "dlx", "", owner=ME)  # dead letters come back: cycles
    return vhost, dropped


def _live(vhost: VirtualHost, held: list[QueueEntry]) -> set[int]:
    bodies = {id(e.message.origin or e.message) for q in vhost.queues.values() for e in q.entries()}
    return bodies | {id(e.message.origin or e.message) for e in held}


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=60))
def test_every_body_is_dropped_once_and_only_when_unused(steps: list[tuple[Any, ...]]) -> None:
    """Whatever mix of TTL, limits, dead-lettering, priorities, groups and holds: on_drop once per body, never early."""
    vhost, dropped = _setup()
    held: list[QueueEntry] = []
    published: list[Message] = []
    unroutable: list[Message] = []
    now = 0.0
    for step in steps:
        kind = step[0]
        if kind == "publish":
            _, exchange, key, expiration, priority, group = step
            m = message(key, headers={"JMSXGroupID": group} if group else None, exchange=exchange,
                        expiration=expiration, priority=priority)
            routed, _ = vhost.publish(exchange, m, now=now)[:2]
            (published if routed else unroutable).append(m)
        elif kind == "get":
            entry = vhost.queues[step[1]].get(now=now)
            if entry is not None:
                held.append(entry)
        elif kind == "tick":
            now += step[1]
            vhost.tick(now)
        elif kind == "purge":
            vhost.purge_queue(step[1], owner=ME)
        else:
            mine = [e for e in held if e.queue.name == step[1]]
            if mine:
                held.remove(mine[0])
                getattr(mine[0].queue, kind)(mine[0])
        vhost.drain()
        assert len({id(m) for m in dropped}) == len(dropped)
        assert not {id(m) for m in dropped} & _live(vhost, held)
        for q in vhost.queues.values():
            assert q.message_count == len([e for e in q.entries() if e not in q.acquired_entries()])
    for entry in held:
        entry.queue.settle(entry)
    for name in list(vhost.queues):
        vhost.delete_queue(name, owner=ME)
    vhost.drain()
    assert sorted(map(id, dropped)) == sorted(map(id, published))
    assert all(m.refs == 0 for m in published + unroutable)
