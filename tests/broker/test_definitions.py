"""Durable topology: the journal the virtual host keeps, the SQLite store, restoring from it,
and the data directory's lock (broker.topology.definitions, broker.storage.definition_store,
broker.storage.data_dir)."""

from __future__ import annotations

import datetime
import os
import sqlite3
from pathlib import Path

import pytest

from broker.queues.consumer_manager import QueueConsumer
from broker.storage.data_dir import DataDir, DataDirInUse, default_data_dir
from broker.storage.definition_store import DefinitionStore, DefinitionStoreError, restore
from broker.topology.definitions import (
    BindingDef,
    Definitions,
    ExchangeDef,
    QueueDef,
    Removed,
    TopologyJournal,
    Unbound,
)
from broker.topology.vhost import VirtualHost

ME = ("w0", 1)


@pytest.fixture
def store(tmp_path: Path) -> DefinitionStore:
    s = DefinitionStore(tmp_path / "definitions.db")
    yield s
    s.close()


def reopened(store: DefinitionStore) -> Definitions:
    store.close()
    again = DefinitionStore(store.path)
    try:
        return again.load()
    finally:
        again.close()


@pytest.fixture
def vhost() -> VirtualHost:
    v = VirtualHost("/")
    v.journal = TopologyJournal()
    return v


def durable_topology(v: VirtualHost) -> tuple[set[tuple], set[tuple], set[tuple]]:
    """What a restart must bring back, read from a live virtual host."""
    exchanges = {(x.name, x.type, x.auto_delete, x.internal, tuple(sorted(x.arguments.items())))
                 for x in v.exchanges.values() if x.durable and x.name and not x.name.startswith("amq.")}
    queues = {(q.name, q.auto_delete, tuple(sorted(q.arguments.items())))
              for q in v.queues.values() if q.durable}
    bindings = set()
    for x in v.exchanges.values():
        if not x.name:
            continue
        for b in x.bindings():
            dest = getattr(b.destination, "name", b.destination)
            to_exchange = not isinstance(b.destination, str)
            dest_durable = (v.exchanges[dest].durable if to_exchange else v.queues[dest].durable)
            if x.durable and dest_durable:
                bindings.add((x.name, dest, to_exchange, b.routing_key, tuple(sorted(b.arguments.items()))))
    return exchanges, queues, bindings


# --------------------------------------------------------------------------- the store


def test_store_gives_back_what_it_was_given_in_creation_order(store: DefinitionStore) -> None:
    changes = [
        ExchangeDef("orders", "topic", False, False, {"alternate-exchange": "ae"}),
        ExchangeDef("ae", "fanout", True, True, {}),
        QueueDef("q1", False, {"x-message-ttl": 60000, "x-queue-mode": "lazy"}),
        QueueDef("q0", True, {}),
        BindingDef("orders", "q1", False, "a.*", {}),
        BindingDef("orders", "ae", True, "#", {}),
    ]
    store.apply(changes)
    assert reopened(store) == Definitions(
        exchanges=[changes[0], changes[1]], queues=[changes[2], changes[3]], bindings=[changes[4], changes[5]])


