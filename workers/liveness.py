"""Whether a connection is still alive, from the bytes it moves: heartbeats and timeouts.

``AMQPConnection`` owns one ``Liveness`` (as h2's connection owns its ``WindowManager``) and
tells it what it counts -- bytes received, bytes handed to the socket -- and, once a second
(``AMQPConnection.heartbeat_tick``), the time and the phase of the connection. The rules are
RabbitMQ's (rabbit_heartbeat, rabbit_reader), AMQP 0-9-1 §4.2.7:

* a heartbeat goes out when nothing was sent for heartbeat/2 seconds;
* the client is dead after 2 x heartbeat seconds in which nothing was received; any received
  byte counts, and so does a change in what the runtime sees of the socket (``socket_activity``);
* heartbeats are monitored from connection.tune-ok on (``monitored``), and not at all when the
  negotiated heartbeat is 0;
* a handshake may take ``handshake_timeout`` seconds, a close waits for its close-ok for the
  heartbeat but at most 30 s.

The pause rule: while the runtime stops reading the socket of its own accord (credit flow,
memory alarm, no arena room: ``reading_paused``) the client's silence is ours, so it does not
count as missed heartbeats (RabbitMQ pauses its heartbeat monitor while it blocks a connection).
"""

from __future__ import annotations


class Liveness:
    """One connection's traffic counts and clocks, in the runtime's monotonic time."""

    __slots__ = (
        "_closing_since",
        "_handshake_timeout",
        "_last_received",
        "_last_sent",
        "_seen_activity",
        "_seen_received",
        "_seen_sent",
        "_started_at",
        "bytes_received",
        "bytes_sent",
        "heartbeat",
        "reading_paused",
    )

    def __init__(self, handshake_timeout: float) -> None:
        self._handshake_timeout = handshake_timeout
        self.heartbeat = 0  # negotiated at tune-ok; 0 disables heartbeats
        self.bytes_received = 0
        self.bytes_sent = 0
        self.reading_paused = False
        self._seen_received = 0
        self._seen_sent = 0
        self._started_at: float | None = None
        self._last_received = 0.0
        self._last_sent = 0.0
        self._closing_since: float | None = None
        self._seen_activity: object = None  # tick's socket_activity, last seen

    def tick(
        self, now: float, socket_activity: object, *, running: bool, monitored: bool,
        closing: bool,
    ) -> str | None:
        """Take in the traffic since the last tick; why the connection is dead, or None.

        ``running``: the handshake is over; ``monitored``: heartbeats are watched (tune-ok
        received, no close under way); ``closing``: we sent connection.close."""
        self._observe(now, socket_activity, closing)
        if closing:
            assert self._closing_since is not None
            if now - self._closing_since >= self._close_timeout():
                return "timed out waiting for connection.close-ok"
            return None
        assert self._started_at is not None
        if not running and now - self._started_at >= self._handshake_timeout:
            return "handshake timeout"
        if monitored and self.heartbeat and now - self._last_received >= 2 * self.heartbeat:
            return f"missed heartbeats from client, timeout: {self.heartbeat}s"
        return None

    def heartbeat_due(self, now: float, monitored: bool) -> bool:
        return monitored and bool(self.heartbeat) and now - self._last_sent >= self.heartbeat / 2

    def heartbeat_queued(self, now: float, unsent_bytes: int) -> None:
        """A heartbeat was queued now: counted as sent when the writer takes it, not "sent"
        again at the next tick."""
        self._last_sent = now
        self._seen_sent = self.bytes_sent + unsent_bytes

    def _observe(self, now: float, socket_activity: object, closing: bool) -> None:
        if self._started_at is None:
            self._started_at = self._last_received = self._last_sent = now
        if self.bytes_received != self._seen_received or self.reading_paused:
            self._seen_received = self.bytes_received
            self._last_received = now
        if socket_activity is not None and socket_activity != self._seen_activity:
            self._last_received = now
        self._seen_activity = socket_activity
        if self.bytes_sent != self._seen_sent:
            self._seen_sent = self.bytes_sent
            self._last_sent = now
        if closing and self._closing_since is None:
            self._closing_since = now

    def _close_timeout(self) -> float:
        # rabbit_reader close_connection: the heartbeat, but at most 30 s.
        return self.heartbeat if 0 < self.heartbeat < 30 else 30
