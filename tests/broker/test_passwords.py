"""broker.passwords: RabbitMQ's stored password scheme, and who may log in after a start."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from broker.passwords import algorithm_of, check_password, hash_password, hashed, users_at_start
from broker.runtime.users import UserError, check_hash
from broker.storage.definition_store import DefinitionStore


def test_the_stored_form_is_rabbitmqs_salted_sha256() -> None:
    """rabbit_password_hashing_sha256: base64(salt ++ sha256(salt ++ password)), 4-byte salt --
    what `rabbitmqctl export_definitions` writes as password_hash."""
    salt = bytes([0x90, 0x8D, 0xC6, 0x0A])
    stored = hash_password("test12", salt)
    assert base64.b64decode(stored) == salt + hashlib.sha256(salt + b"test12").digest()
    assert check_password(stored, "test12") and not check_password(stored, "test13")


def rabbitmq_hash(digest: str, salt: bytes, password: str) -> str:
    """rabbit_password:hash/2: salt ++ Mod:hash(salt ++ password), base64 in an export."""
    return base64.b64encode(salt + hashlib.new(digest, salt + password.encode()).digest()).decode()


@pytest.mark.parametrize(("algorithm", "digest"), [
    ("rabbit_password_hashing_sha256", "sha256"),
    ("rabbit_password_hashing_sha512", "sha512"),
    ("rabbit_password_hashing_md5", "md5"),
])
def test_hashes_of_each_rabbitmq_module_are_checked_as_rabbitmq_checks_them(algorithm: str,
                                                                           digest: str) -> None:
    """rabbit_password_hashing_sha256, _sha512 and _md5 (rabbit_password:hash/2: a 4-byte salt,
    then the module's hash of salt ++ password): each logs in with its password only, and the
    stored hash says which module made it."""
    stored = rabbitmq_hash(digest, bytes([0x90, 0x8D, 0xC6, 0x0A]), "s3cret")
    assert check_password(stored, "s3cret")
    assert not check_password(stored, "s3cret ") and not check_password(stored, "")
    assert algorithm_of(stored) == algorithm
    assert check_hash(stored, algorithm) == stored


def test_a_hash_given_with_another_algorithm_is_refused() -> None:
    """A sha512 hash said to be md5 (or sha256), or an unknown module, is refused, not kept to
    fail every login."""
    sha512 = rabbitmq_hash("sha512", b"salt", "pw")
    for algorithm in ("rabbit_password_hashing_md5", "rabbit_password_hashing_sha256",
                      "rabbit_password_hashing_sha3"):
        with pytest.raises(UserError):
            check_hash(sha512, algorithm)
    assert algorithm_of("not base64!") is None and algorithm_of("") is None


def test_new_passwords_are_always_sha256() -> None:
    assert algorithm_of(hash_password("pw")) == "rabbit_password_hashing_sha256"
    assert all(algorithm_of(h) == "rabbit_password_hashing_sha256"
               for h in hashed({"a": "1", "b": "2"}).values())


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
