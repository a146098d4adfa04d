"""Federation (RabbitMQ's rabbitmq_federation plugin): upstreams, upstream sets, and the header
rules that stop a message or a binding going round a ring. Pure: stdlib only, no IO.

Upstreams are runtime parameters (``broker.parameters``): the component ``federation-upstream``
(``{"uri": URI | [URI, ...], "exchange", "queue", "max-hops", ...}``) and
``federation-upstream-set`` (``[{"upstream": NAME, ...overrides}, ...]``; the set ``all`` is
every upstream of the vhost, implicitly). A policy whose definition has ``federation-upstream``
or ``federation-upstream-set`` federates the exchanges and queues it applies to; the links
process (``links/federation.py``) runs one link per (object, upstream).

The checks and texts are rabbit_federation_parameters' (``rabbit_parameter_validation:proplist``
per key). The loop rules are rabbit_federation_util's: a message carries ``x-received-from``, one
table per link it crossed, newest first; an upstream exchange of type ``x-federation-upstream``
passes it on only while that array is shorter than ``x-max-hops`` and names no hop from its
downstream (:func:`should_forward`). A binding carries ``x-bound-from`` the other way, with a
``hops`` count that runs down to 0 (:func:`bound_from`, rabbit_federation_exchange_link
``update_binding``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ROUTING_HEADER = "x-received-from"
BINDING_HEADER = "x-bound-from"
MAX_HOPS_ARG = "x-max-hops"
DOWNSTREAM_NAME_ARG = "x-downstream-name"
DOWNSTREAM_VHOST_ARG = "x-downstream-vhost"
UPSTREAM_TYPE = "x-federation-upstream"
POLICY_KEYS = ("federation-upstream", "federation-upstream-set")
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
# rabbit_federation_upstream's defaults
DEFAULTS: dict[str, Any] = {"prefetch-count": 1000, "reconnect-delay": 5, "max-hops": 1,
                            "ack-mode": "on-confirm", "trust-user-id": False, "expires": None,
                            "message-ttl": None, "exchange": None, "queue": None,
                            "consumer-tag": None, "ha-policy": None, "bind-nowait": False}
_KINDS = {"exchange": "binary", "queue": "binary", "consumer-tag": "binary",
          "prefetch-count": "number", "reconnect-delay": "number", "max-hops": "number",
          "expires": "number", "message-ttl": "number", "trust-user-id": "boolean",
          "ack-mode": "enum", "ha-policy": "binary", "bind-nowait": "boolean"}


class FederationError(ValueError):
    """The reason of a ``Validation failed`` (broker.parameters wraps it)."""


def erlang_term(value: Any) -> str:
    """A JSON value as Erlang's ``~p`` shows the term RabbitMQ decoded it to."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '<<"' + value.replace('"', '\\"') + '">>'
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in value.items()) + "]"
    return json.dumps(value)


def _check_key(key: str, value: Any) -> None:
    kind = _KINDS[key]
    if value is None:
        return
    if kind == "binary" and not isinstance(value, str):
        raise FederationError(f"{key} should be binary, actually was {erlang_term(value)}")
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise FederationError(f"{key} should be a number, actually was {erlang_term(value)}")
    if kind == "boolean" and not isinstance(value, bool):
        raise FederationError(f"{key} should be boolean, actually was {erlang_term(value)}")
    if kind == "enum" and value not in ACK_MODES:
        raise FederationError(f"{key} should be one of [{','.join(ACK_MODES)}], actually was "
                              f"{erlang_term(value)}")


def _check_uri(uri: Any) -> None:
    if not isinstance(uri, str):
        raise FederationError(f"uri should be binary, actually was {erlang_term(uri)}")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 -- raises for a bad port
    except ValueError:
        raise FederationError(f'"{uri}" not a valid URI') from None
    if parts.scheme not in ("amqp", "amqps"):
        raise FederationError(f'"{uri}" not a valid URI: {{unexpected_uri_scheme,"{parts.scheme}"}}')


