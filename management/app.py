"""The management HTTP API's routes (Starlette), RabbitMQ 3.10's paths, shapes and errors.

Reads come from the latest sample (management.stats); writes that are AMQP operations go over
AMQP as the HTTP user (management.amqp_ops); closing a connection is a control command.

Names in paths are percent-encoded (``%2F`` is the vhost ``/``); a raw ``:`` is taken too.
The router matches the undecoded path (``raw_path``), so an encoded ``/`` stays inside its
segment, and each handler decodes its segments.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import psutil
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from management import amqp_ops, listing, shapes, webui
from management.auth import Users
from management.stats import Sampler, ask

VHOST = "/"
FORCED_REASON = "Closed via management plugin"
EXCHANGE_TYPES = [{"name": n, "description": d, "enabled": True}
                  for n, d in shapes.EXCHANGE_DESCRIPTIONS.items()]


class APIError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def not_found() -> APIError:
    return APIError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> APIError:
    return APIError(400, "bad_request", reason)


@dataclass
class Context:
    """What every handler reads: the sampler, the node, the users, where the broker is."""

    sampler: Sampler
    node: shapes.Node
    users: Users
    control_path: str
    amqp_host: str
    amqp_port: int
    data_dir: str = ""
    started: float = field(default_factory=time.time)


# ----------------------------------------------------------------------------- helpers

class RawPath:
    """ASGI middleware: route on the undecoded path (``%2F`` stays in its segment)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("raw_path"):
            raw = scope["raw_path"].decode("latin-1").split("?", 1)[0]
            scope = dict(scope, path=raw)
        await self.app(scope, receive, send)


def seg(request: Request, name: str) -> str:
    return unquote(request.path_params[name])


def ok(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status)


def no_content(status: int = 204) -> Response:
    return Response(status_code=status)


def check_vhost(vhost: str) -> None:
    if vhost != VHOST:
        raise not_found()


def params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


def paged(request: Request, items: list[dict[str, Any]], default_sort: str | None = "name") -> Response:
    try:
        return ok(listing.apply(items, params(request), default_sort))
    except listing.BadRequest as exc:
        raise bad_request(str(exc)) from None


async def body_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise bad_request("body is not JSON") from None
    if not isinstance(value, dict):
        raise bad_request("body must be a JSON object")
    return value


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    return listing.truthy(body[key]) if key in body else default


def _exchange_name(name: str) -> str:
    return "" if name == shapes.DEFAULT_EXCHANGE_PATH else name


AMQP_STATUS = {404: (404, "not_found"), 403: (401, "not_authorised"), 530: (401, "not_authorised"),
               406: (400, "bad_request"), 405: (400, "bad_request"), 402: (400, "bad_request"),
               504: (400, "bad_request")}


def amqp_error(exc: amqp_ops.AMQPFailure) -> APIError:
    status, error = AMQP_STATUS.get(exc.code, (500, "internal_server_error"))
    reason = exc.text.split(" - ", 1)[1] if " - " in exc.text else exc.text
    if status == 404:
        return APIError(404, "Object Not Found", reason)
    return APIError(status, error, reason)


Handler = Callable[[Request], Awaitable[Response]]


