"""RabbitMQ 3.x management objects (its field names and shapes) made from a sample. Pure.

Every function takes the latest :class:`management.stats.Sample` (and the one rates are
measured against) and returns plain dicts, as RabbitMQ's management API answers them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus, unquote

from management.stats import QUEUE_COUNTERS, Sample, object_key, rate, row_vhost

DEFAULT_EXCHANGE_PATH = "amq.default"  # the default exchange's name in paths


@dataclass
class Node:
    """Who this broker is, as the API names it."""

    name: str  # shoal@HOST, RabbitMQ's rabbit@HOST
    amqp_host: str
    amqp_port: int
    http_port: int
    version: str
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047


def details(value: float) -> dict[str, float]:
    return {"rate": value}


def _rate(latest: Sample, base: Sample | None, pick: Any) -> float:
    if base is None:
        return 0.0
    return rate(pick(latest), pick(base), latest.time - base.time)


def counters_with_rates(values: dict[str, int], before: dict[str, int] | None,
                        seconds: float) -> dict[str, Any]:
    """RabbitMQ's ``message_stats``: each counter and its ``<name>_details.rate`` (0 without
    an earlier sample), and ``deliver_get``: what was delivered or fetched, every way."""
    values = dict(values)
    if "deliver" in values:
        values["deliver_get"] = sum(values.get(k, 0)
                                    for k in ("deliver", "deliver_no_ack", "get", "get_no_ack"))
        if before is not None:
            before = dict(before, deliver_get=sum(
                before.get(k, 0) for k in ("deliver", "deliver_no_ack", "get", "get_no_ack")))
    out: dict[str, Any] = {}
    for name, value in values.items():
        out[name] = value
        out[f"{name}_details"] = details(
            rate(value, before.get(name, value), seconds) if before is not None else 0.0)
    return out


# ---------------------------------------------------------------- bindings' properties_key

def quote_binding(text: str) -> str:
    """rabbit_mgmt_format:quote_binding: quote_plus, then every % as %25."""
    return quote_plus(text, safe="").replace("%", "%25")


def args_hash(arguments: dict[str, Any]) -> str:
    """A short stable hash of a binding's arguments (RabbitMQ uses erlang:phash2; any stable
    hash does: the key is only read back by this API)."""
    canonical = json.dumps(arguments, sort_keys=True, default=str).encode()
    return base64.urlsafe_b64encode(hashlib.sha1(canonical).digest()[:6]).decode()


def properties_key(routing_key: str, arguments: dict[str, Any] | None) -> str:
    """What names one binding among those between the same two ends: ``~`` for an empty key
    without arguments, else the quoted key (and ``~`` and the arguments' hash)."""
    if not arguments:
        return "~" if routing_key == "" else quote_binding(routing_key)
    return f"{quote_binding(routing_key)}~{quote_binding(args_hash(arguments))}"


def matches_properties_key(given: str, routing_key: str, arguments: dict[str, Any] | None) -> bool:
    """Whether ``given`` (a path segment, decoded once) names this binding: RabbitMQ's key,
    or its form decoded once more (clients differ in how often they quote)."""
    key = properties_key(routing_key, arguments)
    return given in (key, unquote(key), unquote(unquote(key)))


# ------------------------------------------------------------------------------- objects

def policy_fields(snapshot: dict[str, Any], kind: str, name: str,
                  vhost: str = "/") -> dict[str, Any]:
    """``policy``, ``operator_policy`` and ``effective_policy_definition`` of a queue or exchange
    of ``vhost`` (the snapshot's ``vhost_policies``, broker.runtime.policies.policy_snapshot)."""
    per_vhost = snapshot.get("vhost_policies") or {"/": snapshot.get("policies")}
    applied = ((per_vhost.get(vhost) or {}).get("applied") or {}).get(kind, {}).get(name)
    if not applied:
        return {"policy": None, "operator_policy": None, "effective_policy_definition": {}}
    return {"policy": applied[0], "operator_policy": applied[1],
            "effective_policy_definition": applied[2] or {}}


def iso_time(t: float) -> str:
    """RabbitMQ 3.10's timestamps in the API: ``2024-05-01T12:00:00.123+00:00``."""
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+00:00"


def queue_items(latest: Sample, base: Sample | None, node: Node,
                consumers_by_queue: dict[str, int] | None = None) -> list[dict[str, Any]]:
    snapshot = latest.snapshot
    names = connection_names(latest)
    seconds = latest.time - base.time if base is not None else 0.0
    old = base.queue_counters if base is not None else {}
    items = []
    for row in snapshot.get("queues", ()):
        name, durable, auto_delete, owner, arguments, ready, unacked, consumers, enqueued = row[:9]
        vhost = row_vhost(row, 16)
        key = object_key(vhost, name)
        before = old.get(key)
        counters = latest.queue_counters.get(key, ())
        stats = counters_with_rates(
            {"publish": enqueued, **dict(zip(QUEUE_COUNTERS, counters[4:], strict=False))},
            dict(zip(("publish", *QUEUE_COUNTERS), before[3:], strict=False))
            if before is not None else None, seconds)
        messages = ready + unacked
        if before is not None:
            m_rate = rate(messages, before[0], seconds)
            r_rate = rate(ready, before[1], seconds)
            u_rate = rate(unacked, before[2], seconds)
        else:
            m_rate = r_rate = u_rate = 0.0
        item: dict[str, Any] = {
            "name": name,
            "vhost": vhost,
            "durable": durable,
            "auto_delete": auto_delete,
            "exclusive": owner is not None,
            "arguments": arguments,
            "node": node.name,
            "type": "classic",
            "state": "running",
            **policy_fields(snapshot, "queue", name, vhost),
            "exclusive_consumer_tag": None,
            "owner_pid_details": ({"name": names.get((owner[0], owner[1]), ""),
                                   "peer_host": "", "peer_port": 0}
                                  if owner is not None else None),
            "consumers": consumers,
            "consumer_utilisation": None,
            "consumer_capacity": 0,
            "messages": messages,
            "messages_details": details(m_rate),
            "messages_ready": ready,
            "messages_ready_details": details(r_rate),
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": details(u_rate),
            "message_stats": stats,
        }
        if key in latest.idle_since:  # RabbitMQ writes it for an idle queue only
            item["idle_since"] = iso_time(latest.idle_since[key])
        if owner is None:
            del item["owner_pid_details"]
        items.append(item)
    return items


EXCHANGE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange",
    "fanout": "AMQP fanout exchange",
    "topic": "AMQP topic exchange",
    "headers": "AMQP headers exchange",
}


