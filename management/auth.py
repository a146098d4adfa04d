"""HTTP basic authentication against the broker's users (their stored password hashes).

The supervisor hands the stored hashes to the management process through a pipe at start, as
it hands them to the workers (never argv, never the environment). Shoal has no user tags yet:
every user who logs in counts as ``administrator`` (the Security issue adds tags). ``guest``
may log in from the loopback interface only (RabbitMQ's loopback_users). A failed login is
401 with ``WWW-Authenticate: Basic realm="RabbitMQ Management"``; never 403.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping

from broker.passwords import check_password

LOOPBACK_USERS = frozenset({"guest"})
TAGS = ["administrator"]  # every user, until Shoal has tags


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
                 loopback_users: frozenset[str] = LOOPBACK_USERS) -> None:
        self.stored = dict(stored)
        self.loopback_users = loopback_users

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
        return user, password