class API:
    """The handlers, over one :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # ------------------------------------------------------------------ plumbing

    def auth(self, request: Request) -> tuple[str, str]:
        client = request.client.host if request.client else None
        who = self.ctx.users.check(request.headers.get("authorization"), client)
        if who is None:
            raise APIError(401, "not_authorised", "Login failed")
        return who

    async def sample(self) -> Any:
        return await self.ctx.sampler.refresh()

    async def amqp(self, request: Request, op: Callable[[amqp_ops.Client], Awaitable[Any]]) -> Any:
        user, password = self.auth(request)
        try:
            async with amqp_ops.connect(self.ctx.amqp_host, self.ctx.amqp_port, user, password) as client:
                return await op(client)
        except amqp_ops.AMQPFailure as exc:
            raise amqp_error(exc) from None
        except OSError as exc:
            raise APIError(503, "service_unavailable", f"the broker does not answer: {exc}") from None
        finally:
            self.ctx.sampler.stale()

    # ------------------------------------------------------------ the node, users

    async def overview(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        base = self.ctx.sampler.base()
        node = self.ctx.node
        snap = s.snapshot
        return ok({
            "management_version": node.version,
            "rates_mode": "basic",
            "sample_retention_policies": {"global": [600, 3600, 28800, 86400],
                                          "basic": [600, 3600], "detailed": [600]},
            "exchange_types": EXCHANGE_TYPES,
            "product_version": node.version,
            "product_name": "Shoal",
            "rabbitmq_version": node.version,
            "cluster_name": node.name,
            "erlang_version": platform.python_version(),
            "erlang_full_version": f"Python {platform.python_version()} ({platform.python_implementation()})",
            "disable_stats": False,
            "enable_queue_totals": True,
            "message_stats": shapes.message_stats(s, base),
            "churn_rates": {},
            "queue_totals": shapes.queue_totals(s, base),
            "object_totals": {
                "channels": sum(c.get("channels", 0) for c in s.connections),
                "connections": len(s.connections),
                "consumers": len(snap.get("consumers", ())),
                "exchanges": len(snap.get("exchanges", ())),
                "queues": len(snap.get("queues", ())),
            },
            "statistics_db_event_queue": 0,
            "node": node.name,
            "listeners": [
                {"node": node.name, "protocol": "amqp", "ip_address": node.amqp_host,
                 "port": node.amqp_port, "socket_opts": []},
                {"node": node.name, "protocol": "http", "ip_address": "", "port": node.http_port,
                 "socket_opts": []},
            ],
            "contexts": [{"node": node.name, "description": "RabbitMQ Management",
                          "path": "/", "port": str(node.http_port)}],
        })

    async def whoami(self, request: Request) -> Response:
        user, _ = self.auth(request)
        return ok({"name": user, "tags": self.ctx.users.tags_of(user)})

    def _node_item(self) -> dict[str, Any]:
        node = self.ctx.node
        s = self.ctx.sampler.latest
        alarms = s.snapshot.get("alarms", {})
        mem_used = 0
        try:
            parent = psutil.Process(os.getppid())
            mem_used = sum(p.memory_info().rss for p in [parent, *parent.children()])
        except (psutil.Error, OSError):  # the process went meanwhile
            mem_used = 0
        disk_free = 0
        if self.ctx.data_dir:
            try:
                disk_free = shutil.disk_usage(self.ctx.data_dir).free
            except OSError:
                disk_free = 0
        return {
            "name": node.name,
            "type": "disc",
            "running": True,
            "os_pid": str(os.getppid()),
            "mem_used": mem_used,
            "mem_alarm": bool(alarms.get("memory")) or bool(alarms.get("queued")),
            "disk_free": disk_free,
            "disk_free_alarm": bool(alarms.get("disk")),
            "processors": os.cpu_count() or 1,
            "uptime": int((time.time() - self.ctx.started) * 1000),
            "partitions": [],
            "rates_mode": "basic",
            "being_drained": False,
            "applications": [],
            "exchange_types": EXCHANGE_TYPES,
            "net_ticktime": 60,
            "enabled_plugins": ["rabbitmq_management"],
        }

    async def nodes(self, request: Request) -> Response:
        self.auth(request)
        await self.sample()
        return paged(request, [self._node_item()])

    async def node(self, request: Request) -> Response:
        self.auth(request)
        if seg(request, "node") != self.ctx.node.name:
            raise not_found()
        await self.sample()
        return ok(self._node_item())

    async def extensions(self, request: Request) -> Response:
        self.auth(request)
        return ok([])

    async def empty_list(self, request: Request) -> Response:
        """Policies, parameters, limits: Shoal has none."""
        self.auth(request)
        return ok([])

    def _vhost_item(self, s: Any, base: Any) -> dict[str, Any]:
        item = {"name": VHOST, "description": "Default virtual host", "tags": [],
                "default_queue_type": "classic", "tracing": False,
                "metadata": {"description": "Default virtual host", "tags": []},
                "cluster_state": {self.ctx.node.name: "running"}}
        item.update(shapes.queue_totals(s, base))
        item["message_stats"] = shapes.message_stats(s, base)
        return item

    async def vhosts(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        return paged(request, [self._vhost_item(s, self.ctx.sampler.base())])

    async def vhost(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        s = await self.sample()
        return ok(self._vhost_item(s, self.ctx.sampler.base()))

    def _user_item(self, name: str) -> dict[str, Any]:
        return {"name": name, "password_hash": self.ctx.users.stored[name],
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": self.ctx.users.tags_of(name), "limits": {}}

    def auth_admin(self, request: Request) -> tuple[str, str]:
        """As ``auth``, and the user must be tagged administrator (RabbitMQ: 403 otherwise)."""
        who = self.auth(request)
        if not self.ctx.users.is_admin(who[0]):
            raise APIError(403, "not_authorised", "Not administrator user")
        return who

    async def users(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, [self._user_item(n) for n in self.ctx.users.stored if n])

    async def user(self, request: Request) -> Response:
        self.auth_admin(request)
        name = seg(request, "user")
        if name not in self.ctx.users.stored or not name:
            raise not_found()
        return ok(self._user_item(name))

    async def _users_command(self, request: dict[str, Any]) -> dict[str, Any]:
        """A users change through the supervisor (broker.runtime.users), applied here at once
        too (the supervisor's line on our stdin says the same, later)."""
        try:
            answer = await ask(self.ctx.control_path, request)
        except (OSError, ValueError) as exc:
            raise APIError(503, "service_unavailable", f"the broker does not answer: {exc}") from None
        if "error" in answer:
            if answer.get("code") == "missing":
                raise not_found()
            raise bad_request(str(answer["error"]))
        if "deleted" in answer:
            self.ctx.users.apply({"removed": [answer["deleted"]]})
        else:
            self.ctx.users.apply({"users": {answer["name"]: answer["password_hash"]},
                                  "tags": {answer["name"]: answer["tags"]}})
        return answer

    async def put_user(self, request: Request) -> Response:
        """PUT /api/users/NAME: ``password`` or ``password_hash``, and ``tags`` (a string of
        comma-separated tags, or a list); 201 for a new user, 204 for a changed one."""
        self.auth_admin(request)
        name = seg(request, "user")
        body = await body_json(request)
        command: dict[str, Any] = {"command": "put_user", "name": name, "tags": body.get("tags")}
        if "password" in body:
            command["password"] = str(body["password"])
        elif "password_hash" in body:
            command["password_hash"] = str(body["password_hash"])
        if body.get("hashing_algorithm", "rabbit_password_hashing_sha256") != \
                "rabbit_password_hashing_sha256":
            raise bad_request(f"hashing algorithm {body['hashing_algorithm']} is not supported")
        answer = await self._users_command(command)
        return no_content(201 if answer.get("created") else 204)

    async def delete_user(self, request: Request) -> Response:
        self.auth_admin(request)
        await self._users_command({"command": "delete_user", "name": seg(request, "user")})
        return no_content()

    def _permissions(self) -> list[dict[str, Any]]:
        # One vhost, and every user may configure, write and read everything in it (Shoal has
        # no permissions yet).
        return [{"user": n, "vhost": VHOST, "configure": ".*", "write": ".*", "read": ".*"}
                for n in self.ctx.users.stored if n]

    async def permissions(self, request: Request) -> Response:
        self.auth(request)
        return paged(request, self._permissions(), "user")

    async def user_permissions(self, request: Request) -> Response:
        self.auth(request)
        name = seg(request, "user")
        if name not in self.ctx.users.stored:
            raise not_found()
        return ok([p for p in self._permissions() if p["user"] == name])

    async def vhost_permissions(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        return ok(self._permissions())

    async def permission(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = seg(request, "user")
        for p in self._permissions():
            if p["user"] == name:
                return ok(p)
        raise not_found()

    # --------------------------------------------------------------------- queues

    async def _queues(self) -> list[dict[str, Any]]:
        s = await self.sample()
        return shapes.queue_items(s, self.ctx.sampler.base(), self.ctx.node)

    async def queues(self, request: Request) -> Response:
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        return paged(request, await self._queues())

    async def _queue(self, request: Request) -> dict[str, Any]:
        check_vhost(seg(request, "vhost"))
        name = seg(request, "name")
        for q in await self._queues():
            if q["name"] == name:
                return q
        raise not_found()

    async def queue(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._queue(request))

    async def put_queue(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = seg(request, "name")
        body = await body_json(request)
        if "x-queue-type" in (body.get("arguments") or {}) and body["arguments"]["x-queue-type"] in (
                "classic", None, ""):
            body["arguments"].pop("x-queue-type")
        existed = any(q[0] == name for q in (await self.sample()).snapshot.get("queues", ()))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.queue_declare(
            name, _bool(body, "durable", True), _bool(body, "auto_delete", False), arguments))
        return no_content(204 if existed else 201)

    async def delete_queue(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = seg(request, "name")
        q = request.query_params
        await self._queue(request)  # 404 first, as RabbitMQ (queue.delete of none is ok)
        await self.amqp(request, lambda c: c.queue_delete(
            name, listing.truthy(q.get("if-unused", "false")), listing.truthy(q.get("if-empty", "false"))))
        return no_content()

    async def purge_queue(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = seg(request, "name")
        await self.amqp(request, lambda c: c.queue_purge(name))
        return no_content()

    async def queue_bindings(self, request: Request) -> Response:
        self.auth(request)
        q = await self._queue(request)
        s = self.ctx.sampler.latest
        return paged(request, [b for b in shapes.binding_items(s)
                               if b["destination_type"] == "queue" and b["destination"] == q["name"]],
                     None)

    async def get_messages(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = seg(request, "name")
        body = await body_json(request)
        try:
            count = int(body.get("count", 1))
            truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
        except (TypeError, ValueError):
            raise bad_request("count and truncate must be integers") from None
        ackmode = str(body.get("ackmode", "ack_requeue_true"))
        if ackmode == "get":  # RabbitMQ 2.x's name for ack_requeue_true
            ackmode = "ack_requeue_true"
        if ackmode not in ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
                           "reject_requeue_false"):
            raise bad_request(f"unknown ackmode {ackmode!r}")
        encoding = str(body.get("encoding", "auto"))
        if encoding not in ("auto", "base64"):
            raise bad_request("encoding must be auto or base64")
        got = await self.amqp(request, lambda c: c.get(name, count, ackmode))
        out = []
        for m in got:
            payload = m.body if truncate is None else m.body[:truncate]
            text: str | None = None
            if encoding == "auto":
                try:
                    text = payload.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            out.append({
                "payload_bytes": len(m.body),
                "redelivered": m.redelivered,
                "exchange": m.exchange,
                "routing_key": m.routing_key,
                "message_count": m.message_count,
                "properties": m.properties or [],
                "payload": text if text is not None else base64.b64encode(payload).decode(),
                "payload_encoding": "string" if text is not None else "base64",
            })
        return ok(out)

    # ------------------------------------------------------------------ exchanges

    async def _exchanges(self) -> list[dict[str, Any]]:
        s = await self.sample()
        return shapes.exchange_items(s, self.ctx.node, self.ctx.sampler.base())

    async def exchanges(self, request: Request) -> Response:
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        return paged(request, await self._exchanges())

    async def _exchange(self, request: Request) -> dict[str, Any]:
        check_vhost(seg(request, "vhost"))
        name = _exchange_name(seg(request, "name"))
        for x in await self._exchanges():
            if x["name"] == name:
                return x
        raise not_found()

    async def exchange(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._exchange(request))

    async def put_exchange(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = _exchange_name(seg(request, "name"))
        body = await body_json(request)
        if "type" not in body:
            raise bad_request("[{key_missing,type}]")
        existed = any(x[0] == name for x in (await self.sample()).snapshot.get("exchanges", ()))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.exchange_declare(
            name, str(body["type"]), _bool(body, "durable", True), _bool(body, "auto_delete", False),
            _bool(body, "internal", False), arguments))
        return no_content(204 if existed else 201)

    async def delete_exchange(self, request: Request) -> Response:
        self.auth(request)
        await self._exchange(request)
        name = _exchange_name(seg(request, "name"))
        if_unused = listing.truthy(request.query_params.get("if-unused", "false"))
        await self.amqp(request, lambda c: c.exchange_delete(name, if_unused))
        return no_content()

    async def exchange_bindings(self, request: Request) -> Response:
        self.auth(request)
        x = await self._exchange(request)
        side = "source" if request.url.path.endswith("/source") else "destination"
        s = self.ctx.sampler.latest
        items = [b for b in shapes.binding_items(s) if b[side] == x["name"]
                 and (side == "source" or b["destination_type"] == "exchange")]
        return paged(request, items, None)

    async def publish(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))
        name = _exchange_name(seg(request, "name"))
        body = await body_json(request)
        for key in ("routing_key", "payload", "payload_encoding", "properties"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        try:
            payload = amqp_ops.decode_payload(str(body["payload"]), str(body["payload_encoding"]))
            props = amqp_ops.publish_properties(dict(body["properties"] or {}))
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc)) from None
        routed = await self.amqp(request, lambda c: c.publish(name, str(body["routing_key"]),
                                                               payload, props))
        return ok({"routed": routed})

    # ------------------------------------------------------------------- bindings

    async def bindings(self, request: Request) -> Response:
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        s = await self.sample()
        return paged(request, shapes.binding_items(s), None)

    def _ends(self, request: Request) -> tuple[str, str, str]:
        check_vhost(seg(request, "vhost"))
        kind = {"q": "queue", "e": "exchange"}.get(request.path_params["dtype"])
        if kind is None:
            raise not_found()
        return _exchange_name(seg(request, "source")), kind, seg(request, "dest")

    async def _between(self, request: Request) -> tuple[str, str, str, list[dict[str, Any]]]:
        source, kind, dest = self._ends(request)
        s = await self.sample()
        items = [b for b in shapes.binding_items(s) if b["source"] == source
                 and b["destination_type"] == kind and b["destination"] == dest]
        return source, kind, dest, items

    async def bindings_between(self, request: Request) -> Response:
        self.auth(request)
        _, _, _, items = await self._between(request)
        return paged(request, items, None)

    async def post_binding(self, request: Request) -> Response:
        self.auth(request)
        source, kind, dest = self._ends(request)
        if source == "":
            raise APIError(401, "not_authorised",
                           "operation not permitted on the default exchange")
        body = await body_json(request)
        key = str(body.get("routing_key", ""))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.bind(kind, source, dest, key, arguments))
        location = shapes.properties_key(key, arguments)
        response = no_content(201)
        response.headers["Location"] = location
        return response

    async def _binding(self, request: Request) -> dict[str, Any]:
        _, _, _, items = await self._between(request)
        props = seg(request, "props")
        for b in items:
            if shapes.matches_properties_key(props, b["routing_key"], b["arguments"]):
                return b
        raise not_found()

    async def binding(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._binding(request))

    async def delete_binding(self, request: Request) -> Response:
        self.auth(request)
        b = await self._binding(request)
        await self.amqp(request, lambda c: c.unbind(b["destination_type"], b["source"],
                                                     b["destination"], b["routing_key"], b["arguments"]))
        return no_content()

    # ---------------------------------------------------------- connections, channels

    async def _connections(self) -> list[dict[str, Any]]:
        s = await self.sample()
        return shapes.connection_items(s, self.ctx.sampler.base(), self.ctx.node)

    async def connections(self, request: Request) -> Response:
        self.auth(request)
        items = await self._connections()
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        return paged(request, items)

    async def _connection(self, request: Request) -> dict[str, Any]:
        name = seg(request, "name")
        for c in await self._connections():
            if c["name"] == name:
                return c
        raise not_found()

    async def connection(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._connection(request))

    async def close_connection(self, request: Request) -> Response:
        self.auth(request)
        c = await self._connection(request)
        reason = request.headers.get("x-reason") or FORCED_REASON
        try:
            answer = await ask(self.ctx.control_path, {"command": "close_connection",
                                                       "worker": c["worker"], "name": c["name"],
                                                       "reason": reason})
        except (OSError, ValueError) as exc:
            raise APIError(503, "service_unavailable", f"the broker does not answer: {exc}") from None
        self.ctx.sampler.stale()
        if "error" in answer:
            raise not_found() if answer.get("missing") else APIError(500, "internal_server_error",
                                                                     str(answer["error"]))
        return no_content()

    async def connection_channels(self, request: Request) -> Response:
        self.auth(request)
        c = await self._connection(request)
        chans = [ch for ch in shapes.channel_items(self.ctx.sampler.latest, self.ctx.node)
                 if ch["connection_details"]["name"] == c["name"]]
        return paged(request, chans)

    async def channels(self, request: Request) -> Response:
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        s = await self.sample()
        return paged(request, shapes.channel_items(s, self.ctx.node))

    async def channel(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        name = seg(request, "name")
        for ch in shapes.channel_items(s, self.ctx.node):
            if ch["name"] == name:
                return ok(ch)
        raise not_found()

    async def consumers(self, request: Request) -> Response:
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        s = await self.sample()
        return paged(request, shapes.consumer_items(s), None)

    # ----------------------------------------------------------------- definitions

    def _definitions(self, s: Any, whole: bool) -> dict[str, Any]:
        exclusive = {q[0] for q in s.snapshot.get("queues", ()) if q[3] is not None}
        queues = [{"name": q["name"], "vhost": q["vhost"], "durable": q["durable"],
                   "auto_delete": q["auto_delete"], "arguments": q["arguments"]}
                  for q in shapes.queue_items(s, None, self.ctx.node) if not q["exclusive"]]
        exchanges = [{k: x[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                        "internal", "arguments")}
                     for x in shapes.exchange_items(s, self.ctx.node)
                     if x["name"] and not x["name"].startswith("amq.")]
        bindings = [{k: b[k] for k in ("source", "vhost", "destination", "destination_type",
                                       "routing_key", "arguments")}
                    for b in shapes.binding_items(s)
                    if b["source"] and b["destination"] not in exclusive]
        out: dict[str, Any] = {
            "rabbit_version": self.ctx.node.version,
            "rabbitmq_version": self.ctx.node.version,
            "product_name": "Shoal",
            "product_version": self.ctx.node.version,
        }
        if whole:
            out["users"] = [self._user_item(n) for n in self.ctx.users.stored if n]
            out["vhosts"] = [{"name": VHOST, "description": "Default virtual host", "tags": [],
                              "metadata": {"description": "Default virtual host", "tags": []}}]
            out["permissions"] = self._permissions()
            out["topic_permissions"] = []
            out["parameters"] = []
            out["global_parameters"] = []
        out["policies"] = []
        out["queues"] = queues
        out["exchanges"] = exchanges
        out["bindings"] = bindings
        if not whole:
            for kind in ("queues", "exchanges", "bindings"):
                for item in out[kind]:
                    item.pop("vhost", None)
        return out

    async def definitions(self, request: Request) -> Response:
        self.auth(request)
        whole = "vhost" not in request.path_params
        if not whole:
            check_vhost(seg(request, "vhost"))
        s = await self.sample()
        response = ok(self._definitions(s, whole))
        if listing.truthy(request.query_params.get("download", "false")) or \
                "download" in request.query_params:
            response.headers["Content-Disposition"] = 'attachment; filename="definitions.json"'
        return response

    async def import_definitions(self, request: Request) -> Response:
        """Exchanges, queues, bindings are declared (over AMQP, as the HTTP user); users,
        vhosts, permissions, policies and parameters are not imported (Shoal has no runtime
        user or vhost management yet)."""
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        body = await body_json(request)

        def vhost_ok(item: dict[str, Any]) -> bool:
            return item.get("vhost", VHOST) == VHOST

        async def run(c: amqp_ops.Client) -> None:
            for x in body.get("exchanges") or []:
                if vhost_ok(x) and x.get("name") and not str(x["name"]).startswith("amq."):
                    await c.exchange_declare(x["name"], x.get("type", "direct"),
                                             _bool(x, "durable", True), _bool(x, "auto_delete", False),
                                             _bool(x, "internal", False), dict(x.get("arguments") or {}))
            for q in body.get("queues") or []:
                if vhost_ok(q) and q.get("name"):
                    args = dict(q.get("arguments") or {})
                    if args.get("x-queue-type") == "classic":
                        args.pop("x-queue-type")
                    await c.queue_declare(q["name"], _bool(q, "durable", True),
                                          _bool(q, "auto_delete", False), args)
            for b in body.get("bindings") or []:
                if vhost_ok(b) and b.get("source"):
                    await c.bind(b.get("destination_type", "queue"), b["source"], b["destination"],
                                 b.get("routing_key", ""), dict(b.get("arguments") or {}))

        await self.amqp(request, run)
        return no_content()

    # ----------------------------------------------------------------- health

    async def aliveness(self, request: Request) -> Response:
        self.auth(request)
        check_vhost(seg(request, "vhost"))

        async def run(c: amqp_ops.Client) -> bool:
            await c.queue_declare("aliveness-test", False, False, {})
            await c.publish("", "aliveness-test", b"test_message", {})
            got = await c.get("aliveness-test", 1, "ack_requeue_false")
            return bool(got) and got[0].body == b"test_message"

        if not await self.amqp(request, run):
            return ok({"status": "failed", "reason": "the test message did not come back"}, 503)
        return ok({"status": "ok"})

    async def check_alarms(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        alarms = s.snapshot.get("alarms", {})
        active = []
        if alarms.get("memory") or alarms.get("queued"):
            active.append({"node": self.ctx.node.name, "resource": "memory"})
        if alarms.get("disk"):
            active.append({"node": self.ctx.node.name, "resource": "disk"})
        if active:
            return ok({"status": "failed", "reason": "resource alarm(s) in effect in the cluster",
                       "alarms": active}, 503)
        return ok({"status": "ok"})

    async def check_port(self, request: Request) -> Response:
        self.auth(request)
        try:
            port = int(request.path_params["port"])
        except ValueError:
            raise bad_request("port must be an integer") from None
        ports = [self.ctx.node.amqp_port, self.ctx.node.http_port]
        if port in ports:
            return ok({"status": "ok", "port": port})
        return ok({"status": "failed", "reason": "No active listener", "missing": port,
                   "ports": ports}, 503)

    async def check_vhosts(self, request: Request) -> Response:
        self.auth(request)
        await self.ctx.sampler.refresh()
        if self.ctx.sampler.error:
            return ok({"status": "failed", "reason": f"Virtual host '/' is down: {self.ctx.sampler.error}",
                       "virtual-hosts": [VHOST]}, 503)
        return ok({"status": "ok"})

    # ------------------------------------------------------------------ routes

    def routes(self) -> list[Route]:
        V, N = "{vhost}", "{name}"
        r = Route
        return [
            r("/api/overview", self.overview),
            r("/api/whoami", self.whoami),
            r("/api/extensions", self.extensions),
            r("/api/nodes", self.nodes),
            r("/api/nodes/{node}", self.node),
            r("/api/vhosts", self.vhosts),
            r(f"/api/vhosts/{V}", self.vhost),
            r(f"/api/vhosts/{V}/permissions", self.vhost_permissions),
            r(f"/api/vhosts/{V}/connections", self.connections),
            r(f"/api/vhosts/{V}/channels", self.channels),
            r("/api/users", self.users),
            r("/api/users/{user}", self.user, methods=["GET"]),
            r("/api/users/{user}", self.put_user, methods=["PUT"]),
            r("/api/users/{user}", self.delete_user, methods=["DELETE"]),
            r("/api/users/{user}/permissions", self.user_permissions),
            r("/api/permissions", self.permissions),
            r(f"/api/permissions/{V}/{{user}}", self.permission),
            r("/api/queues", self.queues),
            r(f"/api/queues/{V}", self.queues),
            r(f"/api/queues/{V}/{N}", self.queue, methods=["GET"]),
            r(f"/api/queues/{V}/{N}", self.put_queue, methods=["PUT"]),
            r(f"/api/queues/{V}/{N}", self.delete_queue, methods=["DELETE"]),
            r(f"/api/queues/{V}/{N}/bindings", self.queue_bindings),
            r(f"/api/queues/{V}/{N}/contents", self.purge_queue, methods=["DELETE"]),
            r(f"/api/queues/{V}/{N}/get", self.get_messages, methods=["POST"]),
            r("/api/exchanges", self.exchanges),
            r(f"/api/exchanges/{V}", self.exchanges),
            r(f"/api/exchanges/{V}/{N}", self.exchange, methods=["GET"]),
            r(f"/api/exchanges/{V}/{N}", self.put_exchange, methods=["PUT"]),
            r(f"/api/exchanges/{V}/{N}", self.delete_exchange, methods=["DELETE"]),
            r(f"/api/exchanges/{V}/{N}/bindings/source", self.exchange_bindings),
            r(f"/api/exchanges/{V}/{N}/bindings/destination", self.exchange_bindings),
            r(f"/api/exchanges/{V}/{N}/publish", self.publish, methods=["POST"]),
            r("/api/bindings", self.bindings),
            r(f"/api/bindings/{V}", self.bindings),
            r(f"/api/bindings/{V}/e/{{source}}/{{dtype}}/{{dest}}", self.bindings_between,
              methods=["GET"]),
            r(f"/api/bindings/{V}/e/{{source}}/{{dtype}}/{{dest}}", self.post_binding,
              methods=["POST"]),
            r(f"/api/bindings/{V}/e/{{source}}/{{dtype}}/{{dest}}/{{props}}", self.binding,
              methods=["GET"]),
            r(f"/api/bindings/{V}/e/{{source}}/{{dtype}}/{{dest}}/{{props}}", self.delete_binding,
              methods=["DELETE"]),
            r("/api/connections", self.connections),
            r(f"/api/connections/{N}", self.connection, methods=["GET"]),
            r(f"/api/connections/{N}", self.close_connection, methods=["DELETE"]),
            r(f"/api/connections/{N}/channels", self.connection_channels),
            r("/api/channels", self.channels),
            r(f"/api/channels/{N}", self.channel),
            r("/api/consumers", self.consumers),
            r(f"/api/consumers/{V}", self.consumers),
            r("/api/definitions", self.definitions, methods=["GET"]),
            r("/api/definitions", self.import_definitions, methods=["POST"]),
            r(f"/api/definitions/{V}", self.definitions, methods=["GET"]),
            r(f"/api/definitions/{V}", self.import_definitions, methods=["POST"]),
            r(f"/api/aliveness-test/{V}", self.aliveness),
            r("/api/health/checks/alarms", self.check_alarms),
            r("/api/health/checks/local-alarms", self.check_alarms),
            r("/api/health/checks/port-listener/{port}", self.check_port),
            r("/api/health/checks/virtual-hosts", self.check_vhosts),
            *[r(path, self.empty_list) for path in (
                "/api/policies", f"/api/policies/{V}", "/api/operator-policies",
                "/api/parameters", "/api/global-parameters", "/api/vhost-limits",
                "/api/topic-permissions", "/api/feature-flags")],
        ]


def make_app(ctx: Context) -> ASGIApp:
    """The API as an ASGI application (hypercorn serves it in management.process)."""
    api = API(ctx)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        response = JSONResponse({"error": exc.error, "reason": exc.reason}, status_code=exc.status)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = 'Basic realm="RabbitMQ Management"'
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        if status == 404:
            return JSONResponse({"error": "Object Not Found", "reason": "Not Found"}, status_code=404)
        if status == 405:
            return JSONResponse({"error": "Method Not Allowed", "reason": "Method Not Allowed"},
                                status_code=405)
        return JSONResponse({"error": "bad_request", "reason": str(getattr(exc, "detail", exc))},
                            status_code=status)

    from starlette.exceptions import HTTPException

    app = Starlette(routes=[*api.routes(), *webui.routes()], exception_handlers={
        APIError: api_error, HTTPException: http_error})
    return RawPath(app)


def node_name() -> str:
    return f"shoal@{socket.gethostname().split('.')[0]}"

