"""Dead-lettering: the republished copy, its ``x-death`` header, and cycle detection.

RabbitMQ 3.10 ``rabbit_dead_letter``: a message that is rejected (requeue=false), expires,
overflows a length limit or exceeds a delivery limit is republished to the queue's
dead-letter exchange with

* exchange = the DLX, routing key = ``x-dead-letter-routing-key`` if set (and then the ``CC``
  header is removed, and the copy is routed by that key alone) or else the original routing key
  (and the copy is routed by the original's keys, CC and BCC included);
* ``expiration`` removed (kept in the death record as ``original-expiration``);
* ``x-death``: an array of tables, most recent first, one per (queue, reason) -- ``count``,
  ``reason``, ``queue``, ``time``, ``exchange``, ``routing-keys`` (the routing key and the CC
  keys: RabbitMQ reads them from the content, whose BCC header is already gone) and maybe
  ``original-expiration``. A repeated (queue, reason) increments that table's ``count`` and
  moves it to the front; it keeps its first ``time``, ``exchange`` and ``routing-keys``;
* on the first death only, ``x-first-death-reason`` / ``-queue`` / ``-exchange``.

A copy routed back to a queue it already died in is dropped for that queue when no death in
between was a rejection (``detect_cycles``): fully automatic cycles terminate.

The domain does not own body bytes: the copy is a :class:`DeadLetter` sharing its origin's
``body_ref`` and holding one reference on it (see :mod:`broker.messages.message`).

BCC (sender-selected distribution): RabbitMQ strips it from the content at publish but keeps its
keys in the message's routing keys, which a copy without ``x-dead-letter-routing-key`` is routed
by. Here a copy keeps the BCC header in ``headers`` for routing; it is never delivered (a copy is
always re-encoded, and the runtime leaves BCC out), and it is not in ``routing-keys``.

Called from: the supervisor process, by VirtualHost when a queue dead-letters a message.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable
from typing import Any, ClassVar

from broker.messages.headers import header_routes
from broker.messages.message import BLIND_HEADER, FullMessage, Message


class DeadLetterReason(enum.StrEnum):
    """Why a queue dead-letters a message: the ``reason`` of an x-death table (RabbitMQ's words)."""

    REJECTED = "rejected"  # basic.reject / basic.nack with requeue=false
    EXPIRED = "expired"  # message TTL, per queue or per message
    MAXLEN = "maxlen"  # x-max-length / x-max-length-bytes (drop-head, reject-publish-dlx)
    DELIVERY_LIMIT = "delivery_limit"  # x-delivery-limit returns exceeded


class DeadLetter(FullMessage):
    """A dead-lettered copy: new routing and headers, the origin's body (one reference on it)."""

    __slots__ = ("origin",)
    # The runtime re-encodes the content header from ``headers`` (and ``expiration``, None).
    reheadered: ClassVar[bool] = True

    def __init__(self, origin: Message, exchange: str, routing_key: str, headers: dict[str, Any]) -> None:
        super().__init__(
            origin.id, exchange, routing_key, origin.body_ref, origin.body_size, headers,
            expiration=None, priority=origin.priority,
        )
        self.origin: Message | None = origin
        origin.refs += 1


def dead_letter_copy(
    message: Message,
    reason: DeadLetterReason,
    queue: str,
    exchange: str,
    routing_key: str | None,
    epoch_seconds: float,
) -> DeadLetter:
    """RabbitMQ ``make_msg``: the copy of ``message`` that ``queue`` republishes to ``exchange``."""
    headers = _with_death(message, reason, queue, epoch_seconds)
    if routing_key is not None:
        # rabbit_dead_letter make_msg: routed by [RK] only; CC removed (BCC is already gone).
        headers.pop("CC", None)
        headers.pop(BLIND_HEADER, None)
    root = message.origin if message.origin is not None else message
    key = routing_key if routing_key is not None else message.routing_key
    return DeadLetter(root, exchange, key, headers)


def _routes(headers: dict[str, Any], routing_key: str) -> list[str]:
    # make_msg: [hd(RoutingKeys) | rabbit_basic:header_routes(Headers)] on content whose BCC
    # was stripped at publish: the routing key, then the CC keys (longstr elements only).
    if not isinstance(headers.get("CC", ()), (list, tuple)):
        return [routing_key]  # cannot have been published so; nothing to add
    return [routing_key, *header_routes(headers, ("CC",))]


def _with_death(message: Message, reason: DeadLetterReason, queue: str,
                epoch_seconds: float) -> dict[str, Any]:
    headers = dict(message.headers or {})
    text = str(reason)  # headers carry the plain string
    info: dict[str, Any] = {
        "reason": text,
        "queue": queue,
        "time": datetime.datetime.fromtimestamp(int(epoch_seconds), datetime.UTC),
        "exchange": message.exchange,
        "routing-keys": _routes(headers, message.routing_key),
    }
    if message.expiration is not None:
        info["original-expiration"] = message.expiration
    deaths = headers.get("x-death")
    if "x-death" not in headers:
        headers["x-first-death-reason"] = text
        headers["x-first-death-queue"] = queue
        headers["x-first-death-exchange"] = message.exchange
        headers["x-death"] = [{"count": 1, **info}]
    elif isinstance(deaths, list):
        headers["x-death"] = _record(deaths, info)
    else:
        headers["x-death"] = [{"count": 1, **info}]  # not an array: RabbitMQ resets it
    return headers


def _same_event(table: Any, queue: Any, reason: Any) -> bool:
    return isinstance(table, dict) and table.get("queue") == queue and table.get("reason") == reason


def _record(deaths: list[Any], info: dict[str, Any]) -> list[Any]:
    """Increment the (queue, reason) table and move it to the front, or prepend a new one."""
    queue, reason = info["queue"], info["reason"]
    others: list[Any] = []
    match: dict[str, Any] | None = None
    for table in _grouped(deaths):
        if match is None and _same_event(table, queue, reason):
            match = table
        else:
            others.append(table)
    event = {"count": 1, **info} if match is None else {**match, "count": _count(match) + 1}
    # rabbit_misc:sort_field_table on the updated event.
    return [dict(sorted(event.items())), *others]


def _count(table: dict[str, Any]) -> int:
    count = table.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def _grouped(deaths: Iterable[Any]) -> list[Any]:
    # group_by_queue_and_reason: one table per (queue, reason) -- the first -- counting the
    # duplicates when it carries no count (headers written before RabbitMQ 3.5). RabbitMQ
    # 3.10 also reverses the order here; the documented order (most recent first) is kept.
    tables = list(deaths)
    seen: dict[tuple[Any, Any], None] = {}
    grouped: list[Any] = []
    for table in tables:
        if not isinstance(table, dict):
            grouped.append(table)
            continue
        key = (table.get("queue"), table.get("reason"))
        if key in seen:
            continue
        seen[key] = None
        if "count" not in table:
            duplicates = sum(1 for t in tables if _same_event(t, *key))
            table = {"count": duplicates, **table}
        grouped.append(table)
    return grouped


def is_cycle(queue: str, headers: dict[str, Any] | None) -> bool:
    """RabbitMQ ``is_cycle``: the copy already died in ``queue`` and no death since was a reject."""
    deaths = (headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return False
    for table in deaths:
        if not isinstance(table, dict):
            return False  # something a client put there: not "fully automatic"
        if table.get("reason") == DeadLetterReason.REJECTED:
            return False
        if table.get("queue") == queue:
            return True
    return False