def _proplist(name: str, value: Any, mandatory: str) -> None:
    """rabbit_parameter_validation:proplist: an object, its mandatory key, known keys only."""
    if not isinstance(value, dict):
        raise FederationError(f"{name} not a list {erlang_term(value)}")
    unknown = [k for k in value if k not in _KINDS and k != mandatory]
    if unknown:
        raise FederationError(f"Unrecognised terms {erlang_term({k: value[k] for k in unknown})} in "
                              f"{name}")
    if mandatory not in value:
        raise FederationError(f'Key "{mandatory}" not found in {name}')
    for key, v in value.items():
        if key != mandatory:
            _check_key(key, v)


def validate_upstream(name: str, value: Any) -> None:
    """A ``federation-upstream`` value: FederationError with RabbitMQ's reason."""
    _proplist(name, value, "uri")
    uris = value["uri"]
    if isinstance(uris, list):
        if not uris:
            raise FederationError("uri should be a non-empty list")
        for uri in uris:
            _check_uri(uri)
    else:
        _check_uri(uris)


def validate_upstream_set(name: str, value: Any) -> None:
    """A ``federation-upstream-set`` value: a list of ``{"upstream": NAME, ...overrides}``."""
    if not isinstance(value, list):
        raise FederationError(f"{name} should be a list, actually was {erlang_term(value)}")
    for member in value:
        _proplist(name, member, "upstream")
        if not isinstance(member["upstream"], str):
            raise FederationError(f"upstream should be binary, actually was "
                                  f"{erlang_term(member['upstream'])}")


def policy_errors(definition: Mapping[str, Any]) -> list[str]:
    """rabbit_federation_parameters:validate_policy for a definition's federation keys."""
    keys = [k for k in POLICY_KEYS if k in definition]
    if len(keys) == 2:
        return ["cannot specify federation-upstream and federation-upstream-set together"]
    for key in keys:
        if not isinstance(definition[key], str):
            noun = "upstream set" if key.endswith("-set") else "upstream"
            return [f"{erlang_term(definition[key])} is not a valid federation {noun} name"]
    return []


@dataclass(frozen=True)
class Upstream:
    """One upstream of one federated exchange or queue, its set's overrides applied."""

    name: str
    uris: tuple[str, ...]
    exchange: str | None
    queue: str | None
    max_hops: int
    expires: int | None
    message_ttl: int | None
    prefetch: int
    reconnect_delay: float
    ack_mode: str
    trust_user_id: bool
    consumer_tag: str

    @classmethod
    def of(cls, name: str, value: Mapping[str, Any],
           overrides: Mapping[str, Any] | None = None) -> Upstream:
        """rabbit_federation_upstream from_upstream_or_set: the set member's key, else the
        upstream's, else the default."""
        def get(key: str) -> Any:
            for source in (overrides or {}, value):
                if source.get(key) is not None:
                    return source[key]
            return DEFAULTS[key]
        uris = value["uri"]
        expires, ttl = get("expires"), get("message-ttl")
        return cls(name=name, uris=tuple(uris if isinstance(uris, list) else [uris]),
                   exchange=get("exchange"), queue=get("queue"), max_hops=int(get("max-hops")),
                   expires=None if expires is None else int(expires),
                   message_ttl=None if ttl is None else int(ttl),
                   prefetch=int(get("prefetch-count")),
                   reconnect_delay=float(get("reconnect-delay")), ack_mode=str(get("ack-mode")),
                   trust_user_id=bool(get("trust-user-id")),
                   consumer_tag=str(get("consumer-tag") or f"federation-link-{name}"))


