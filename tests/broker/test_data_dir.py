"""A data directory that was ever initialised is never taken for a new one: the marker, the
node id in definitions.db, the digest and the generation (broker.storage.data_dir,
broker.storage.definition_store.open_definitions)."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.passwords import hashed
from broker.storage.data_dir import DataDir, DataDirDamaged
from broker.storage.definition_store import (
    DefinitionStore,
    DefinitionStoreError,
    GenerationFile,
    inspect,
    open_definitions,
)
from broker.topology.definitions import QueueDef

# The schema of the Shoal that wrote no marker (schema 1): what an upgraded directory holds.
_SCHEMA_1 = """
CREATE TABLE exchanges (seq INTEGER PRIMARY KEY AUTOINCREMENT, vhost TEXT NOT NULL,
    name TEXT NOT NULL, type TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL, arguments BLOB NOT NULL, UNIQUE (vhost, name));
CREATE TABLE queues (seq INTEGER PRIMARY KEY AUTOINCREMENT, vhost TEXT NOT NULL,
    name TEXT NOT NULL, auto_delete INTEGER NOT NULL, arguments BLOB NOT NULL,
    UNIQUE (vhost, name));
CREATE TABLE users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL);
CREATE TABLE bindings (seq INTEGER PRIMARY KEY AUTOINCREMENT, vhost TEXT NOT NULL,
    source TEXT NOT NULL, destination TEXT NOT NULL, to_exchange INTEGER NOT NULL,
    routing_key TEXT NOT NULL, arguments BLOB NOT NULL,
    UNIQUE (vhost, source, destination, to_exchange, routing_key, arguments));
