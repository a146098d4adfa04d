"""The words a trace row's ``outcome`` column holds: what happened to a queue entry in the end (or,
in a worker's ``ack`` row, what the client asked for). Plain strings, no pyarrow: the supervisor
and the workers spell an outcome with these whether or not they trace."""

from __future__ import annotations

from typing import Final

ACKED: Final = "acked"
REJECTED: Final = "rejected"  # the client rejected / nacked without requeue; the entry is gone
REQUEUED: Final = "requeued"  # only in worker ``ack`` rows: the client asked for a requeue
EXPIRED: Final = "expired"
DEAD_LETTERED: Final = "dead-lettered"
DROPPED: Final = "dropped"  # purge, queue delete, overflow: gone without a consumer's say
FINAL_OUTCOMES: Final = (ACKED, REJECTED, EXPIRED, DEAD_LETTERED, DROPPED)
