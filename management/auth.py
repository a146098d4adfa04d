"""HTTP basic authentication against the broker's users (their stored password hashes).

The supervisor hands the stored hashes to the management process through a pipe at start, as
it hands them to the workers (never argv, never the environment), with their tags; a change made
at runtime arrives as a line on stdin (management.process, broker.runtime.users). As RabbitMQ's
management plugin, only a user with one of MANAGEMENT_TAGS may log in (others: 401), and only an
``administrator`` may list or change users (others: 403). ``guest``
may log in from the loopback interface only (RabbitMQ's loopback_users). A failed login is
401 with ``WWW-Authenticate: Basic realm="RabbitMQ Management"``; never 403.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping
from typing import Any

from broker.passwords import DEFAULT_TAGS, check_password

LOOPBACK_USERS = frozenset({"guest"})
TAGS = list(DEFAULT_TAGS)  # a user without stored tags
MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", "administrator"})


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header, else None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


class Users:
    """Who may log in: name → stored password, as the workers take it (empty: nobody)."""

    def __init__(self, stored: Mapping[str, str],
                 loopback_users: frozenset[str] = LOOPBACK_USERS,
                 tags: Mapping[str, list[str]] | None = None,
                 limits: Mapping[str, dict[str, int]] | None = None) -> None:
        self.stored = dict(stored)
        self.loopback_users = loopback_users
        self.tags: dict[str, list[str]] = dict(tags or {})
        self.limits: dict[str, dict[str, int]] = dict(limits or {})  # those with some set

    def tags_of(self, name: str) -> list[str]:
        return list(self.tags.get(name, TAGS))

    def is_admin(self, name: str) -> bool:
        return "administrator" in self.tags_of(name)

    def apply(self, change: Mapping[str, Any]) -> None:
        """A change the supervisor made: ``{"users": {name: stored}, "removed": [name],
        "tags": {name: [tag]}}`` (broker.runtime.users), or ``{"user_limits": {name: {limit:
        value}}}``, the whole table (broker.runtime.limits)."""
        self.stored.update(change.get("users") or {})
        self.tags.update(change.get("tags") or {})
        if isinstance(change.get("user_limits"), dict):
            self.limits = dict(change["user_limits"])
        for name in change.get("removed") or ():
            self.stored.pop(name, None)
            self.tags.pop(name, None)
            self.limits.pop(name, None)

    def check(self, header: str | None, client_host: str | None) -> tuple[str, str] | None:
        """(user, password) when the header's credentials log in from ``client_host``."""
        credentials = parse_basic(header)
        if credentials is None:
            return None
        user, password = credentials
        stored = self.stored.get(user)
        if stored is None or not check_password(stored, password):
            return None
        if user in self.loopback_users and not is_loopback(client_host):
            return None
        if not MANAGEMENT_TAGS.intersection(self.tags_of(user)):
            return None  # RabbitMQ: 401 "Not management user"
        return user, password
