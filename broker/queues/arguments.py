"""Queue and exchange arguments, validated once at declare with RabbitMQ's errors.

RabbitMQ 3.10 ``rabbit_amqqueue:check_declare_arguments`` validates a new queue's x-arguments in
a fixed order and answers the first bad one with 406 PRECONDITION_FAILED
``invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}`` -- the error
term printed with Erlang's ``~p``. Before that ``rabbit_channel`` checks that a dead-letter
exchange (and, for exchanges, an alternate exchange) is named by a string:
``invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'``.

The result is a :class:`QueueSettings`, from which :mod:`broker.queues.featured.queue_kinds` picks the queue's
storage and consumer handling once, at declare time, so a queue without arguments keeps the
plain, fastest path.

Beyond RabbitMQ's classic-queue arguments Shoal accepts:

* ``x-delivery-limit`` (RabbitMQ: quorum queues only) -- non-negative integer;
* ``holdOnPublishEnabled`` (Qpid Broker-J's queue attribute, which Broker-J accepts as a
  declare argument under its own name) -- hold a message until the Unix time in milliseconds
  of its ``x-qpid-not-valid-before`` header;
* ``qpid.group_header_key`` / ``qpid.shared_msg_group`` / ``qpid.default-message-group``
  (Qpid's message groups, by the names Qpid's 0-9-1 declare converter uses).

Called from: the supervisor process (VirtualHost.declare_queue / declare_exchange / publish).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.errors import PreconditionFailed
from broker.messages.field_tables import amqp_type_name

# rabbit_misc:check_expiry (3.10.8): at most ten years, in milliseconds.
MAX_EXPIRY_MS = 315_360_000_000
# rabbit_amqqueue check_max_priority_arg.
MAX_PRIORITY = 255

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOW_MODES = (DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX)

# RabbitMQ rabbit_amqqueue:declare_args/0 -- the queue arguments compared on redeclare.
QUEUE_ARG_KEYS = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
    "x-delivery-limit",  # compared as quorum queues do; Shoal accepts it on every queue
)
# A queue declared without x-queue-type is a classic queue; saying so explicitly is equivalent.
QUEUE_ARG_DEFAULTS = {"x-queue-type": "classic"}

# Qpid: the header read when a grouped queue names none, and the group of messages without it.
DEFAULT_GROUP_HEADER = "JMSXGroupID"
DEFAULT_GROUP = "qpid.no-group"
NOT_VALID_BEFORE = "x-qpid-not-valid-before"
HOLD_ON_PUBLISH = "holdOnPublishEnabled"
GROUP_HEADER_KEY = "qpid.group_header_key"
SHARED_GROUPS = "qpid.shared_msg_group"
DEFAULT_GROUP_KEY = "qpid.default-message-group"


class QueueSettings(NamedTuple):
    """What a queue's arguments ask for, parsed (times in milliseconds, as declared)."""

    message_ttl: int | None = None
    expires: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = DROP_HEAD
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False
    delivery_limit: int | None = None
    hold_on_publish: bool = False
    group_header: str | None = None  # None: no message groups
    shared_groups: bool = False
    default_group: str = DEFAULT_GROUP

    @property
    def needs_featured_storage(self) -> bool:
        """Whether entries need more than the plain FIFO log (see broker.queues.featured.featured_queue)."""
        return (
            self.message_ttl is not None or self.max_length is not None
            or self.max_length_bytes is not None or self.max_priority is not None
            or self.delivery_limit is not None or self.hold_on_publish
            or self.group_header is not None
        )


PLAIN = QueueSettings()


class _Invalid(Exception):
    """An argument check failed; ``term`` is RabbitMQ's error term, as ``~p`` prints it."""

    def __init__(self, term: str) -> None:
        super().__init__(term)
        self.term = term


def _erl_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------- the checks, as in 3.10.8


def _int(value: Any) -> int:
    if not _is_int(value):
        raise _Invalid(_erl_string(f"expected integer, got {amqp_type_name(value)}"))
    return int(value)


def _non_neg_int(value: Any) -> int:
    number = _int(value)
    if number < 0:
        raise _Invalid(f"{{value_negative,{number}}}")
    return number


def _expiry(number: int) -> int:
    if number < 0:
        raise _Invalid(f"{{value_negative,{number}}}")
    if number > MAX_EXPIRY_MS:
        raise _Invalid(f"{{value_too_large,{number}}}")
    return number


def _check_expires(value: Any) -> int:
    number = _int(value)
    if number == 0:
        raise _Invalid("{value_zero,0}")
    return _expiry(number)


def _check_ttl(value: Any) -> int:
    return _expiry(_int(value))


def _longstr(value: Any) -> str:
    text = _text(value)
    if text is None:
        raise _Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return text


def _check_dlrk(value: Any, arguments: Mapping[str, Any]) -> str:
    text = _longstr(value)
    if "x-dead-letter-exchange" not in arguments:
        raise _Invalid("routing_key_but_no_dlx_defined")
    return text


def _check_priority(value: Any) -> int:
    number = _non_neg_int(value)
    if number > MAX_PRIORITY:
        raise _Invalid(f"{{max_value_exceeded,{number}}}")
    return number


def _one_of(value: Any, allowed: tuple[str, ...], error: str) -> str:
    text = _longstr(value)
    if text not in allowed:
        raise _Invalid(error.format(text))
    return text


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def _check_queue_version(value: Any) -> int:
    number = _non_neg_int(value)
    if number not in (1, 2):
        raise _Invalid(_erl_string(f"unsupported queue version '{number}'"))
    return number


