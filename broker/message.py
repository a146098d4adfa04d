"""A published message as the supervisor sees it: routing data and a handle, never the body.

DESIGN.md (MUST): the supervisor never touches body bytes on the hot path. ``body_ref`` is an
opaque handle to the body in a worker's shared-memory arena; the domain only counts how many
queue entries hold it (``refs``) and calls the queue's ``on_drop`` when that reaches zero so the
runtime can free the block.
"""

from __future__ import annotations

from typing import Any


class Message:
    """One published message, shared by every queue entry it was routed to."""

    # A queue may hold 1,000,000 entries: no per-instance __dict__.
    __slots__ = ("body_ref", "body_size", "exchange", "headers", "id", "refs", "routing_key")

    def __init__(
        self,
        id: int,  # the record field is called id
        exchange: str,
        routing_key: str,
        body_ref: object,
        body_size: int,
        headers: dict[str, Any] | None = None,
    ) -> None:
        self.id = id
        self.exchange = exchange
        self.routing_key = routing_key
        self.body_ref: Any = body_ref
        self.body_size = body_size
        self.headers = headers
        # Queue entries (and runtime pins) referencing this message; 0 after publish until routed.
        self.refs = 0

    def __repr__(self) -> str:
        return (
            f"Message(id={self.id}, exchange={self.exchange!r}, "
            f"routing_key={self.routing_key!r}, refs={self.refs})"
        )
