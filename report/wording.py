"""How the report writes a number and names a thing: one format for the page and the plots, and a
reader's words for summary.json's keys (the keys themselves stay as they are: scripts parse them).

Numbers: counts whole with thousands separators (``2,100``); measurements to three significant
digits, whole from 100 up (``0.25``, ``3.5``, ``12.3``, ``400``, ``1,500``); shares as percentages,
the same way (``33.3 %``, ``50 %``).
"""

from __future__ import annotations

import re

MISSING = "–"

STAGES = {  # report.job.LATENCY_STAGES: from which event to which, per message
    "end_to_end": "publish → ack (end to end)",
    "publish_to_deliver": "publish → deliver",
    "publish_to_enqueue": "publish → queued",
    "enqueue_to_notify": "queued → consumer woken",
    "notify_to_deliver": "consumer woken → deliver",
    "enqueue_to_deliver": "queued → deliver",
    "pull_to_deliver": "taken from the queue → deliver",
    "deliver_to_ack": "deliver → the client's ack",
    "ack_to_settle": "the client's ack → settled",
    "client_end_to_end": "client sent → client received",
}
COUNTS = {  # report.job.COUNT_KEYS and the entry counts
    "published": "published", "delivered": "delivered", "acked": "acked", "rejected": "rejected",
    "requeued": "requeued", "redelivered": "redelivered", "expired": "expired",
    "dead_lettered": "dead-lettered", "dropped": "dropped (purge, delete, overflow)",
    "unsettled": "not settled", "unrouted": "routed to no queue", "entries": "queue copies",
    "join_mismatches": "publishes the queue saw differently",
}
WAKEUPS = {
    "notifies": "consumers woken", "pulls": "pulls", "notified_pulls": "first pulls after a wake-up",
    "spurious_pulls": "wake-ups that found nothing", "per_delivered": "wake-ups per delivery",
    "spurious_share": "wasted wake-ups",
}
TABLES = {"msg": "message", "event": "event", "proc": "process sample", "client": "load generator"}


def number(value: object) -> str:
    """A count or a measurement, written the one way the report writes numbers."""
    if value is None or isinstance(value, bool):
        return MISSING if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not isinstance(value, float):
        return str(value)
    if value != value:  # NaN
        return MISSING
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def percent(share: float | None) -> str:
    """A share (0 … 1) as a percentage: ``0.3333`` → ``33.3 %``."""
    return MISSING if share is None else f"{number(share * 100)} %"


def process(name: str) -> str:
    """``worker0`` → ``worker 0``; other names (supervisor, publisher, …) as they are."""
    found = re.fullmatch(r"worker(\d+)", name)
    return f"worker {found.group(1)}" if found else name


def consumer(key: str) -> str:
    """report.job's consumer key ``w1.c3`` → ``worker 1, consumer 3``."""
    found = re.fullmatch(r"w(\d+)\.c(\d+)", key)
    return f"worker {found.group(1)}, consumer {found.group(2)}" if found else key


def stage(name: str) -> str:
    return STAGES.get(name, name.replace("_", " "))
