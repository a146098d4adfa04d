"""A worker's side of the vhost and user limits (``broker.runtime.limits``): the verdict at
connection.open and channel.open, and what this worker reports of its use.

Theory of operation
-------------------
The limits count across the broker, and a connection lives in one worker. Each worker counts
its own open connections and channels exactly, when it needs to (a scan of its handlers, only
for a vhost or user with a limit: a broker without limits does nothing here), and adds what the
other workers use as the supervisor last told it (``LimitsChanged``). A worker tells the
supervisor (``LimitUsage``) when its use of a limited vhost or user changes: at once after a
connection or channel opened or a connection closed, and at each heartbeat tick (a channel
closed). So two connections opened on two workers within the ring's round trip may both get
in, one over the limit -- RabbitMQ's own count across a cluster is as loose -- and never a
connection on the same worker.

The texts are RabbitMQ 3.10.8's (rabbit_reader: ``check_vhost_connection_limit``,
``check_user_connection_limit``, ``create_channel``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from ipc import records as r

MAX_CONNECTIONS = "max-connections"
MAX_CHANNELS = "max-channels"


class WorkerLimits:
    """The limits as a worker has them, and its own use of them (module text)."""

    def __init__(self, handlers: Mapping[int, Any], vhosts: dict[str, dict[str, int]],
                 users: dict[str, dict[str, int]]) -> None:
        self._handlers = handlers  # conn -> ConnectionHandler: opened, finished, proto
        self._others = r.LimitsChanged(vhosts, users, {}, {}, {})
        self._sent = r.LimitUsage({}, {}, {})

    def apply(self, rec: r.LimitsChanged) -> None:
        self._others = rec

    @property
    def watching(self) -> bool:
        """Some limit counts connections or channels (else nothing here is worth a look)."""
        o = self._others
        return (any(MAX_CONNECTIONS in v for v in o.vhosts.values())
                or any(MAX_CONNECTIONS in u or MAX_CHANNELS in u for u in o.users.values()))

    def admit_connection(self, vhost: str, user: str) -> str | None:
        """Why connection.open to ``vhost`` as ``user`` is refused (530), or None."""
        o = self._others
        vhost_max = o.vhosts.get(vhost, {}).get(MAX_CONNECTIONS, -1)
        user_max = o.users.get(user, {}).get(MAX_CONNECTIONS, -1)
        if vhost_max < 0 and user_max < 0:
            return None
        mine = self.usage()
        if vhost_max >= 0 and (mine.vhost_connections.get(vhost, 0)
                               + o.vhost_connections.get(vhost, 0)) >= vhost_max:
            return (f"access to vhost '{vhost}' refused for user '{user}': connection limit "
                    f"({vhost_max}) is reached")
        if user_max >= 0 and (mine.user_connections.get(user, 0)
                              + o.user_connections.get(user, 0)) >= user_max:
            return (f"connection refused for user '{user}': user connection limit ({user_max}) "
                    "is reached")
        return None

    def admit_channel(self, user: str) -> str | None:
        """Why a channel.open of ``user`` is refused (530 on the connection), or None."""
        o = self._others
        limit = o.users.get(user, {}).get(MAX_CHANNELS, -1)
        if limit < 0:
            return None
        if self.usage().user_channels.get(user, 0) + o.user_channels.get(user, 0) >= limit:
            return (f"number of channels opened for user '{user}' has reached the maximum "
                    f"allowed user limit of ({limit})")
        return None

    def usage(self) -> r.LimitUsage:
        """This worker's open connections and channels, of the limited vhosts and users."""
        o = self._others
        vhosts = {v for v, limits in o.vhosts.items() if MAX_CONNECTIONS in limits}
        users = {u for u, limits in o.users.items() if limits.keys() & {MAX_CONNECTIONS, MAX_CHANNELS}}
        vhost_conns: Counter[str] = Counter()
        user_conns: Counter[str] = Counter()
        user_chans: Counter[str] = Counter()
        if vhosts or users:
            for h in self._handlers.values():
                if not h.opened or h.finished:
                    continue
                proto = h.proto
                if proto.vhost in vhosts:
                    vhost_conns[proto.vhost] += 1
                if proto.user in users:
                    user_conns[proto.user] += 1
                    user_chans[proto.user] += proto.channel_count
        return r.LimitUsage(dict(vhost_conns), dict(user_conns), dict(user_chans))

    def changed(self) -> r.LimitUsage | None:
        """The report to send, when this worker's use differs from the last one sent."""
        if not self.watching and not any(_counts(self._sent)):
            return None
        now = self.usage()
        if now == self._sent:
            return None
        self._sent = now
        return now


def _counts(usage: r.LimitUsage) -> tuple[dict[str, int], ...]:
    return (usage.vhost_connections, usage.user_connections, usage.user_channels)
