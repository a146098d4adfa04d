"""broker.passwords: RabbitMQ's stored password scheme, and who may log in after a start."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from broker.passwords import check_password, hash_password, hashed, users_at_start
from broker.storage.definition_store import DefinitionStore


def test_the_stored_form_is_rabbitmqs_salted_sha256() -> None:
    """rabbit_password_hashing_sha256: base64(salt ++ sha256(salt ++ password)), 4-byte salt --
    what `rabbitmqctl export_definitions` writes as password_hash."""
    salt = bytes([0x90, 0x8D, 0xC6, 0x0A])
    stored = hash_password("test12", salt)
    assert base64.b64decode(stored) == salt + hashlib.sha256(salt + b"test12").digest()
    assert check_password(stored, "test12") and not check_password(stored, "test13")


def test_each_hash_has_its_own_salt_and_damaged_ones_never_match() -> None:
    a, b = hash_password("pw"), hash_password("pw")
    assert a != b and check_password(a, "pw") and check_password(b, "pw")
    assert not check_password("not base64!", "pw")
    assert not check_password(base64.b64encode(b"short").decode(), "pw")
    assert not check_password("", "")


def test_a_first_start_with_nobody_given_creates_guest() -> None:
    users, changes = users_at_start({}, {}, new_directory=True)
    assert list(users) == list(changes) == ["guest"] and check_password(users["guest"], "guest")


def test_guest_is_never_created_again_on_a_directory_that_is_not_new() -> None:
    """RabbitMQ creates its default user on first boot only: a deleted guest stays deleted,
    even when no user is left."""
    assert users_at_start({}, {}, new_directory=False) == ({}, {})
    users, changes = users_at_start({}, {"alice": "pw"}, new_directory=False)
    assert list(users) == list(changes) == ["alice"]


def test_users_given_on_a_first_start_replace_guest() -> None:
    users, changes = users_at_start({}, {"alice": "pw"}, new_directory=True)
    assert list(users) == ["alice"] and changes == users


def test_later_starts_keep_the_stored_users_and_add_or_change_the_given_ones() -> None:
    stored = hashed({"alice": "old", "bob": "b"})
    users, changes = users_at_start(stored, {"alice": "new", "carol": "c"}, False)
    assert sorted(users) == ["alice", "bob", "carol"] and sorted(changes) == ["alice", "carol"]
    assert check_password(users["alice"], "new") and users["bob"] == stored["bob"]
    # The same password again is not rewritten (nor given a new salt).
    assert users_at_start(users, {"alice": "new"}, False) == (users, {})
    assert users_at_start(users, {}, False) == (users, {})


def test_the_store_keeps_users_and_deletes_them(tmp_path: Path) -> None:
    store = DefinitionStore(tmp_path / "definitions.db")
    store.put_users(hashed({"b": "1", "a": "2"}))
    store.close()
    store = DefinitionStore(tmp_path / "definitions.db")
    assert list(store.users()) == ["a", "b"] and check_password(store.users()["a"], "2")
    assert store.delete_user("a") and not store.delete_user("a")
    assert list(store.users()) == ["b"]
    store.close()
