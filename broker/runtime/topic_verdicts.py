"""Topic-permission verdicts on the publish path, remembered.

While any topic permission exists, the supervisor checks every publish to a topic exchange
against the publisher's topic write permission (``broker.permissions.topic_allowed``: three
lookups, the ``{username}``/``{vhost}`` variables expanded, a regular expression searched).
Publishers mostly repeat a few routing keys, so the verdict per (user, vhost, exchange, routing
key) is kept: LIMIT of them at most; a table that is full is emptied and starts again, so a
publisher of ever-new keys costs a bounded table and no more than the check itself. (Dropping
only the oldest would cost more: a dict's first live entry is found by scanning past the ones
deleted before it.) Every verdict goes when any permission or
topic permission changes (``clear``, from ``broker.runtime.permissions``): the next publish on
an open connection is checked against the new table, as before any caching.

The exchange's type is not part of a verdict (the caller looks the exchange up per publish): an
exchange deleted and declared again as another type is checked as what it is now.
"""

from __future__ import annotations

from typing import Final

from broker.permissions import WRITE, TopicTable, topic_allowed

# Verdicts kept at most: ~100 bytes each (a tuple of four strings the publishes already hold).
LIMIT: Final = 4096


class TopicVerdicts:
    """The topic table a supervisor checks publishes against (``table``, changed in place by
    its owner, who then calls ``clear``) and the verdicts given so far."""

    __slots__ = ("_verdicts", "limit", "table")

    def __init__(self, table: TopicTable, limit: int = LIMIT) -> None:
        self.table = table
        self.limit = limit
        self._verdicts: dict[tuple[str, str, str, str], bool] = {}

    def __len__(self) -> int:
        return len(self._verdicts)

    def allowed(self, user: str, vhost: str, exchange: str, key: str) -> bool:
        """Whether ``user`` may publish with routing ``key`` to the topic ``exchange``."""
        at = (user, vhost, exchange, key)
        verdict = self._verdicts.get(at)
        if verdict is None:
            verdict = topic_allowed(self.table, user, vhost, exchange, key, WRITE)
            verdicts = self._verdicts
            if len(verdicts) >= self.limit:
                verdicts.clear()
            verdicts[at] = verdict
        return verdict

    def clear(self) -> None:
        """A permission changed: every verdict is checked again."""
        self._verdicts.clear()
