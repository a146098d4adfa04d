"""definitions.db's user_tags (schema 3): kept with the user, gone with it, and a schema-2
database from an older Shoal upgraded in place with its users intact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from broker.storage.definition_store import SCHEMA_VERSION, DefinitionStore, inspect


def test_tags_are_kept_and_go_with_their_user(tmp_path: Path) -> None:
    store = DefinitionStore(tmp_path / "d.db")
    store.put_users({"old": "hash-old"})
    store.put_user("new", "hash-new", [])
    store.put_user("new", None, ["monitoring", "management"])
    store.close()
    store = DefinitionStore(tmp_path / "d.db")
    assert store.users() == {"new": "hash-new", "old": "hash-old"}
    assert store.user_tags() == {"new": ["monitoring", "management"]}  # "old": the default tags
    assert store.delete_user("new")
    assert store.user_tags() == {}
    store.close()
    assert inspect(tmp_path / "d.db").problem is None


def test_a_schema_2_database_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    store = DefinitionStore(path, node="n1")
    store.put_users({"guest": "h"})
    store.close()
    db = sqlite3.connect(path)  # as Shoal with schema 2 left it: no user_tags, no triggers on it
    for event in ("insert", "delete", "update"):
        db.execute(f"DROP TRIGGER user_tags_{event}")
    db.execute("DROP TABLE user_tags")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    seen = inspect(path)
    assert seen.problem is None and seen.node == "n1" and seen.users == 1
    store = DefinitionStore(path)
    assert store.node == "n1" and store.users() == {"guest": "h"} and store.user_tags() == {}
    store.put_user("guest", None, ["administrator"])
    store.close()
    assert inspect(path).problem is None
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    db.close()
