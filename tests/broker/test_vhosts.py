"""Virtual hosts in the supervisor: each connection's requests go to the vhost its ConnOpen
named; queues of the same name in two vhosts are two queues; a deleted vhost takes its queues
and answers its connections 320; the index keys and the definitions store keep vhosts apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.messages.message import FullMessage
from broker.messages.message_journal import MessageJournal, queue_key, split_key
from broker.queues.graveyard import REAP
from broker.storage.definition_store import DefinitionStore
from broker.topology.definitions import QueueDef
from broker.topology.vhosts import VirtualHosts
from ipc import records as r
from tests.broker.dispatch_harness import W0, W1, Harness


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.d.add_vhost("a")
    harness.d.add_vhost("b")
    harness.send(W0, r.ConnOpen(1, "guest", "a"))
    harness.send(W0, r.ConnOpen(2, "guest", "b"))
    harness.send(W1, r.ConnOpen(1, "guest", "a"))
    return harness


def test_the_same_queue_name_in_two_vhosts_is_two_queues(h: Harness) -> None:
    """rabbit_amqqueue: a queue is named by (vhost, name)."""
    h.declare("q", conn=1)
    h.declare("q", conn=2)
    assert h.d.vhosts.get("a").queues["q"] is not h.d.vhosts.get("b").queues["q"]  # type: ignore[union-attr]
    assert "q" not in h.d.vhost.queues  # "/" has none


def test_a_publish_reaches_the_queue_of_its_connections_vhost_only(h: Harness) -> None:
    """Publishes are routed by the exchanges of the publisher's vhost."""
    h.declare("q", conn=1)
    h.declare("q", conn=2)
    h.publish("q")  # connection 1 of W0: vhost "a"
    a, b = h.d.vhosts.get("a"), h.d.vhosts.get("b")
    assert a is not None and b is not None
    assert (a.queues["q"].message_count, b.queues["q"].message_count) == (1, 0)


def test_a_consumer_of_one_vhost_is_not_woken_by_another(h: Harness) -> None:
    """notifyWork goes to the consumers of the queue the message joined."""
    h.declare("q", conn=1)
    h.declare("q", conn=2)
    h.consume("q", cid=1, slot=7, worker=W1, conn=1)  # W1 conn 1 is on "a" too
    h.send(W0, r.Publish(2, 1, "", "q", False, False, 512, 16, 100, None))  # on "b"
    assert h.woken(W1) == []
    h.publish("q")
    assert h.woken(W1) == [7]


def test_deleting_a_vhost_takes_its_queues_and_answers_its_connections_320(h: Harness) -> None:
    """rabbit_vhost:delete: everything in it goes; a request in flight gets 320."""
    h.declare("q", conn=1)
    h.d.delete_vhost("a")
    assert "a" not in h.d.vhosts
    h.send(W0, r.QueueDeclare(1, 1, "q2", False, False, False, False, {}, False))
    (error,) = h.events(W0)
    assert isinstance(error, r.Error)
    assert (error.code, error.text) == (320, "vhost 'a' is deleted")
    h.send(W0, r.ConnClose(1))
    h.declare("q", conn=2)  # "b" carries on
    assert "q" in h.d.vhosts.get("b").queues  # type: ignore[union-attr]


def test_index_keys_keep_bare_names_in_slash_and_come_apart_again() -> None:
    """A "/" queue's index records name it as before there were vhosts; others carry theirs."""
    assert queue_key("/", "orders") == "orders"
    for vhost, name in (("a", "orders"), ("a:b", "x:y"), ("", "q"), ("/", "orders")):
        assert split_key(queue_key(vhost, name)) == (vhost, name)
    assert queue_key("a", "q") != queue_key("b", "q")


def test_a_durable_queue_of_another_vhost_writes_keyed_records(h: Harness) -> None:
    """The one journal, each queue's records under its index key."""
    journal = h.d.vhosts.messages = MessageJournal()
    h.send(W0, r.QueueDeclare(1, 1, "d", False, True, False, False, {}, False))
    queue = h.d.vhosts.get("a").queues["d"]  # type: ignore[union-attr]
    message = FullMessage(0, "", "d", 1, 10, None)
    message.stored = journal.new_body(W0, 0, 0, 10)
    queue.enqueue(message)
    (record,) = journal.take()
    assert record[0] == "E" and split_key(record[1]) == ("a", "d")


def test_the_store_keeps_vhosts_and_deletes_everything_of_one(tmp_path: Path) -> None:
    """A new store has "/" only; a vhost's rows go with it, the others' stay."""
    store = DefinitionStore(tmp_path / "definitions.db")
    try:
        assert [v["name"] for v in store.vhosts()] == ["/"]
        store.put_vhost("a", "the a vhost", ["x"])
        store.apply([QueueDef("q", False, {})], "a")
        store.apply([QueueDef("q", False, {})], "/")
        store.put_permissions("guest", "a", (".*", ".*", ".*"))
        assert [(v["name"], v["description"], v["tags"]) for v in store.vhosts()] == [
            ("/", "Default virtual host", []), ("a", "the a vhost", ["x"])]
        assert store.delete_vhost("a") is True
        assert [v["name"] for v in store.vhosts()] == ["/"]
        assert store.load("a").queues == [] and [q.name for q in store.load("/").queues] == ["q"]
        assert "a" not in store.permissions().get("guest", {})
        assert store.delete_vhost("a") is False
    finally:
        store.close()


def test_one_tick_does_one_graveyard_slice_however_many_vhosts() -> None:
    """The vhosts share the graveyard's line and its budget (docs/design.md, Bounded step): a
    timer tick refills it once, not once per vhost."""
    vhosts = VirtualHosts(None)
    for name in ("/", "a", "b"):
        vhosts.add(name)
    vhosts.sliced.slices[REAP] = 10
    done: list[int] = []

    def job(n: int) -> int:
        done.append(n)
        return n  # never finished: it takes whatever a step allows

    vhosts.get("a").defer(job)  # type: ignore[union-attr]
    done.clear()  # what the defer itself ran, in the step under way
    vhosts.tick(1.0)
    assert sum(done) == 10
    vhosts.tick(2.0)
    assert sum(done) == 20