"""


@pytest.fixture
def data(tmp_path: Path) -> Iterator[DataDir]:
    d = DataDir(tmp_path / "data")
    yield d
    d.close()


def first_start(data: DataDir, queues: tuple[str, ...] = ("orders",)) -> str:
    """What `shoal serve` does on a new directory: definitions, users, then the marker."""
    opened = open_definitions(data)
    assert opened.new and not opened.marked
    store = opened.store
    store.put_users(hashed({"admin": "S3cret"}))
    store.apply([QueueDef(q, False, {}) for q in queues])
    data.write_marker(store.node)
    store.close()
    return store.node


def files(data: DataDir) -> dict[str, bytes]:
    """What a refused start must leave as it was (the lock holds a PID; -shm is SQLite's
    index of the WAL, made from it)."""
    return {p.name: p.read_bytes() for p in data.path.iterdir()
            if p.is_file() and p.name != "lock" and not p.name.endswith("-shm")}


def refused(data: DataDir, file: str) -> str:
    before = files(data)
    with pytest.raises(DataDirDamaged) as caught:
        open_definitions(data)
    line = str(caught.value)
    assert line.startswith(f"{data.path / file}: ") and "\n" not in line
    assert "restore it from a backup, or move the data directory" in line
    assert files(data) == before, "a refused start changed the data directory"
    return line


def test_a_new_directory_is_new_once(data: DataDir) -> None:
    node = first_start(data)
    assert data.read_marker() == node
    opened = open_definitions(data)
    assert not opened.new and opened.marked and opened.store.node == node
    assert [q.name for q in opened.store.load().queues] == ["orders"]
    opened.store.close()


def test_a_marked_directory_without_definitions_is_refused(data: DataDir) -> None:
    """With the marker, a missing definitions.db is never replaced by a new one."""
    first_start(data)
    data.definitions.unlink()
    assert "missing or empty" in refused(data, "definitions.db")
    assert not data.definitions.exists()


def test_a_definitions_file_that_lost_its_content_is_refused(data: DataDir) -> None:
    first_start(data)
    data.definitions.unlink()
    sqlite3.connect(data.definitions).executescript(_SCHEMA_1).close()  # tables, no node
    assert "holds none of this data directory's definitions" in refused(data, "definitions.db")


def test_definitions_of_another_node_are_refused(tmp_path: Path, data: DataDir) -> None:
    first_start(data)
    other = DataDir(tmp_path / "other")
    first_start(other)
    other.close()
    shutil.copy(other.definitions, data.definitions)
    assert "belongs to node" in refused(data, "definitions.db")


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip-head", "flip-middle", "flip-tail"])
def test_a_damaged_marker_is_refused_by_name(data: DataDir, damage: str) -> None:
    first_start(data)
    raw = bytearray(data.marker.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "empty":
        raw = bytearray()
    else:
        at = {"flip-head": 0, "flip-middle": len(raw) // 2, "flip-tail": len(raw) - 4}[damage]
        raw[at:at + 4] = bytes(b ^ 0x5A for b in raw[at:at + 4])
    data.marker.write_bytes(bytes(raw))
    assert "damaged" in refused(data, "node.json")


def test_a_directory_from_a_shoal_without_marker_is_adopted(data: DataDir) -> None:
    """An upgraded directory keeps its definitions and users, gets a node id and is not new."""
    db = sqlite3.connect(data.definitions)
    db.executescript(_SCHEMA_1)
    db.execute("INSERT INTO users VALUES ('admin', ?)", (hashed({"a": "b"})["a"],))
    db.execute("INSERT INTO queues (vhost, name, auto_delete, arguments) VALUES ('/', 'q', 0, X'80')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    opened = open_definitions(data)
    assert not opened.new and not opened.marked
    assert list(opened.store.users()) == ["admin"]
    assert [q.name for q in opened.store.load().queues] == ["q"]
    data.write_marker(opened.store.node)
    opened.store.close()
    again = open_definitions(data)
    assert again.marked and not again.new and inspect(data.definitions).problem is None
    again.store.close()


def test_without_marker_queue_data_means_the_directory_was_in_use(data: DataDir) -> None:
    (data.path / "index").mkdir()
    (data.path / "index" / "00000001.idx").write_bytes(b"records")
    assert "holds queue data" in refused(data, "definitions.db")


def test_a_definitions_file_only_its_wal_held_is_refused_and_the_wal_kept(data: DataDir) -> None:
    """The state a Shoal that never checkpointed left at a kill -9, then a damaged WAL: SQLite
    sees an empty database; the start refuses and leaves the WAL as it was."""
    live = sqlite3.connect(data.path / "live.db", isolation_level=None)
    live.execute("PRAGMA journal_mode=WAL")
    live.executescript(_SCHEMA_1)
    live.execute("INSERT INTO users VALUES ('admin', 'x')")
    shutil.copy(data.path / "live.db", data.definitions)  # as a kill -9 leaves them
    shutil.copy(data.path / "live.db-wal", data.path / "definitions.db-wal")
    live.close()
    (data.path / "live.db").unlink()
    wal = data.path / "definitions.db-wal"
    raw = bytearray(wal.read_bytes())
    raw[40:56] = bytes(b ^ 0xFF for b in raw[40:56])  # the first frame's header and page
    wal.write_bytes(bytes(raw))
    assert "damaged (frame 1 of" in refused(data, "definitions.db-wal")


def test_a_wal_empty_of_sound_frames_with_no_tables_is_refused(data: DataDir) -> None:
    """A WAL whose only commit fails (a torn first commit cannot be told from lost content)
    beside a database with no tables: the directory was in use, it is not taken for new."""
    live = sqlite3.connect(data.path / "live.db", isolation_level=None)
    live.execute("PRAGMA journal_mode=WAL")
    live.executescript(f"BEGIN; {_SCHEMA_1} COMMIT;")  # one transaction: its last frame commits it
    shutil.copy(data.path / "live.db", data.definitions)
    raw = bytearray((data.path / "live.db-wal").read_bytes())
    live.close()
    (data.path / "live.db").unlink()
    raw[-16:] = bytes(b ^ 0xFF for b in raw[-16:])  # the commit frame: as a torn tail reads
    (data.path / "definitions.db-wal").write_bytes(bytes(raw))
    assert "holds pages SQLite cannot use" in refused(data, "definitions.db")


def test_each_commit_reaches_the_main_file(data: DataDir, tmp_path: Path) -> None:
    """The WAL is emptied after each batch: the main file alone holds every committed change."""
    first_start(data)
    opened = open_definitions(data)
    opened.store.apply([QueueDef("later", False, {})])
    wal = data.path / "definitions.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    shutil.copy(data.definitions, tmp_path / "alone.db")
    alone = DefinitionStore(tmp_path / "alone.db")
    assert [q.name for q in alone.load().queues] == ["orders", "later"]
    alone.close()
    opened.store.close()


def test_a_row_changed_on_disk_fails_the_digest(data: DataDir) -> None:
    """SQLite has no page checksums: a flipped byte in a row is caught by the digest."""
    first_start(data, queues=("orders-of-the-day",))
    raw = data.definitions.read_bytes()
    assert raw.count(b"orders-of-the-day") == 2  # the row, and its entry in the unique index
    data.definitions.write_bytes(raw.replace(b"orders-of-the-day", b"orders-of-the-dax"))
    assert "do not match their digest" in refused(data, "definitions.db")


def test_a_database_behind_its_generation_is_reported(
        data: DataDir, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A definitions.db restored from an older copy is opened, and says how far behind it is."""
    first_start(data)
    shutil.copy(data.definitions, tmp_path / "backup.db")
    opened = open_definitions(data)
    opened.store.apply([QueueDef("a", False, {})])
    opened.store.apply([QueueDef("b", False, {})])
    opened.store.close()
    shutil.copy(tmp_path / "backup.db", data.definitions)
    again = open_definitions(data)
    assert again.behind == 2 and [q.name for q in again.store.load().queues] == ["orders"]
    again.store.close()
    assert open_definitions(data).behind == 0  # said once: the database is taken as it is


def test_a_damaged_generation_file_is_ignored_with_a_warning(
        data: DataDir, caplog: pytest.LogCaptureFixture) -> None:
    first_start(data)
    data.generation.write_bytes(b"\xff" * 16)
    with caplog.at_level(logging.WARNING):
        opened = open_definitions(data)
    assert opened.behind == 0 and "definitions.gen: damaged, ignored" in caplog.text
    assert GenerationFile(data.generation).read() == opened.store.generation
    opened.store.close()


def test_the_users_commands_never_create_a_directory(data: DataDir) -> None:
    with pytest.raises(DefinitionStoreError, match="no broker data"):
        open_definitions(data, create=False)
    assert not data.definitions.exists() and not data.marker.exists()
