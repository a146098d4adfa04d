"""Runtime parameters (RabbitMQ's ``rabbitmqctl set_parameter``): the ``shovel`` component's keys
checked, and its URIs read (the ``federation-upstream`` and ``federation-upstream-set``
components are ``broker.federation``'s). Pure: stdlib only, no IO.

A dynamic shovel is the parameter ``{"vhost", "component": "shovel", "name", "value": {...}}``;
:func:`validate_shovel` accepts what RabbitMQ 3.10's rabbit_shovel_parameters accepts for AMQP
0-9-1 on both sides and answers its ``Validation failed`` text otherwise. The shovel itself runs in
the links process (``links/``), which reads the value back with :func:`shovel_settings`.

URIs are RabbitMQ's (``amqp://user:pass@host:port/vhost``, the vhost percent-encoded: ``%2f`` is
``/``, an empty path is ``/`` too). ``amqp://`` with no host is *this* broker, reached on its own
AMQP listener (``ParsedURI.local``); with no user it logs in as RabbitMQ's default user
``guest:guest`` -- a shovel to or from the broker itself with another user names it
(``amqp://user:pass@/vhost``, the host still left out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from broker.federation import (
    FederationError,
    erlang_term,
    validate_upstream,
    validate_upstream_set,
)

COMPONENTS = ("shovel", "federation-upstream", "federation-upstream-set")
ACK_MODES = ("on-confirm", "on-publish", "no-ack")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0
DEFAULT_USER = ("guest", "guest")
PROPERTY_KEYS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                 "user_id", "app_id", "cluster_id")
# Pre-3.7 names RabbitMQ still takes, and the key each means now.
_OLD_KEYS = {"delete-after": "src-delete-after", "prefetch-count": "src-prefetch-count",
             "add-forward-headers": "dest-add-forward-headers",
             "add-timestamp-header": "dest-add-timestamp-header",
             "publish-properties": "dest-publish-properties"}
_KNOWN = {"src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count",
          "src-delete-after", "src-protocol", "dest-uri", "dest-queue", "dest-exchange",
          "dest-exchange-key", "dest-add-forward-headers", "dest-add-timestamp-header",
          "dest-publish-properties", "dest-protocol", "ack-mode", "reconnect-delay",
          "src-queue-args", "dest-queue-args", "src-consumer-args", *_OLD_KEYS}
# The argument names RabbitMQ 3.10.8 takes in src-queue-args / dest-queue-args (its
# rabbit_amqqueue:declare_args/0) and in src-consumer-args (consume_args/0). As RabbitMQ, only the
# names are checked here; the broker that declares the queue or consumer judges the values.
QUEUE_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
              "x-dead-letter-strategy", "x-max-length", "x-max-length-bytes",
              "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority", "x-overflow",
              "x-queue-mode", "x-single-active-consumer", "x-queue-type",
              "x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
              "x-initial-cluster-size", "x-queue-leader-locator")
CONSUMER_ARGS = ("x-priority", "x-cancel-on-ha-failover", "x-stream-offset")


class ParameterError(ValueError):
    """RabbitMQ's ``Validation failed`` text (a 400's reason, ``shoal ctl``'s message)."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"Validation failed\n\n{problem}\n")
        self.problem = problem


@dataclass(frozen=True)
class ParsedURI:
    scheme: str
    host: str  # "" is this broker (``local``)
    port: int
    user: str
    password: str
    vhost: str

    @property
    def local(self) -> bool:
        return not self.host

    def redacted(self) -> str:
        """The URI as status shows it: no password."""
        return redact(self.original) if self.original else ""

    original: str = field(default="", compare=False)


