"""Permissions as RabbitMQ 3.10 (``rabbit_auth_backend_internal``) checks them: the rules, the
tables and the texts, shared by the supervisor (which stores and changes them,
``broker.runtime.permissions``) and the workers (which enforce them, ``workers.access``).

Per user and virtual host three regular expressions -- configure, write, read -- *searched*
in a resource's name (``re:run``: not anchored); the empty one stands for ``^$`` (it matches no
resource name, as no exchange or queue is named ""). No entry for the vhost: the connection
is refused at connection.open. Topic permissions (per user, vhost and exchange: write, read) are
searched in a routing or binding key of a topic exchange, with ``{username}`` and ``{vhost}``
expanded first; no entry for the exchange: allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

CONFIGURE: Final = 0
WRITE: Final = 1
READ: Final = 2
NAMES: Final = ("configure", "write", "read")
FULL: Final = (".*", ".*", ".*")  # what RabbitMQ gives its default user
DEFAULT_EXCHANGE: Final = "amq.default"  # the resource the default exchange ("") is

# user -> vhost -> (configure, write, read)
Table = dict[str, dict[str, tuple[str, str, str]]]
# user -> vhost -> exchange -> (write, read)
TopicTable = dict[str, dict[str, dict[str, tuple[str, str]]]]


@lru_cache(maxsize=1024)
def _compiled(regex: str) -> re.Pattern[str] | None:
    try:
        return re.compile(regex or "^$")  # RabbitMQ: <<"">> -> <<"^$">>
    except re.error:
        return None


def valid(regex: str) -> str | None:
    """Why ``regex`` cannot be a permission (None: it can)."""
    try:
        re.compile(regex)
    except re.error as exc:
        return f"invalid regular expression '{regex}': {exc}"
    return None


def search(regex: str, name: str) -> bool:
    """Whether a permission's ``regex`` grants ``name``: searched, not anchored; "" is ``^$``."""
    pattern = _compiled(regex)
    return pattern is not None and pattern.search(name) is not None


def expand(regex: str, user: str, vhost: str) -> str:
    """A topic permission's variables, as RabbitMQ expands them (no escaping)."""
    return regex.replace("{username}", user).replace("{vhost}", vhost)


def resource(exchange: str) -> str:
    """The resource name an exchange is checked as ("" is ``amq.default``)."""
    return exchange or DEFAULT_EXCHANGE


def refused(kind: str, name: str, vhost: str, user: str) -> str:
    return f"access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def refused_topic(key: str, exchange: str, vhost: str, user: str) -> str:
    return (f"access to topic '{key}' in exchange '{exchange}' in vhost '{vhost}' refused "
            f"for user '{user}'")


def vhost_refused(vhost: str, user: str) -> str:
    return f"access to vhost '{vhost}' refused for user '{user}'"


def topic_allowed(topics: TopicTable, user: str, vhost: str, exchange: str, key: str,
                  which: int) -> bool:
    """A topic exchange's routing key (``WRITE``) or binding key (``READ``): allowed unless the
    user has a topic permission for that exchange whose regex does not match."""
    entry = topics.get(user, {}).get(vhost, {}).get(exchange)
    if entry is None:
        return True
    regex = entry[0] if which == WRITE else entry[1]
    return search(expand(regex, user, vhost), key)


def granted(table: Mapping[str, Mapping[str, tuple[str, str, str]]], user: str, vhost: str,
            which: int, name: str) -> bool:
    entry = table.get(user, {}).get(vhost)
    return entry is not None and search(entry[which], name)
