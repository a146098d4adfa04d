"""The definitions' WAL checkpointed off the event loop (broker.storage.wal_checkpoint): a commit
returns with its batch in the WAL, the checkpoint empties it on a thread, and the next commit
waits for that checkpoint, so the WAL never holds two batches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import outcome
import pytest

from broker.storage.definition_store import DefinitionStore
from broker.topology.definitions import QueueDef


class HeldThreads:
    """A ``start`` that runs nothing until told: the checkpoints begun, in order."""

    def __init__(self) -> None:
        self.begun: list[tuple[Callable[[], object], Callable[[Any], object]]] = []

    def __call__(self, fn: Callable[[], object], deliver: Callable[[Any], object]) -> None:
        self.begun.append((fn, deliver))

    def run_next(self) -> None:
        fn, deliver = self.begun.pop(0)
        deliver(outcome.capture(fn))


@pytest.fixture
def held(tmp_path: Path) -> tuple[DefinitionStore, HeldThreads]:
    store = DefinitionStore(tmp_path / "definitions.db")
    threads = HeldThreads()
    store.checkpoint_off_loop(threads)
    return store, threads


def wal(store: DefinitionStore) -> int:
    path = store.path.with_name(store.path.name + "-wal")
    return path.stat().st_size if path.exists() else 0


def test_a_commit_returns_before_its_checkpoint_which_then_empties_the_wal(
        held: tuple[DefinitionStore, HeldThreads]) -> None:
    store, threads = held
    store.apply([QueueDef("q1", False, {})])
    assert len(threads.begun) == 1 and wal(store) > 0  # committed: in the WAL, on disk
    threads.run_next()
    assert wal(store) == 0
    store.close()


def test_the_next_commit_waits_for_the_last_checkpoint(
        held: tuple[DefinitionStore, HeldThreads]) -> None:
    store, threads = held
    store.apply([QueueDef("q1", False, {})])
    generation = store.generation
    second = threading.Thread(target=store.apply, args=([QueueDef("q2", False, {})],))
    second.start()
    second.join(0.5)
    assert second.is_alive() and store.generation == generation  # not committed meanwhile
    threads.run_next()  # q1's checkpoint: the WAL is empty before q2 goes in
    second.join(10)
    assert not second.is_alive() and store.generation == generation + 1
    assert [q.name for q in store.load().queues] == ["q1", "q2"]
    threads.run_next()
    store.close()


def test_without_a_thread_the_store_checkpoints_as_it_commits(tmp_path: Path) -> None:
    store = DefinitionStore(tmp_path / "definitions.db")
    store.apply([QueueDef("q1", False, {})])
    assert wal(store) == 0
    store.close()