def redact(uri: str) -> str:
    """``uri`` without its password (``amqp://user:***@host``)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return uri.replace(parts.netloc, f"{user}:***@{netloc[2]}", 1)


def parse_uri(uri: Any) -> ParsedURI:
    """RabbitMQ's AMQP URI (module text); ParameterError when it is not one."""
    if not isinstance(uri, str):
        raise ParameterError(f"{json.dumps(uri)} is not a valid URI")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise ParameterError(f'"{uri}" is not a valid URI') from None
    if parts.scheme not in ("amqp", "amqps"):
        raise ParameterError(f'"{uri}" is not a valid URI: the scheme must be amqp or amqps')
    path = parts.path
    if path.count("/") > 1:
        raise ParameterError(f'"{uri}" is not a valid URI: the vhost must be percent-encoded '
                             '(%2f for "/")')
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    user, password = DEFAULT_USER
    if parts.username is not None:
        user, password = unquote(parts.username), unquote(parts.password or "")
    return ParsedURI(parts.scheme, parts.hostname or "",
                     port or (5671 if parts.scheme == "amqps" else 5672),
                     user, password, vhost, original=uri)


def _uris(value: dict[str, Any], key: str) -> list[str]:
    if key not in value:
        raise ParameterError(f"Key \"{key}\" not found in shovel")
    uris = value[key]
    if isinstance(uris, str):
        uris = [uris]
    if not isinstance(uris, list) or not uris:
        raise ParameterError(f"{key} should be a URI or a non-empty list of URIs, actually was "
                             f"{json.dumps(uris)}")
    for uri in uris:
        parse_uri(uri)
    return list(uris)


def _text(value: dict[str, Any], key: str) -> str | None:
    if key not in value or value[key] is None:
        return None
    if not isinstance(value[key], str):
        raise ParameterError(f"{key} should be a string, actually was {json.dumps(value[key])}")
    return str(value[key])


