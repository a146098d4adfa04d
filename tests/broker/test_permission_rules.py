"""broker.permissions: RabbitMQ's regex rules -- searched not anchored, "" is ^$ (matches no
resource name), {username}/{vhost} expanded in topic permissions, no topic entry allows."""

from __future__ import annotations

from broker.permissions import READ, WRITE, expand, granted, resource, search, topic_allowed


def test_searched_not_anchored() -> None:
    assert search("mid", "a-mid-z")
    assert not search("^mid", "a-mid-z")
    assert search(".*", "anything")


def test_empty_regex_matches_no_name() -> None:
    assert not search("", "q")
    assert not search("", "amq.default")


def test_invalid_regex_grants_nothing() -> None:
    assert not search("(", "(")


def test_default_exchange_is_amq_default() -> None:
    assert resource("") == "amq.default" and resource("x") == "x"


def test_granted_needs_an_entry() -> None:
    table = {"u": {"/": ("^c", "^w", "")}}
    assert granted(table, "u", "/", WRITE, "wq")
    assert not granted(table, "u", "/", READ, "wq")
    assert not granted(table, "v", "/", WRITE, "wq")
    assert not granted(table, "u", "other", WRITE, "wq")


def test_topic_expansion_and_default() -> None:
    topics = {"alice": {"/": {"amq.topic": ("^{username}\\.", "^{vhost}")}}}
    assert expand("{username}-{vhost}", "alice", "/") == "alice-/"
    assert topic_allowed(topics, "alice", "/", "amq.topic", "alice.x", WRITE)
    assert not topic_allowed(topics, "alice", "/", "amq.topic", "bob.x", WRITE)
    assert topic_allowed(topics, "alice", "/", "amq.topic", "/k", READ)
    assert topic_allowed(topics, "alice", "/", "other", "bob.x", WRITE)  # no entry: allowed
    assert topic_allowed(topics, "bob", "/", "amq.topic", "x", WRITE)