def exchange_items(latest: Sample, node: Node, base: Sample | None = None) -> list[dict[str, Any]]:
    seconds = latest.time - base.time if base is not None else 0.0
    old = base.exchange_counters if base is not None else {}

    def stats(vhost: str, name: str) -> dict[str, Any]:
        key = object_key(vhost, name)
        publish_in, publish_out = latest.exchange_counters.get(key, (0, 0))
        before = old.get(key)
        return counters_with_rates(
            {"publish_in": publish_in, "publish_out": publish_out},
            {"publish_in": before[0], "publish_out": before[1]} if before is not None else None,
            seconds)

    return [{
        "name": name,
        "vhost": row_vhost(row, 8),
        "type": type,
        "durable": durable,
        "auto_delete": auto_delete,
        "internal": internal,
        "arguments": arguments,
        "user_who_performed_action": "rmq-internal" if name == "" or name.startswith("amq.") else "",
        **policy_fields(latest.snapshot, "exchange", name, row_vhost(row, 8)),
        "message_stats": stats(row_vhost(row, 8), name),
    } for row in latest.snapshot.get("exchanges", ())
        for name, type, durable, auto_delete, internal, arguments in [row[:6]]]


def binding_items(latest: Sample) -> list[dict[str, Any]]:
    """Every binding, the default exchange's (one per queue) first, as RabbitMQ lists them."""
    items = [binding_item(row_vhost(q, 16), "", q[0], "queue", q[0], {})
             for q in latest.snapshot.get("queues", ())]
    items += [binding_item(row_vhost(b, 5), *b[:5]) for b in latest.snapshot.get("bindings", ())]
    return items


def binding_item(vhost: str, source: str, destination: str, destination_type: str,
                 routing_key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": destination_type,
        "routing_key": routing_key,
        "arguments": arguments,
        "properties_key": properties_key(routing_key, arguments),
    }


def connection_names(latest: Sample) -> dict[tuple[int, int], str]:
    """(worker, conn) → the connection's name."""
    return {(c["worker"], c["conn"]): c["name"] for c in latest.connections}