def test_argument_tables_come_back_with_their_types(store: DefinitionStore) -> None:
    args = {"x-match": "all", "n": 2**40, "f": 1.5, "t": True, "raw": b"\x00\xff",
            "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            "nested": {"list": [1, "two", {"three": None}]}}
    store.apply([ExchangeDef("h", "headers", False, False, {}), QueueDef("q", False, {}),
                 BindingDef("h", "q", False, "", args)])
    (binding,) = reopened(store).bindings
    assert binding.arguments == args
    assert type(binding.arguments["raw"]) is bytes and type(binding.arguments["t"]) is bool


def test_unbind_matches_a_table_whatever_its_key_order(store: DefinitionStore) -> None:
    store.apply([BindingDef("h", "q", False, "", {"a": 1, "b": {"y": 2, "x": 1}})])
    store.apply([Unbound(BindingDef("h", "q", False, "", {"b": {"x": 1, "y": 2}, "a": 1}))])
    assert reopened(store).bindings == []


def test_binding_twice_is_one_row(store: DefinitionStore) -> None:
    b = BindingDef("x", "q", False, "k", {})
    store.apply([b, b])
    store.apply([b])
    assert reopened(store).bindings == [b]


def test_a_removed_queue_takes_its_bindings_and_only_those(store: DefinitionStore) -> None:
    store.apply([QueueDef("q", False, {}), QueueDef("other", False, {}),
                 BindingDef("x", "q", False, "k", {}), BindingDef("x", "other", False, "k", {}),
                 BindingDef("x", "q", True, "k", {})])  # an exchange that happens to be named q
    store.apply([Removed("queue", "q")])
    loaded = reopened(store)
    assert [q.name for q in loaded.queues] == ["other"]
    assert loaded.bindings == [BindingDef("x", "other", False, "k", {}), BindingDef("x", "q", True, "k", {})]


def test_a_removed_exchange_takes_the_bindings_from_it_and_to_it(store: DefinitionStore) -> None:
    store.apply([ExchangeDef("x", "direct", False, False, {}), ExchangeDef("y", "direct", False, False, {}),
                 BindingDef("x", "q", False, "k", {}), BindingDef("y", "x", True, "k", {}),
                 BindingDef("y", "q", False, "k", {}), BindingDef("y", "x", False, "k", {})])
    store.apply([Removed("exchange", "x")])
    loaded = reopened(store)
    assert [x.name for x in loaded.exchanges] == ["y"]
    # A queue named x keeps its binding from y: only the exchange x went.
    assert loaded.bindings == [BindingDef("y", "q", False, "k", {}), BindingDef("y", "x", False, "k", {})]


def test_a_batch_that_fails_part_way_leaves_nothing(store: DefinitionStore) -> None:
    store.apply([QueueDef("kept", False, {})])
    with pytest.raises(ValueError, match="not a definition change"):
        store.apply([QueueDef("half", False, {}), "junk"])  # type: ignore[list-item]
    assert [q.name for q in reopened(store).queues] == ["kept"]


def test_a_file_that_is_not_a_database_is_reported_by_name(tmp_path: Path) -> None:
    path = tmp_path / "definitions.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DefinitionStoreError, match=str(path)):
        DefinitionStore(path)


def test_a_store_from_a_newer_shoal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "definitions.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(DefinitionStoreError, match="newer Shoal"):
        DefinitionStore(path)


# --------------------------------------------------------------------------- the journal


def test_durable_declares_are_journaled_and_transient_ones_are_not(vhost: VirtualHost) -> None:
    vhost.declare_exchange("dx", "direct", durable=True, arguments={"alternate-exchange": "ae"})
    vhost.declare_exchange("tx", "direct")
    vhost.declare_queue("dq", owner=ME, durable=True, arguments={"x-max-length": 10})
    vhost.declare_queue("tq", owner=ME)
    vhost.declare_queue("eq", owner=ME, durable=True, exclusive=True)  # exclusive: never durable
    vhost.declare_queue("dq", owner=ME, durable=True, arguments={"x-max-length": 10})  # redeclare
    assert vhost.journal.take() == [
        ExchangeDef("dx", "direct", False, False, {"alternate-exchange": "ae"}),
        QueueDef("dq", False, {"x-max-length": 10}),
    ]
    assert vhost.journal.take() == []


def test_a_binding_is_journaled_when_both_ends_are_durable(vhost: VirtualHost) -> None:
    vhost.declare_exchange("dx", "topic", durable=True)
    vhost.declare_exchange("dx2", "fanout", durable=True)
    vhost.declare_exchange("tx", "topic")
    vhost.declare_queue("dq", owner=ME, durable=True)
    vhost.declare_queue("tq", owner=ME)
    vhost.journal.take()
    vhost.bind_queue("dq", "dx", "a.#", owner=ME)
    vhost.bind_queue("dq", "dx", "a.#", owner=ME)  # twice: one binding
    vhost.bind_queue("tq", "dx", "a.#", owner=ME)
    vhost.bind_queue("dq", "tx", "a.#", owner=ME)
    vhost.bind_exchange("dx2", "dx", "b")
    vhost.bind_exchange("tx", "dx", "b")
    assert vhost.journal.take() == [BindingDef("dx", "dq", False, "a.#", {}),
                                    BindingDef("dx", "dx2", True, "b", {})]
    vhost.unbind_queue("dq", "dx", "a.#", owner=ME)
    vhost.unbind_queue("dq", "dx", "a.#", owner=ME)  # not bound any more: nothing happens
    vhost.unbind_exchange("dx2", "dx", "b")
    assert vhost.journal.take() == [Unbound(BindingDef("dx", "dq", False, "a.#", {})),
                                    Unbound(BindingDef("dx", "dx2", True, "b", {}))]


def test_deletes_are_journaled_including_auto_deletes(vhost: VirtualHost) -> None:
    vhost.declare_exchange("ad", "direct", durable=True, auto_delete=True)
    vhost.declare_queue("adq", owner=ME, durable=True, auto_delete=True)
    vhost.declare_queue("gone", owner=ME, durable=True)
    vhost.bind_queue("adq", "ad", "k", owner=ME)
    consumer = QueueConsumer((0, 1, 0), "ctag")
    vhost.queues["adq"].add_consumer(consumer)
    vhost.journal.take()
    vhost.delete_queue("gone", owner=ME)
    # The auto-delete queue goes with its last consumer, and the auto-delete exchange with its
    # last binding (as the queue's bindings go, before the queue itself).
    vhost.remove_consumer("adq", consumer)
    assert vhost.journal.take() == [Removed("queue", "gone"), Removed("exchange", "ad"),
                                    Removed("queue", "adq")]
    vhost.declare_exchange("x", "direct", durable=True)
    vhost.delete_exchange("x")
    vhost.declare_exchange("t", "direct")
    vhost.delete_exchange("t")
    assert vhost.journal.take() == [ExchangeDef("x", "direct", False, False, {}), Removed("exchange", "x")]


# --------------------------------------------------------------------------- restoring


def test_a_journaled_topology_restores_to_the_same_durable_topology(
        vhost: VirtualHost, store: DefinitionStore) -> None:
    vhost.declare_exchange("orders", "topic", durable=True, arguments={"alternate-exchange": "ae"})
    vhost.declare_exchange("ae", "fanout", durable=True)
    vhost.declare_exchange("h", "headers", durable=True, internal=True)
    vhost.declare_exchange("temp", "direct")
    vhost.declare_queue("q1", owner=ME, durable=True, arguments={"x-message-ttl": 1000, "x-max-priority": 5})
    vhost.declare_queue("amq.gen-Abc", owner=ME, durable=True, reserved=True)
    vhost.declare_queue("tq", owner=ME)
    vhost.bind_queue("q1", "orders", "a.*", owner=ME)
    vhost.bind_queue("q1", "h", "", {"x-match": "any", "k": "v"}, owner=ME)
    vhost.bind_queue("amq.gen-Abc", "ae", "", owner=ME)
    vhost.bind_queue("tq", "orders", "#", owner=ME)
    vhost.bind_exchange("h", "orders", "b.#")
    vhost.bind_exchange("temp", "orders", "c.#")
    store.apply(vhost.journal.take())

    fresh = VirtualHost("/")
    assert restore(fresh, reopened(store)) == []
    assert durable_topology(fresh) == durable_topology(vhost)
    assert "tq" not in fresh.queues and "temp" not in fresh.exchanges
    assert fresh.queues["q1"].arguments == {"x-message-ttl": 1000, "x-max-priority": 5}
    assert fresh.exchanges["h"].internal


def test_restore_skips_what_it_cannot_declare_and_restores_the_rest() -> None:
    fresh = VirtualHost("/")
    skipped = restore(fresh, Definitions(
        exchanges=[ExchangeDef("bad", "no-such-type", False, False, {}), ExchangeDef("x", "direct", False, False, {})],
        queues=[QueueDef("badq", False, {"x-message-ttl": -1}), QueueDef("q", False, {})],
        bindings=[BindingDef("x", "badq", False, "k", {}), BindingDef("x", "q", False, "k", {})],
    ))
    assert len(skipped) == 3
    assert skipped[0].startswith("exchange 'bad': ") and skipped[1].startswith("queue 'badq': ")
    assert skipped[2].startswith("binding of 'x' to 'badq'")
    assert set(fresh.queues) == {"q"} and "x" in fresh.exchanges and "bad" not in fresh.exchanges
    assert [b.destination for b in fresh.exchanges["x"].bindings()] == ["q"]


# --------------------------------------------------------------------------- the data directory


def test_one_broker_per_data_directory(tmp_path: Path) -> None:
    first = DataDir(tmp_path / "data")
    try:
        with pytest.raises(DataDirInUse, match=rf"in use by another broker \(pid {os.getpid()}\)"):
            DataDir(tmp_path / "data")
    finally:
        first.close()
    second = DataDir(tmp_path / "data")  # free again once the first lets go
    second.close()
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700


def test_the_default_data_directory_is_per_user_and_per_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/somewhere/state")
    assert default_data_dir(5672) == Path("/somewhere/state/shoal/node-5672")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_data_dir(5673) == Path.home() / ".local/state/shoal/node-5673"
