"""``shoal ctl``'s output, pure: rabbitmqctl 3.10's table and JSON formatting of values, and the
rows of each listing (and the definitions export) built from the control socket's answers.

``tests/cli/test_ctl.py`` checks these without a broker.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

VHOST = "/"
FULL = ".*"  # every user may configure, write and read everything in "/" (no permissions yet)

# ------------------------------------------------------------------ formatting (pure)


def _field_type(value: Any) -> str:
    """The AMQP field type rabbitmqctl's JSON shows for an argument's value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(1 << 31) <= value < (1 << 31) else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, (bytes, bytearray)):
        return "binary"
    return "longstr"


def _erlang(value: Any) -> str:
    """A value inside an argument table as rabbitmqctl's table formatter writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        return format_arguments(value)
    if isinstance(value, list):
        return "[" + ",".join(_erlang(v) for v in value) + "]"
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return json.dumps(str(value), ensure_ascii=False)


def format_arguments(arguments: dict[str, Any] | None) -> str:
    """``{"x-max-length": 10}`` -> ``[{"x-max-length",10}]``, as rabbitmqctl prints a table."""
    if not arguments:
        return "[]"
    return "[" + ",".join(f"{{{json.dumps(k, ensure_ascii=False)},{_erlang(v)}}}"
                          for k, v in arguments.items()) + "]"


def format_tags(tags: Sequence[str]) -> str:
    return "[" + ", ".join(tags) + "]"


def format_value(column: str, value: Any) -> str:
    """One cell of a table row."""
    if value is None:
        return ""
    if column == "tags":
        return format_tags(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if column == "definition":  # a policy's: rabbit_policy:list_formatted JSON-encodes it
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    if isinstance(value, dict) or column == "arguments":
        return format_arguments(value or {})
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def json_value(column: str, value: Any) -> Any:
    """One field of a row as rabbitmqctl's JSON formatter writes it: an argument table as
    ``[[key, type, value], ...]``."""
    if column == "arguments" and isinstance(value, dict):
        return [[k, _field_type(v), v] for k, v in value.items()]
    return value


def table(columns: Sequence[str], rows: Iterable[dict[str, Any]], headers: bool = True) -> list[str]:
    """The column names (unless not ``headers``), then one tab-separated line per row."""
    lines = ["\t".join(columns)] if headers else []
    lines += ["\t".join(format_value(c, row.get(c)) for c in columns) for row in rows]
    return lines


def json_rows(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """rabbitmqctl's ``--formatter json`` for a listing: ``[``, one object a line (the later
    ones after a comma), ``]``."""
    items = [json.dumps({c: json_value(c, row.get(c)) for c in columns}, separators=(",", ":"),
                        ensure_ascii=False, default=str) for row in rows]
    body = "".join(("\n" if i == 0 else "\n,") + item for i, item in enumerate(items))
    return "[" + body + "\n]"


# ------------------------------------------------------------------ rows (pure)

QUEUE_COLUMNS = ("name", "durable", "auto_delete", "arguments", "messages", "messages_ready",
                 "messages_unacknowledged", "consumers", "exclusive", "state", "type", "policy",
                 "vhost", "messages_enqueued")
EXCHANGE_COLUMNS = ("name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                    "vhost")
BINDING_COLUMNS = ("source_name", "source_kind", "destination_name", "destination_kind",
                   "routing_key", "arguments", "vhost")
CONNECTION_COLUMNS = ("name", "user", "vhost", "state", "channels", "peer_host", "peer_port",
                      "recv_oct", "send_oct", "client", "connected_at", "worker", "protocol")
CHANNEL_COLUMNS = ("pid", "connection", "name", "number", "user", "vhost", "consumer_count",
                   "messages_unacknowledged")
CONSUMER_COLUMNS = ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                    "active", "arguments", "exclusive")
USER_COLUMNS = ("user", "tags")
VHOST_COLUMNS = ("cluster_state", "default_queue_type", "description", "name", "tags", "tracing")
DEFAULTS = {
    "queues": ("name", "messages"),
    "exchanges": ("name", "type"),
    "bindings": ("source_name", "source_kind", "destination_name", "destination_kind",
                 "routing_key", "arguments"),
    "connections": ("user", "peer_host", "peer_port", "state"),
    "channels": ("pid", "user", "consumer_count", "messages_unacknowledged"),
    "consumers": ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                  "active", "arguments"),
}


def row_vhost(row: Sequence[Any], at: int) -> str:
    """The vhost a snapshot row names at index ``at`` (broker.runtime.snapshot), "/" when it
    names none."""
    return str(row[at]) if len(row) > at else VHOST


def policy_name(snapshot: dict[str, Any], kind: str, name: str, vhost: str = VHOST) -> str:
    """The policy applying to a ``queue`` or ``exchange`` of ``vhost`` (the snapshot's
    ``vhost_policies``, broker.runtime.policies.policy_snapshot), '' for none, as
    rabbitmqctl's ``policy`` column."""
    per_vhost = snapshot.get("vhost_policies") or {VHOST: snapshot.get("policies")}
    applied = ((per_vhost.get(vhost) or {}).get("applied") or {}).get(kind, {}).get(name)
    return str(applied[0] or "") if applied else ""


