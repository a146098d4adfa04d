"""Users and their stored passwords: RabbitMQ's scheme, and who may log in after a start.

Passwords are kept as RabbitMQ keeps them (``rabbit_password_hashing_sha256``, its default):
``base64(salt + sha256(salt + password))`` with a 4-byte random salt -- the ``password_hash``
of its definitions export. Neither the data directory nor a worker ever holds a password.
Hashes of RabbitMQ's two other modules, imported or given as ``password_hash``, are kept as
they come and checked as RabbitMQ checks them: ``rabbit_password_hashing_sha512`` (the same with
SHA-512) and ``rabbit_password_hashing_md5`` (MD5; users from RabbitMQ before 3.6). Each
digest has its own length, so a stored hash says which module made it (``algorithm_of``); new
passwords are always SHA-256.

Who may log in (RabbitMQ's rules, with ``--user`` in the place of ``default_user``): the users
in the data directory, plus those given at this start (``--user``, ``--users-file``,
``$SHOAL_USERS``), which are added or get their new password. On the first start of a new data
directory with none given, ``guest``/``guest`` is created, as RabbitMQ creates its default user
on first boot only; a user given there instead means no guest. Never on a later start: a deleted
guest stays deleted, and a data directory that lost its users is not opened
(``broker.storage.definition_store.open_definitions``).

A pure module: the workers import it too (they check passwords against these hashes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping

DEFAULT_USER = ("guest", "guest")
# The tags of a user without stored tags: one stored before Shoal kept tags, or given to
# `shoal serve --user` (RabbitMQ's default_user, whose default_user_tags these are). A user added
# at runtime has the tags it is given (rabbitmqctl add_user: none).
DEFAULT_TAGS = ("administrator",)
_SALT = 4
SHA256 = "rabbit_password_hashing_sha256"
# RabbitMQ's hashing modules (rabbit_password_hashing_*: hash/1), by the length of salt + digest.
HASHINGS = {SHA256: "sha256", "rabbit_password_hashing_sha512": "sha512",
            "rabbit_password_hashing_md5": "md5"}
_BY_LENGTH = {_SALT + hashlib.new(digest).digest_size: (name, digest)
              for name, digest in HASHINGS.items()}


def hash_password(password: str, salt: bytes | None = None) -> str:
    """The stored form of ``password`` (a fresh random salt unless one is given)."""
    salt = os.urandom(_SALT) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def algorithm_of(stored: str) -> str | None:
    """The hashing module whose hash ``stored`` is (HASHINGS' names), None if none's."""
    found = _BY_LENGTH.get(len(_decoded(stored)))
    return None if found is None else found[0]


def check_password(stored: str, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (constant-time compare)."""
    raw = _decoded(stored)
    found = _BY_LENGTH.get(len(raw))
    if found is None:
        return False
    salt, digest = raw[:_SALT], raw[_SALT:]
    return hmac.compare_digest(digest, hashlib.new(found[1], salt + password.encode()).digest())


def _decoded(stored: str) -> bytes:
    try:
        return base64.b64decode(stored, validate=True)
    except (binascii.Error, ValueError):
        return b""


def hashed(users: Mapping[str, str]) -> dict[str, str]:
    """Name -> password, as name -> stored password."""
    return {name: hash_password(password) for name, password in users.items()}


def users_at_start(stored: Mapping[str, str], given: Mapping[str, str],
                   new_directory: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Who may log in after a start, name -> stored password, and what to write to the data
    directory for it (new users, new passwords; unchanged ones are not rewritten)."""
    changes: dict[str, str] = {}
    for name, password in given.items():
        old = stored.get(name)
        if old is None or not check_password(old, password):
            changes[name] = hash_password(password)
    if new_directory and not stored and not given:  # RabbitMQ's default user, on first boot only
        name, password = DEFAULT_USER
        changes[name] = hash_password(password)
    return {**stored, **changes}, changes