def _check_qpid_bool(value: Any) -> bool:
    # Broker-J converts attribute values from their string form as well.
    if isinstance(value, bool):
        return value
    text = _text(value)
    if text is not None and text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise _Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")


def _validate(key: str, value: Any, arguments: Mapping[str, Any]) -> Any:
    """Check one argument; returns its parsed value or raises _Invalid."""
    if key == "x-queue-type":
        return _one_of(value, ("classic", "quorum", "stream"), _erl_string("unsupported queue type '{}'"))
    if key == "x-expires":
        return _check_expires(value)
    if key == "x-message-ttl":
        return _check_ttl(value)
    if key == "x-dead-letter-exchange":
        return _longstr(value)
    if key == "x-dead-letter-routing-key":
        return _check_dlrk(value, arguments)
    if key in ("x-max-length", "x-max-length-bytes", "x-delivery-limit"):
        return _non_neg_int(value)
    if key == "x-max-priority":
        return _check_priority(value)
    if key == "x-overflow":
        return _one_of(value, OVERFLOW_MODES, "invalid_overflow")
    if key == "x-queue-mode":
        return _one_of(value, ("default", "lazy"), _erl_string("unsupported queue mode '{}'"))
    if key == "x-queue-version":
        return _check_queue_version(value)
    if key == "x-single-active-consumer":
        return _check_bool(value)
    if key == HOLD_ON_PUBLISH:
        return _check_qpid_bool(value)
    if key in (GROUP_HEADER_KEY, DEFAULT_GROUP_KEY):
        return _longstr(value)
    return value  # qpid.shared_msg_group: Qpid tests String.valueOf(value) == "1"


# RabbitMQ 3.10.8: x-queue-type first, then declare_args() order restricted to the classic
# queue's arguments; then Shoal's additions.
_CHECK_ORDER = (
    "x-queue-type", "x-expires", "x-message-ttl", "x-dead-letter-exchange",
    "x-dead-letter-routing-key", "x-max-length", "x-max-length-bytes", "x-max-priority",
    "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
    "x-delivery-limit", HOLD_ON_PUBLISH, GROUP_HEADER_KEY, SHARED_GROUPS, DEFAULT_GROUP_KEY,
)


def check_resource_arg(arguments: Mapping[str, Any] | None, key: str, subject: str) -> None:
    """rabbit_channel's ``r_arg`` check: an exchange named by an argument must be a longstr."""
    if arguments and key in arguments and _text(arguments[key]) is None:
        raise PreconditionFailed(
            f"invalid type '{amqp_type_name(arguments[key])}' for arg '{key}' in {subject}"
        )


def parse_queue_arguments(arguments: Mapping[str, Any] | None, subject: str) -> QueueSettings:
    """Validate a new queue's arguments (406 as RabbitMQ words it) and parse them.

    ``subject`` is ``queue 'q' in vhost '/'``. Unknown arguments are kept but ignored.
    """
    if not arguments:
        return PLAIN
    check_resource_arg(arguments, "x-dead-letter-exchange", subject)
    parsed: dict[str, Any] = {}
    for key in _CHECK_ORDER:
        if key in arguments:
            try:
                parsed[key] = _validate(key, arguments[key], arguments)
            except _Invalid as bad:
                raise PreconditionFailed(f"invalid arg '{key}' for {subject}: {bad.term}") from None
    return _settings(parsed)


def _settings(parsed: dict[str, Any]) -> QueueSettings:
    shared = str(parsed.get(SHARED_GROUPS)) == "1"
    grouped = shared or GROUP_HEADER_KEY in parsed
    return QueueSettings(
        message_ttl=parsed.get("x-message-ttl"),
        expires=parsed.get("x-expires"),
        max_length=parsed.get("x-max-length"),
        max_length_bytes=parsed.get("x-max-length-bytes"),
        overflow=parsed.get("x-overflow", DROP_HEAD),
        dead_letter_exchange=parsed.get("x-dead-letter-exchange"),
        dead_letter_routing_key=parsed.get("x-dead-letter-routing-key"),
        max_priority=parsed.get("x-max-priority"),
        single_active_consumer=parsed.get("x-single-active-consumer", False),
        delivery_limit=parsed.get("x-delivery-limit"),
        hold_on_publish=parsed.get(HOLD_ON_PUBLISH, False),
        group_header=parsed.get(GROUP_HEADER_KEY, DEFAULT_GROUP_HEADER) if grouped else None,
        shared_groups=shared,
        default_group=parsed.get(DEFAULT_GROUP_KEY, DEFAULT_GROUP),
    )


# ------------------------------------------------------------------ per-message expiration

_LEADING_INTEGER = re.compile(r"([+-]?[0-9]+)(.*)", re.DOTALL)


def parse_expiration(expiration: str | bytes) -> int:
    """The per-message TTL in ms; 406 ``invalid expiration '...': ...`` as rabbit_channel says.

    RabbitMQ ``rabbit_basic:parse_expiration``: Erlang ``string:to_integer`` on the property,
    then the same bounds as x-message-ttl.
    """
    text = _text(expiration) or ""
    match = _LEADING_INTEGER.fullmatch(text)
    if match is None:
        term = "no_integer"
    elif match.group(2):
        term = f"{{leftover_string,{_erl_string(match.group(2))}}}"
    else:
        try:
            return _expiry(int(match.group(1)))
        except _Invalid as bad:
            term = bad.term
    raise PreconditionFailed(f"invalid expiration '{text}': {term}")
