"""A message's routing headers: sender-selected distribution (RabbitMQ's ``CC`` / ``BCC``).

A message may carry extra routing keys in its ``CC`` and ``BCC`` headers; :func:`header_routes`
reads them as ``rabbit_basic:header_routes`` does. Exchanges route with them
(``broker.topology.routing``) and dead-lettering keeps the ``CC`` ones
(``broker.messages.deadletter``), so they live with the message, below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import PreconditionFailed
from broker.messages.field_tables import amqp_type_name

# rabbit_basic ?ROUTING_HEADERS: headers whose values are extra routing keys, in this order.
ROUTING_HEADERS = ("CC", "BCC")


def has_routing_headers(headers: Mapping[str, Any]) -> bool:
    """Whether a message's headers ask for sender-selected distribution (``CC`` or ``BCC``)."""
    return "CC" in headers or "BCC" in headers


def _route_text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode(errors="replace")


def header_routes(headers: Mapping[str, Any] | None, names: tuple[str, ...] = ROUTING_HEADERS) -> list[str]:
    """The extra routing keys in ``headers``: the ``CC`` keys, then the ``BCC`` keys.

    RabbitMQ ``rabbit_basic:header_routes``: each header's value must be an array; only its
    longstr elements are keys (others are skipped). A header of another type makes
    ``basic.publish`` fail with 406 PRECONDITION_FAILED
    ``invalid message: {unacceptable_type_in_header,"CC",longstr}`` (rabbit_channel).
    """
    if not headers:
        return []
    routes: list[str] = []
    for name in names:
        if name not in headers:
            continue
        value = headers[name]
        if not isinstance(value, (list, tuple)):
            raise PreconditionFailed(
                f'invalid message: {{unacceptable_type_in_header,"{name}",{amqp_type_name(value)}}}'
            )
        # bytes: a longstr that is not UTF-8 -- or a byte array ('x'), which RabbitMQ skips but
        # a Publish record cannot tell apart (msgpack decodes both as bytes).
        routes += [_route_text(v) for v in value if isinstance(v, (str, bytes))]
    return routes
