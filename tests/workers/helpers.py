"""What the worker tests share: server properties for a test connection, and the harness
that drives a connection handler over an opened AMQPConnection (model: h2's tests/helpers.py)."""

from __future__ import annotations

from typing import Any


def default_server_properties() -> dict[str, Any]:
    """Server properties as RabbitMQ shapes them (capabilities included)."""
    return {
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
        "product": "Shoal",
        "version": "0.1.0",
        "platform": "Python",
        "information": "An AMQP 0-9-1 broker",
    }