def upstreams_for(definition: Mapping[str, Any] | None,
                  parameters: Mapping[tuple[str, str], Any]) -> list[Upstream]:
    """The upstreams a policy definition names: ``federation-upstream`` NAME, or the members of
    ``federation-upstream-set`` NAME (``all``: every upstream). ``parameters`` maps
    ``(component, name)`` to the vhost's values; a name with no upstream is skipped."""
    if not definition:
        return []
    upstreams = {n: v for (c, n), v in parameters.items() if c == "federation-upstream"}
    single = definition.get("federation-upstream")
    if isinstance(single, str):
        return [Upstream.of(single, upstreams[single])] if single in upstreams else []
    set_name = definition.get("federation-upstream-set")
    if not isinstance(set_name, str):
        return []
    if set_name == "all" and ("federation-upstream-set", "all") not in parameters:
        return [Upstream.of(n, upstreams[n]) for n in sorted(upstreams)]
    members = parameters.get(("federation-upstream-set", set_name)) or []
    return [Upstream.of(m["upstream"], upstreams[m["upstream"]], m) for m in members
            if isinstance(m, dict) and m.get("upstream") in upstreams]


def node_name(port: int) -> str:
    """This broker's name in federation (RabbitMQ's ``cluster_name``, ``rabbit@HOST``): in
    upstream queue and exchange names and in ``x-downstream-name``. Brokers on one host differ
    by their AMQP port."""
    host = socket.gethostname().split(".")[0]
    return f"shoal@{host}" if port == 5672 else f"shoal@{host}:{port}"


def safe_uri(uri: str) -> str:
    """rabbit_federation_upstream remove_credentials: the URI without user and password."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value


def already_seen(name: str | None, vhost: str | None, entries: list[Any]) -> bool:
    """Whether an ``x-received-from`` / ``x-bound-from`` entry names ``name`` in ``vhost``."""
    return any(isinstance(e, Mapping) and _text(e.get("cluster-name")) == name
               and _text(e.get("vhost")) == vhost for e in entries)


def should_forward(headers: Mapping[str, Any] | None, max_hops: int, name: str | None,
                   vhost: str | None) -> bool:
    """rabbit_federation_util:should_forward: fewer hops than ``max_hops`` so far, and none
    through the downstream ``name``/``vhost``."""
    entries = (headers or {}).get(ROUTING_HEADER)
    if not isinstance(entries, list):
        return True
    return len(entries) < max_hops and not already_seen(name, vhost, entries)


def received_from(headers: Mapping[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with ``entry`` first in ``x-received-from`` (rabbit_basic
    prepend_table_header)."""
    out = dict(headers or {})
    previous = out.get(ROUTING_HEADER)
    out[ROUTING_HEADER] = [entry, *(previous if isinstance(previous, list) else [])]
    return out


def bound_from(arguments: Mapping[str, Any] | None, max_hops: int, upstream_name: str | None,
               upstream_vhost: str, node: str, vhost: str, exchange: str, suffix: str
               ) -> dict[str, Any] | None:
    """A downstream binding's arguments as the upstream gets them (exchange_link
    update_binding): ``x-bound-from`` gains this hop with ``hops`` = the smaller of the last
    hop's ``hops`` - 1 and ``max_hops``; None when that is 0 or the binding came from the
    upstream itself (it propagates no further)."""
    args = dict(arguments or {})
    entries = args.get(BINDING_HEADER)
    hops = max_hops
    if isinstance(entries, list) and entries:
        if already_seen(upstream_name, upstream_vhost, entries):
            return None
        last = entries[0].get("hops", 0) if isinstance(entries[0], Mapping) else 0
        hops = min(int(last) - 1, max_hops)
    if hops <= 0:
        return None
    entry = {"cluster-name": node, "vhost": vhost, "exchange": f"{vhost}:{exchange} {suffix}",
             "hops": hops}
    args[BINDING_HEADER] = [entry, *(entries if isinstance(entries, list) else [])]
    return args


def upstream_queue_name(upstream_exchange: str, upstream_vhost: str, exchange: str, vhost: str,
                        node: str) -> str:
    """exchange_link upstream_queue_name: ``federation: X -> NODE`` (plus the downstream's
    vhost and name where they differ)."""
    if vhost != upstream_vhost:
        down = f":{vhost}:{exchange}"
    else:
        down = "" if exchange == upstream_exchange else f":{exchange}"
    return f"federation: {upstream_exchange} -> {node}{down}"
