"""Queues: /api/queues, a queue's bindings, purging it and getting its messages
(rabbit_mgmt_wm_queue(s), _queue_purge, _queue_get). Writes go over AMQP as the HTTP user.
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management import listing, shapes
from management.http import (
    Context,
    Resource,
    bad_request,
    body_json,
    flag,
    in_vhost,
    named,
    no_content,
    ok,
    paged,
    seg,
)


class Queues(Resource):
    """The queues of the one vhost, read from the sample, changed over AMQP."""

    async def _queues(self, vhost: str | None = None) -> list[dict[str, Any]]:
        s = await self.sample()
        return in_vhost(shapes.queue_items(s, self.ctx.sampler.base(), self.ctx.node), vhost)

    async def queues(self, request: Request) -> Response:
        self.auth(request)
        return paged(request, await self._queues(await self.vhost_scope(request)))

    async def _queue(self, request: Request) -> dict[str, Any]:
        vhost = await self.vhost_param(request)
        return named(await self._queues(vhost), seg(request, "name"))

    async def queue(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._queue(request))

    async def put_queue(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
        name = seg(request, "name")
        body = await body_json(request)
        if "x-queue-type" in (body.get("arguments") or {}) and body["arguments"]["x-queue-type"] in (
                "classic", None, ""):
            body["arguments"].pop("x-queue-type")
        existed = any(q["name"] == name for q in await self._queues(vhost))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.queue_declare(
            name, flag(body, "durable", True), flag(body, "auto_delete", False), arguments), vhost)
        return no_content(204 if existed else 201)

    async def delete_queue(self, request: Request) -> Response:
        self.auth(request)
        name = seg(request, "name")
        q = request.query_params
        found = await self._queue(request)  # 404 first, as RabbitMQ (queue.delete of none is ok)
        await self.amqp(request, lambda c: c.queue_delete(
            name, listing.truthy(q.get("if-unused", "false")), listing.truthy(q.get("if-empty", "false"))),
            found["vhost"])
        return no_content()

    async def purge_queue(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
        name = seg(request, "name")
        await self.amqp(request, lambda c: c.queue_purge(name), vhost)
        return no_content()

    async def queue_bindings(self, request: Request) -> Response:
        self.auth(request)
        q = await self._queue(request)
        s = self.ctx.sampler.latest
        return paged(request, [b for b in shapes.binding_items(s)
                               if b["destination_type"] == "queue" and b["destination"] == q["name"]
                               and b["vhost"] == q["vhost"]],
                     None)

    async def get_messages(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
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
        got = await self.amqp(request, lambda c: c.get(name, count, ackmode), vhost)
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

    def routes(self) -> list[Route]:
        V, N = "{vhost}", "{name}"
        r = Route
        return [
            r("/api/queues", self.queues),
            r(f"/api/queues/{V}", self.queues),
            r(f"/api/queues/{V}/{N}", self.queue, methods=["GET"]),
            r(f"/api/queues/{V}/{N}", self.put_queue, methods=["PUT"]),
            r(f"/api/queues/{V}/{N}", self.delete_queue, methods=["DELETE"]),
            r(f"/api/queues/{V}/{N}/bindings", self.queue_bindings),
            r(f"/api/queues/{V}/{N}/contents", self.purge_queue, methods=["DELETE"]),
            r(f"/api/queues/{V}/{N}/get", self.get_messages, methods=["POST"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Queues(ctx).routes()
