"""Exchanges: /api/exchanges, an exchange's bindings as source and destination, publishing
(rabbit_mgmt_wm_exchange(s), _exchange_publish). The default exchange's path name is ``amq.default``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management import amqp_ops, listing, shapes
from management.http import (
    Context,
    Resource,
    bad_request,
    body_json,
    exchange_name,
    flag,
    in_vhost,
    named,
    no_content,
    ok,
    paged,
    seg,
)


class Exchanges(Resource):
    """The exchanges of every vhost (of one, under ``{vhost}``), read from the sample, changed
    over AMQP on a connection to their vhost."""

    async def _exchanges(self, vhost: str | None = None) -> list[dict[str, Any]]:
        s = await self.sample()
        return in_vhost(shapes.exchange_items(s, self.ctx.node, self.ctx.sampler.base()), vhost)

    async def exchanges(self, request: Request) -> Response:
        self.auth(request)
        return paged(request, await self._exchanges(await self.vhost_scope(request)))

    async def _exchange(self, request: Request) -> dict[str, Any]:
        vhost = await self.vhost_param(request)
        return named(await self._exchanges(vhost), exchange_name(seg(request, "name")))

    async def exchange(self, request: Request) -> Response:
        self.auth(request)
        return ok(await self._exchange(request))

    async def put_exchange(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
        name = exchange_name(seg(request, "name"))
        body = await body_json(request)
        if "type" not in body:
            raise bad_request("[{key_missing,type}]")
        existed = any(x["name"] == name for x in await self._exchanges(vhost))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.exchange_declare(
            name, str(body["type"]), flag(body, "durable", True), flag(body, "auto_delete", False),
            flag(body, "internal", False), arguments), vhost)
        return no_content(204 if existed else 201)

    async def delete_exchange(self, request: Request) -> Response:
        self.auth(request)
        x = await self._exchange(request)
        name = exchange_name(seg(request, "name"))
        if_unused = listing.truthy(request.query_params.get("if-unused", "false"))
        await self.amqp(request, lambda c: c.exchange_delete(name, if_unused), x["vhost"])
        return no_content()

    async def exchange_bindings(self, request: Request) -> Response:
        self.auth(request)
        x = await self._exchange(request)
        side = "source" if request.url.path.endswith("/source") else "destination"
        s = self.ctx.sampler.latest
        items = [b for b in shapes.binding_items(s) if b[side] == x["name"]
                 and b["vhost"] == x["vhost"]
                 and (side == "source" or b["destination_type"] == "exchange")]
        return paged(request, items, None)

    async def publish(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
        name = exchange_name(seg(request, "name"))
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
                                                               payload, props), vhost)
        return ok({"routed": routed})

    def routes(self) -> list[Route]:
        V, N = "{vhost}", "{name}"
        r = Route
        return [
            r("/api/exchanges", self.exchanges),
            r(f"/api/exchanges/{V}", self.exchanges),
            r(f"/api/exchanges/{V}/{N}", self.exchange, methods=["GET"]),
            r(f"/api/exchanges/{V}/{N}", self.put_exchange, methods=["PUT"]),
            r(f"/api/exchanges/{V}/{N}", self.delete_exchange, methods=["DELETE"]),
            r(f"/api/exchanges/{V}/{N}/bindings/source", self.exchange_bindings),
            r(f"/api/exchanges/{V}/{N}/bindings/destination", self.exchange_bindings),
            r(f"/api/exchanges/{V}/{N}/publish", self.publish, methods=["POST"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Exchanges(ctx).routes()
