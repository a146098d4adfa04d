"""AMQP field-table values as RabbitMQ compares and prints them, and the redeclare checks.

Decoded field values are heterogeneous (every AMQP field type), hence ``Any`` at this boundary.
Used by exchanges (binding arguments, headers matching), queue arguments, message groups and
the virtual host's redeclare checks (RabbitMQ ``assert_equivalence``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from broker.errors import PreconditionFailed

Arguments = Mapping[str, Any]


def freeze(value: Any) -> Hashable:
    """A hashable, order-insensitive form of an AMQP field value (tables compare as sets)."""
    if isinstance(value, Mapping):
        return ("table", tuple(sorted((str(k), freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(freeze(v) for v in value))
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, (bool, int, float, str, bytes, Decimal, type(None))):
        return value
    return ("repr", repr(value))


def amqp_type_name(value: Any) -> str:
    """The AMQP field type RabbitMQ would name for a decoded value (used in error texts)."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, (str, bytes, bytearray)):
        return "longstr"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return "timestamp" if hasattr(value, "timestamp") else type(value).__name__


def as_bytes(value: Any) -> bytes | None:
    """A longstr value as bytes (str or bytes); None for any other type."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return None


def same_value(a: Any, b: Any) -> bool:
    """Erlang ``==`` on field values: 1 == 1.0, but booleans are not numbers; str == bytes."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    sa, sb = as_bytes(a), as_bytes(b)
    if sa is not None or sb is not None:
        return sa == sb
    return bool(a == b)


def _type_class(value: Any) -> str:
    # rabbit_misc:type_class: every integer width (and decimal) is one class, floats another.
    name = amqp_type_name(value)
    if name in ("signedint", "long", "decimal"):
        return "int"
    return "float" if name == "double" else name


def same_argument(a: Any, b: Any) -> bool:
    """RabbitMQ ``assert_args_equivalence1``: same type class and equal values."""
    return _type_class(a) == _type_class(b) and same_value(a, b)


def value_text(value: Any) -> str:
    """A field value as RabbitMQ prints it in an error text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return str(value)


class Inequivalence(NamedTuple):
    """A redeclare that differs: which field, and both values as RabbitMQ prints them."""

    field: str
    received: str
    current: str

    def error(self, subject: str) -> PreconditionFailed:
        """RabbitMQ's 406 for a redeclare of ``subject`` (an exchange's or a queue's
        description) that differs here."""
        return PreconditionFailed(
            f"inequivalent arg '{self.field}' for {subject}: "
            f"received {self.received} but current is {self.current}"
        )


def field_inequivalence(field: str, received: Any, current: Any) -> Inequivalence | None:
    """RabbitMQ ``assert_field_equivalence``: ``received 'true' but current is 'false'``."""
    if received == current and type(received) is type(current):
        return None
    return Inequivalence(field, f"'{value_text(received)}'", f"'{value_text(current)}'")


_MISSING: Any = object()


def _arg_text(value: Any) -> str:
    if value is _MISSING:
        return "none"
    return f"the value '{value_text(value)}' of type '{amqp_type_name(value)}'"


def args_inequivalence(
    received: Arguments | None,
    current: Arguments | None,
    keys: Iterable[str],
    defaults: Mapping[str, Any] | None = None,
) -> Inequivalence | None:
    """The first of ``keys`` whose value differs (``defaults`` stand in for absent keys)."""
    received, current, defaults = received or {}, current or {}, defaults or {}
    for key in keys:
        new = received.get(key, defaults.get(key, _MISSING))
        old = current.get(key, defaults.get(key, _MISSING))
        if new is _MISSING and old is _MISSING:
            continue
        if new is _MISSING or old is _MISSING or not same_argument(new, old):
            return Inequivalence(key, _arg_text(new), _arg_text(old))
    return None