def _split_peer(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return peer, 0


def connection_items(latest: Sample, base: Sample | None, node: Node) -> list[dict[str, Any]]:
    seconds = latest.time - base.time if base is not None else 0.0
    old = base.conn_counters if base is not None else {}
    items = []
    for c in latest.connections:
        peer_host, peer_port = _split_peer(c.get("peer", ""))
        recv, send = c.get("recv_oct", 0), c.get("send_oct", 0)
        before = old.get(c["name"])
        items.append({
            "name": c["name"],
            "node": node.name,
            "vhost": c.get("vhost", "/"),
            "user": c.get("user", ""),
            "user_who_performed_action": c.get("user", ""),
            "state": c.get("state", "running"),
            "channels": c.get("channels", 0),
            "peer_host": peer_host,
            "peer_port": peer_port,
            "host": node.amqp_host,
            "port": node.amqp_port,
            "protocol": "AMQP 0-9-1",
            "type": "network",
            "auth_mechanism": "PLAIN",
            "ssl": False,
            "timeout": node.heartbeat,
            "frame_max": node.frame_max,
            "channel_max": node.channel_max,
            "client_properties": _client_properties(c),
            "connected_at": int(c.get("connected_at", 0) * 1000),
            "recv_oct": recv,
            "recv_oct_details": details(rate(recv, before[0], seconds) if before else 0.0),
            "send_oct": send,
            "send_oct_details": details(rate(send, before[1], seconds) if before else 0.0),
            "worker": c.get("worker"),
        })
        name = items[-1]["client_properties"].get("connection_name")
        if isinstance(name, str):
            items[-1]["user_provided_name"] = name
    return items


def _client_properties(c: dict[str, Any]) -> dict[str, Any]:
    props = c.get("client_properties")
    if isinstance(props, dict) and props:
        return props
    return {"product": c["client"]} if c.get("client") else {}


def channel_items(latest: Sample, node: Node) -> list[dict[str, Any]]:
    """Every open channel the workers listed, with the supervisor's books (consumers, unsettled
    deliveries) where it keeps them; a channel only the supervisor knows of is listed too."""
    books = {(worker, conn, ch): (consumers, unacked)
             for worker, conn, ch, consumers, unacked in latest.snapshot.get("channels", ())}
    by_conn = {(c["worker"], c["conn"]): c for c in latest.connections}
    items = []
    for c in latest.connections:
        for row in c.get("open_channels") or ():
            key = (c["worker"], c["conn"], row["number"])
            consumers, unacked = books.pop(key, (row["consumers"], row["unacked"]))
            items.append(channel_item(c, row["number"], consumers, unacked, node, row))
    for (worker, conn, ch), (consumers, unacked) in books.items():
        owner = by_conn.get((worker, conn))
        if owner is not None:
            items.append(channel_item(owner, ch, consumers, unacked, node))
    items.sort(key=lambda item: (item["connection_details"]["name"], item["number"]))
    return items


def channel_item(c: dict[str, Any], number: int, consumers: int, unacked: int,
                 node: Node, row: dict[str, Any] | None = None) -> dict[str, Any]:
    row = row or {}
    peer_host, peer_port = _split_peer(c.get("peer", ""))
    return {
        "name": f"{c['name']} ({number})",
        "number": number,
        "node": node.name,
        "vhost": c.get("vhost", "/"),
        "user": c.get("user", ""),
        "user_who_performed_action": c.get("user", ""),
        "state": "running",
        "consumer_count": consumers,
        "messages_unacknowledged": unacked,
        "messages_unconfirmed": 0,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "prefetch_count": row.get("prefetch", 0),
        "global_prefetch_count": row.get("global_prefetch", 0),
        "confirm": row.get("confirm", False),
        "transactional": row.get("tx", False),
        "connection_details": {"name": c["name"], "peer_host": peer_host, "peer_port": peer_port},
    }


def consumer_items(latest: Sample) -> list[dict[str, Any]]:
    by_conn = {(c["worker"], c["conn"]): c for c in latest.connections}
    items = []
    for row in latest.snapshot.get("consumers", ()):
        queue, tag, worker, conn, ch, exclusive, ack_required, priority, active = row[:9]
        vhost = row_vhost(row, 9)
        c = by_conn.get((worker, conn), {"name": "", "peer": ""})
        peer_host, peer_port = _split_peer(c.get("peer", ""))
        items.append({
            "queue": {"name": queue, "vhost": vhost},
            "consumer_tag": tag,
            "channel_details": {"name": f"{c['name']} ({ch})", "number": ch,
                                "connection_name": c["name"], "peer_host": peer_host,
                                "peer_port": peer_port, "node": "", "user": c.get("user", "")},
            "exclusive": exclusive,
            "ack_required": ack_required,
            "prefetch_count": 0,
            "active": active,
            "activity_status": "up" if active else "waiting",
            "arguments": {"x-priority": priority} if priority else {},
        })
    return items


def queue_totals(latest: Sample, base: Sample | None) -> dict[str, Any]:
    messages, ready, unacked, _ = latest.totals()
    if base is not None:
        bm, br, bu, _ = base.totals()
        seconds = latest.time - base.time
        rates = (rate(messages, bm, seconds), rate(ready, br, seconds), rate(unacked, bu, seconds))
    else:
        rates = (0.0, 0.0, 0.0)
    return {
        "messages": messages, "messages_details": details(rates[0]),
        "messages_ready": ready, "messages_ready_details": details(rates[1]),
        "messages_unacknowledged": unacked, "messages_unacknowledged_details": details(rates[2]),
    }


def message_stats(latest: Sample, base: Sample | None) -> dict[str, Any]:
    """The broker's message counters (overview, vhost): publish (received from publishers),
    confirm, return_unroutable, drop_unroutable, deliver, deliver_no_ack, get, get_no_ack,
    get_empty, redeliver, ack, deliver_get, each with its rate."""
    values = {k: v for k, v in latest.message_counts().items()
              if k not in ("routed", "publish_confirm")}
    return counters_with_rates(values, base.message_counts() if base is not None else None,
                               latest.time - base.time if base is not None else 0.0)
