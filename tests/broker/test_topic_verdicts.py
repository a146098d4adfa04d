"""broker.runtime.topic_verdicts: topic-permission verdicts of the publish path, kept until a change."""

from __future__ import annotations

from broker.permissions import TopicTable
from broker.runtime.topic_verdicts import TopicVerdicts


def _table() -> TopicTable:
    return {"alice": {"/": {"amq.topic": ("^{username}\\.", ".*")}}}


def test_verdicts_are_rabbitmqs_rules() -> None:
    """The write regex, variables expanded, searched in the routing key; no entry: allowed."""
    verdicts = TopicVerdicts(_table())
    assert verdicts.allowed("alice", "/", "amq.topic", "alice.orders")
    assert not verdicts.allowed("alice", "/", "amq.topic", "bob.orders")
    assert verdicts.allowed("alice", "/", "other", "bob.orders")  # no entry for that exchange
    assert verdicts.allowed("bob", "/", "amq.topic", "bob.orders")  # none for that user


def test_a_verdict_is_kept_until_clear() -> None:
    """A verdict given once is not worked out again; after ``clear`` (a permission changed) the
    table as it is now decides."""
    table = _table()
    verdicts = TopicVerdicts(table)
    assert not verdicts.allowed("alice", "/", "amq.topic", "bob.x")
    table["alice"]["/"]["amq.topic"] = ("^bob\\.", ".*")  # changed in place, not yet told
    assert not verdicts.allowed("alice", "/", "amq.topic", "bob.x")
    verdicts.clear()
    assert verdicts.allowed("alice", "/", "amq.topic", "bob.x")
    assert not verdicts.allowed("alice", "/", "amq.topic", "alice.x")


def test_the_table_of_verdicts_is_bounded() -> None:
    """Ever-new routing keys keep at most ``limit`` verdicts: a full table starts again."""
    table = _table()
    verdicts = TopicVerdicts(table, limit=3)
    for n in range(10):
        assert verdicts.allowed("alice", "/", "amq.topic", f"alice.{n}")
        assert len(verdicts) <= 3
    table["alice"]["/"]["amq.topic"] = ("^nobody$", ".*")
    assert verdicts.allowed("alice", "/", "amq.topic", "alice.9")  # kept since the last restart
    assert not verdicts.allowed("alice", "/", "amq.topic", "alice.0")  # dropped: asked again
