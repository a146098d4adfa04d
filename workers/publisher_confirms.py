"""A channel's publisher confirms (confirm.select): the publish sequence, the supervisor's
``Confirm`` events, and the basic.ack / basic.nack frames sent for them.

RabbitMQ's rules, as clients count on them: confirms come in publish order, acks of one batch
are coalesced into one ``basic.ack multiple``, a nack goes at once (after the acks before it).
With ``--data-dir`` a persistent publish's confirm also waits for the worker's body log
(``workers.confirm_gate``). The channel (``workers.channel.Channel``) holds one of these and
passes the event list of the call in progress.
"""

from __future__ import annotations

from ipc import records as r
from ipc.logfile import BodyLog
from workers.confirm_gate import BodySyncGate
from workers.outgoing import Ack, Nack, Outgoing


class PublisherConfirms:
    """One channel's confirm state: on once confirm.select was taken."""

    __slots__ = ("_body_log", "_ch", "_conn", "_waiters", "acked_upto", "active", "confirmed",
                 "gate", "published")

    def __init__(self, conn: int, ch: int, body_log: BodyLog | None,
                 waiters: set[BodySyncGate] | None) -> None:
        self._conn = conn
        self._ch = ch
        self._body_log = body_log
        self._waiters = waiters
        self.active = False
        self.published = 0  # publish sequence numbers in confirm mode
        self.confirmed = 0  # confirms received from the supervisor
        self.acked_upto = 0  # confirms sent to the client
        self.gate: BodySyncGate | None = None  # confirms waiting for the body log

    @property
    def owed(self) -> bool:
        """Confirms received and not yet sent (they go before any other reply)."""
        return self.confirmed > self.acked_upto

    def publish(self, persistent: bool) -> None:
        """A publish in confirm mode; ``persistent``: its body went to the body log, so its
        ack waits for the log's sync."""
        self.published += 1
        if persistent and self._body_log is not None:
            if self.gate is None:
                waiters = self._waiters
                self.gate = BodySyncGate(self._conn, self._ch, self._body_log,
                                        set() if waiters is None else waiters)
            self.gate.expect(self.published)

    def on_confirm(self, ev: r.Confirm, events: list[Outgoing]) -> bool:
        """The supervisor's confirms of the next ``ev.count`` publishes; True when an ack is
        left to flush."""
        gate = self.gate
        n = ev.count if gate is None else gate.admit(ev, self.confirmed)
        return self._apply(ev.ack, n, events) if n else False

    def release(self, events: list[Outgoing]) -> None:
        """The body log was synced: the confirms the gate held that are now due, and their ack."""
        if self.gate is not None:
            for ack, n in self.gate.release(self.confirmed):
                self._apply(ack, n, events)
            self.flush(events)

    def _apply(self, ack: bool, n: int, events: list[Outgoing]) -> bool:
        """Acks join the batch's ack multiple (True: flush it later); nacks go now, each on its
        own, after the acks before them (a queue refused those publishes)."""
        if ack:
            self.confirmed += n
            return True
        for _ in range(n):
            self.flush(events)
            self.confirmed += 1
            events.append(Nack(self._ch, self.confirmed, False))
            self.acked_upto = self.confirmed
        return False

    def flush(self, events: list[Outgoing]) -> None:
        """The acks owed, as one basic.ack (multiple when more than one)."""
        if self.confirmed > self.acked_upto:
            multiple = self.confirmed - self.acked_upto > 1
            events.append(Ack(self._ch, self.confirmed, multiple))
            self.acked_upto = self.confirmed

    def drop(self) -> None:
        """The channel closed: held confirms are never sent."""
        if self.gate is not None:
            self.gate.drop()