def _args(value: dict[str, Any], key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """An arguments table (``src-queue-args``, ...): its names checked as RabbitMQ checks them."""
    table = value.get(key, {})
    if table == []:  # what an empty table is in RabbitMQ's own exports
        table = {}
    if not isinstance(table, dict):
        raise ParameterError(f"{key} should be a JSON object, actually was {json.dumps(table)}")
    unknown = {k: v for k, v in table.items() if k not in allowed}
    if unknown:
        raise ParameterError(f"Unrecognised terms {erlang_term(unknown)} in {key}")
    return dict(table)


def _bool(value: dict[str, Any], key: str) -> bool:
    v = value.get(key, False)
    if not isinstance(v, bool):
        raise ParameterError(f"{key} should be boolean, actually was {json.dumps(v)}")
    return v


@dataclass(frozen=True)
class ShovelSettings:
    """One dynamic shovel's value, checked and with RabbitMQ's defaults filled in."""

    src_uris: list[str]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    prefetch: int
    delete_after: str | int  # "never", "queue-length" or a count
    dest_uris: list[str]
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None  # None: each message's own routing key
    add_forward_headers: bool
    add_timestamp_header: bool
    publish_properties: dict[str, Any]
    ack_mode: str
    reconnect_delay: float
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    src_consumer_args: dict[str, Any] = field(default_factory=dict)


def shovel_settings(raw: Any, name: str = "shovel") -> ShovelSettings:
    """A shovel parameter's value, checked (module text); ParameterError with RabbitMQ's reason
    (which names the parameter ``name``)."""
    if not isinstance(raw, dict):
        raise ParameterError(f"shovel value should be a JSON object, actually was {json.dumps(raw)}")
    value: dict[str, Any] = {_OLD_KEYS.get(str(k), str(k)): v for k, v in raw.items()}
    unknown = {k: v for k, v in raw.items() if k not in _KNOWN}
    if unknown:
        raise ParameterError(f"Unrecognised terms {erlang_term(unknown)} in {name}")
    for side in ("src", "dest"):
        protocol = value.get(f"{side}-protocol", "amqp091")
        if protocol != "amqp091":
            raise ParameterError(f"{side}-protocol should be one of [\"amqp091\"] in this Shoal, "
                                 f"actually was {json.dumps(protocol)} (amqp10 is not supported)")
    src_uris, dest_uris = _uris(value, "src-uri"), _uris(value, "dest-uri")
    src_queue, src_exchange = _text(value, "src-queue"), _text(value, "src-exchange")
    if src_queue is not None and src_exchange is not None:
        raise ParameterError("Cannot specify 'src-exchange' and 'src-queue'")
    if src_queue is None and src_exchange is None:
        raise ParameterError("Must specify 'src-exchange' or 'src-queue'")
    if src_queue is not None and "src-exchange-key" in value:
        raise ParameterError("Cannot specify 'src-exchange-key' with 'src-queue'")
    dest_queue, dest_exchange = _text(value, "dest-queue"), _text(value, "dest-exchange")
    if dest_queue is not None and dest_exchange is not None:
        raise ParameterError("Cannot specify 'dest-exchange' and 'dest-queue'")
    if dest_queue is not None and "dest-exchange-key" in value:
        raise ParameterError("Cannot specify 'dest-exchange-key' with 'dest-queue'")
    prefetch = value.get("src-prefetch-count", DEFAULT_PREFETCH)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= 65535:
        raise ParameterError(f"src-prefetch-count should be a number between 0 and 65535, "
                             f"actually was {json.dumps(prefetch)}")
    delete_after = value.get("src-delete-after", "never")
    if not (delete_after in ("never", "queue-length") or (
            isinstance(delete_after, int) and not isinstance(delete_after, bool)
            and delete_after >= 0)):
        raise ParameterError("src-delete-after should be a number greater than or equal to 0, "
                             f"\"never\" or \"queue-length\", actually was {json.dumps(delete_after)}")
    if delete_after == "queue-length" and src_queue is None:
        raise ParameterError("src-delete-after \"queue-length\" needs 'src-queue'")
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        raise ParameterError(f"ack-mode should be one of {json.dumps(list(ACK_MODES))}, "
                             f"actually was {json.dumps(ack_mode)}")
    delay = value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ParameterError(f"reconnect-delay should be a number greater than or equal to 0, "
                             f"actually was {json.dumps(delay)}")
    props = value.get("dest-publish-properties", {})
    if props == []:  # what an empty table is in RabbitMQ's own exports
        props = {}
    if not isinstance(props, dict):
        raise ParameterError(f"dest-publish-properties should be a JSON object, actually was "
                             f"{json.dumps(props)}")
    bad = sorted(set(props) - set(PROPERTY_KEYS))
    if bad:
        raise ParameterError(f"dest-publish-properties: unknown properties {bad}")
    src_key = _text(value, "src-exchange-key")
    return ShovelSettings(
        src_uris=src_uris, src_queue=src_queue, src_exchange=src_exchange,
        src_exchange_key=src_key if src_key is not None else "#" if src_exchange else "",
        prefetch=prefetch, delete_after=delete_after, dest_uris=dest_uris,
        dest_queue=dest_queue, dest_exchange=dest_exchange,
        dest_exchange_key=_text(value, "dest-exchange-key"),
        add_forward_headers=_bool(value, "dest-add-forward-headers"),
        add_timestamp_header=_bool(value, "dest-add-timestamp-header"),
        publish_properties=dict(props), ack_mode=str(ack_mode), reconnect_delay=float(delay),
        src_queue_args=_args(value, "src-queue-args", QUEUE_ARGS),
        dest_queue_args=_args(value, "dest-queue-args", QUEUE_ARGS),
        src_consumer_args=_args(value, "src-consumer-args", CONSUMER_ARGS))


def validate(component: str, name: str, value: Any) -> None:
    """A parameter as ``set_parameter`` gets it: ParameterError with RabbitMQ's reason."""
    if component not in COMPONENTS:
        raise ParameterError(f"component {component} not found")
    if not name:
        raise ParameterError("a parameter needs a non-empty name")
    try:
        if component == "federation-upstream":
            validate_upstream(name, value)
        elif component == "federation-upstream-set":
            validate_upstream_set(name, value)
        else:
            shovel_settings(value, name)
    except FederationError as exc:
        raise ParameterError(str(exc)) from None
