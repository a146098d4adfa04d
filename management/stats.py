"""Sampling: the supervisor's ``snapshot`` and the workers' connections, at an interval.

The supervisor hands its counters over on the control socket (broker.runtime.snapshot) every
``interval`` (RabbitMQ's collect_statistics_interval, 5 s); rates (``*_details.rate``) are
counter deltas between samples, computed here. A read that finds the last sample older than
``fresh`` asks for a new one first, so an object declared a moment ago is listed (as RabbitMQ
lists it at once); however many HTTP requests arrive, at most one request for a sample is in
flight, and none is asked for more often than every ``fresh`` seconds: an abusive HTTP client
costs the supervisor at most one sliced snapshot per ``fresh``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio

log = logging.getLogger("shoal.management")

READ_LIMIT = 256 << 20
CONTROL_TIMEOUT = 10.0


async def ask(path: str, request: dict[str, Any], timeout: float = CONTROL_TIMEOUT) -> dict[str, Any]:
    """One JSON line to the supervisor's control socket, one JSON line back."""
    with trio.fail_after(timeout):
        stream = await trio.open_unix_socket(path)
        async with stream:
            await stream.send_all(json.dumps(request).encode() + b"\n")
            chunks: list[bytes] = []
            size = 0
            while True:
                data = await stream.receive_some(1 << 20)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
                if data.endswith(b"\n") or size > READ_LIMIT:
                    break
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer


def rate(new: float, old: float, seconds: float) -> float:
    """Per second between two samples of a counter (0 when no time passed)."""
    if seconds <= 0:
        return 0.0
    return round((new - old) / seconds, 1)


# A queue row's message counters (broker.runtime.snapshot), after its nine first columns.
QUEUE_COUNTERS = ("deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver", "ack",
                  "get_empty")
NO_COUNTS = (0,) * len(QUEUE_COUNTERS)


def row_vhost(row: list[Any], at: int) -> str:
    """The vhost a snapshot row names at index ``at`` (broker.runtime.snapshot); "/" if none."""
    return str(row[at]) if len(row) > at else "/"


def object_key(vhost: str, name: str) -> str:
    """A queue's or exchange's key in a sample's counters: its name in "/", else the vhost's
    and its (two vhosts may each have a queue ``q``)."""
    return name if vhost == "/" else f"\x00{vhost}\x00{name}"


def split_object_key(key: str) -> list[str]:
    """``[vhost, name]`` of an :func:`object_key`."""
    if not key.startswith("\x00"):
        return ["/", key]
    vhost, _, name = key[1:].partition("\x00")
    return [vhost, name]


def queue_counts(row: list[Any]) -> tuple[int, ...]:
    """A snapshot queue row's message counters (zeros from a supervisor without them)."""
    counts = tuple(row[9:9 + len(QUEUE_COUNTERS)])
    return counts if len(counts) == len(QUEUE_COUNTERS) else NO_COUNTS


@dataclass
class Sample:
    """One snapshot and the connections listed with it, and the counters rates come from."""

    time: float
    snapshot: dict[str, Any]
    connections: list[dict[str, Any]]
    # name → (messages, messages_ready, messages_unacknowledged, enqueued, *QUEUE_COUNTERS)
    queue_counters: dict[str, tuple[int, ...]] = field(default_factory=dict)
    conn_counters: dict[str, tuple[int, int]] = field(default_factory=dict)  # name → (recv, send)
    exchange_counters: dict[str, tuple[int, int]] = field(default_factory=dict)  # (in, out)
    messages: dict[str, int] = field(default_factory=dict)  # the broker's message counters
    # queue name → since when its counters have not moved (RabbitMQ's ``idle_since``); a queue
    # active between the last two samples, or new, has none
    idle_since: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: dict[str, Any], connections: list[dict[str, Any]]) -> Sample:
        sample = cls(float(snapshot.get("time") or time.time()), snapshot, connections)
        sample.queue_counters = {object_key(row_vhost(row, 16), row[0]): (
            row[5] + row[6], row[5], row[6], row[8], *queue_counts(row))
            for row in snapshot.get("queues", ())}
        sample.conn_counters = {c["name"]: (c.get("recv_oct", 0), c.get("send_oct", 0))
                                for c in connections}
        sample.exchange_counters = {
            object_key(row_vhost(row, 8), row[0]): (row[6], row[7]) if len(row) >= 8 else (0, 0)
            for row in snapshot.get("exchanges", ())}
        sample.messages = dict(snapshot.get("messages") or {})
        return sample

    def totals(self) -> tuple[int, int, int, int]:
        """(messages, ready, unacknowledged, enqueued) over all queues."""
        m = r = u = e = 0
        for counters in self.queue_counters.values():
            m += counters[0]
            r += counters[1]
            u += counters[2]
            e += counters[3]
        return m, r, u, e

    def message_counts(self) -> dict[str, int]:
        """The broker's message counters (RabbitMQ's overview ``message_stats`` names); from
        a supervisor that does not count them, what its queues say."""
        if self.messages:
            return self.messages
        return {"publish": self.totals()[3]}


EMPTY = Sample(0.0, {"queues": [], "exchanges": [], "bindings": [], "consumers": [],
                     "channels": [], "alarms": {"memory": [], "disk": False, "queued": False},
                     "vhost": "/"}, [])


class Sampler:
    """Keeps the latest sample and a short history for rates."""

    def __init__(self, control_path: str, interval: float = 5.0, fresh: float = 1.0) -> None:
        self.control_path = control_path
        self.interval = interval
        self.fresh = fresh
        self.latest = EMPTY
        self.history: deque[Sample] = deque(maxlen=8)
        self.error = ""  # why the last sample failed ("" when it did not)
        self._lock = trio.Lock()
        self._asked = 0.0  # monotonic time of the last request for a sample

    async def refresh(self, *, force: bool = False) -> Sample:
        """A new sample, unless one at most ``fresh`` seconds old is there (or in flight)."""
        async with self._lock:
            if not force and time.monotonic() - self._asked < self.fresh:
                return self.latest
            self._asked = time.monotonic()
            try:
                snapshot = await ask(self.control_path, {"command": "snapshot"})
                listed = await ask(self.control_path, {"command": "list_connections"})
            except (OSError, ValueError, trio.TooSlowError) as exc:
                self.error = f"the broker does not answer: {exc}"
                log.warning("%s", self.error)
                return self.latest
            if "error" in snapshot:
                self.error = str(snapshot["error"])
                return self.latest
            self.error = ""
            sample = Sample.of(snapshot, listed.get("connections", []))
            prev = self.latest
            sample.idle_since = {name: prev.idle_since.get(name, prev.time)
                                 for name, counters in sample.queue_counters.items()
                                 if prev.queue_counters.get(name) == counters}
            self.latest = sample
            self.history.append(sample)
            return sample

    def stale(self) -> bool:
        """Marks an object write: the next read asks for a new sample."""
        self._asked = 0.0
        return True

    def base(self) -> Sample | None:
        """The sample rates are measured against: the newest one at least half an interval
        older than the latest (else the oldest kept)."""
        latest = self.latest
        older = [s for s in self.history if s is not latest]
        for sample in reversed(older):
            if latest.time - sample.time >= self.interval / 2:
                return sample
        return older[0] if older else None

    async def run(self) -> None:
        """Sample every ``interval`` (collect_statistics_interval)."""
        while True:
            await self.refresh(force=True)
            await trio.sleep(self.interval)