def queue_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The snapshot's queues (``broker.runtime.snapshot``) as rabbitmqctl's list_queues keys."""
    rows = []
    for q in snapshot.get("queues", ()):
        name, durable, auto_delete, owner, arguments, ready, unacked, consumers = q[:8]
        rows.append({"name": name, "durable": durable, "auto_delete": auto_delete,
                     "arguments": arguments or {}, "messages": ready + unacked,
                     "messages_ready": ready, "messages_unacknowledged": unacked,
                     "consumers": consumers, "exclusive": owner is not None, "state": "running",
                     "type": "classic",
                     "policy": policy_name(snapshot, "queue", name, row_vhost(q, 16)),
                     "vhost": row_vhost(q, 16),
                     "messages_enqueued": q[8] if len(q) > 8 else None})
    return rows


def exchange_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": x[0], "type": x[1], "durable": x[2], "auto_delete": x[3], "internal": x[4],
             "arguments": x[5] or {},
             "policy": policy_name(snapshot, "exchange", x[0], row_vhost(x, 8)),
             "vhost": row_vhost(x, 8)}
            for x in snapshot.get("exchanges", ())]


def binding_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The default exchange's binding of every queue first (the snapshot leaves them out), then
    the others, as rabbitmqctl lists them."""
    rows = [{"source_name": "", "source_kind": "exchange", "destination_name": q[0],
             "destination_kind": "queue", "routing_key": q[0], "arguments": {},
             "vhost": row_vhost(q, 16)} for q in snapshot.get("queues", ())]
    rows += [{"source_name": b[0], "source_kind": "exchange", "destination_name": b[1],
              "destination_kind": b[2], "routing_key": b[3], "arguments": b[4] or {},
              "vhost": row_vhost(b, 5)} for b in snapshot.get("bindings", ())]
    return rows


def connection_rows(connections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for c in connections:
        host, _, port = str(c.get("peer", "")).rpartition(":")
        rows.append({**c, "peer_host": host, "peer_port": int(port) if port.isdigit() else port,
                     "protocol": "{0,9,1}"})
    return rows


def channel_pid(worker: int, conn: int, ch: int) -> str:
    """A channel's identifier in place of RabbitMQ's Erlang pid: <worker.connection.channel>."""
    return f"<shoal.{worker}.{conn}.{ch}>"


def channel_rows(snapshot: dict[str, Any], connections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The channels the supervisor keeps books for: those with a consumer or an unsettled
    delivery (``broker.runtime.snapshot``)."""
    by_key = {(c["worker"], c["conn"]): c for c in connections}
    rows = []
    for worker, conn, ch, consumers, unacked in snapshot.get("channels", ()):
        c = by_key.get((worker, conn), {})
        rows.append({"pid": channel_pid(worker, conn, ch), "connection": c.get("name", ""),
                     "name": f"{c.get('name', '')} ({ch})", "number": ch, "user": c.get("user", ""),
                     "vhost": c.get("vhost", VHOST), "consumer_count": consumers,
                     "messages_unacknowledged": unacked})
    return rows


def consumer_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in snapshot.get("consumers", ()):
        queue, tag, worker, conn, ch, exclusive, ack_required, priority, active = c[:9]
        rows.append({"queue_name": queue, "channel_pid": channel_pid(worker, conn, ch),
                     "consumer_tag": tag, "ack_required": ack_required, "prefetch_count": None,
                     "active": active, "exclusive": exclusive, "vhost": row_vhost(c, 9),
                     "arguments": {"x-priority": priority} if priority else {}})
    return rows


def user_rows(users: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"user": u["name"], "tags": u["tags"]} for u in users]


def export_definitions(snapshot: dict[str, Any], users: list[dict[str, Any]],
                       version: str, permissions: list[dict[str, Any]] | None = None,
                       topic_permissions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """RabbitMQ's definitions export (``rabbitmqctl export_definitions``) from a snapshot, the
    users and the permissions (list_permissions / list_topic_permissions rows; None: every user
    with full permissions, no topic permissions): exclusive queues and the bindings to them, the
    default exchange and ``amq.*`` are left out, as RabbitMQ leaves them out."""
    vhost = snapshot.get("vhost", VHOST)
    exclusive = {(row_vhost(q, 16), q[0]) for q in snapshot.get("queues", ()) if q[3] is not None}
    return {
        "bindings": [{"arguments": b[4] or {}, "destination": b[1], "destination_type": b[2],
                      "routing_key": b[3], "source": b[0], "vhost": row_vhost(b, 5)}
                     for b in snapshot.get("bindings", ())
                     if b[0] and not (b[2] == "queue" and (row_vhost(b, 5), b[1]) in exclusive)],
        "exchanges": [{"arguments": x[5] or {}, "auto_delete": x[3], "durable": x[2],
                       "internal": x[4], "name": x[0], "type": x[1], "vhost": row_vhost(x, 8)}
                      for x in snapshot.get("exchanges", ())
                      if x[0] and not str(x[0]).startswith("amq.")],
        "global_parameters": [],
        "parameters": [],
        "permissions": [{k: p[k] for k in ("user", "vhost", "configure", "write", "read")}
                        for p in permissions] if permissions is not None else
                       [{"configure": FULL, "read": FULL, "user": u["name"], "vhost": vhost,
                         "write": FULL} for u in users],
        "policies": list((snapshot.get("policies") or {}).get("policies", [])),
        "queues": [{"arguments": q[4] or {}, "auto_delete": q[2], "durable": q[1], "name": q[0],
                    "type": "classic", "vhost": row_vhost(q, 16)}
                   for q in snapshot.get("queues", ()) if q[3] is None],
        "rabbit_version": version,
        "rabbitmq_version": version,
        "topic_permissions": [{k: p[k] for k in ("user", "vhost", "exchange", "write", "read")}
                              for p in topic_permissions or ()],
        "users": [{"hashing_algorithm": u.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
                   "limits": {}, "name": u["name"], "password_hash": u["password_hash"],
                   "tags": u["tags"]} for u in users],
        "vhosts": [{"limits": [], "metadata": {"description": "Default virtual host", "tags": []},
                    "name": vhost}],
    }
