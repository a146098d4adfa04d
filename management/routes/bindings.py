"""Bindings: /api/bindings, and the bindings between one source and one destination, each named
by its properties key (rabbit_mgmt_wm_bindings, _binding).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management import shapes
from management.http import (
    APIError,
    Context,
    Resource,
    body_json,
    exchange_name,
    in_vhost,
    no_content,
    not_found,
    ok,
    paged,
    seg,
)


class Bindings(Resource):
    """Bindings read from the sample, made and removed over AMQP."""

    async def bindings(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_scope(request)
        return paged(request, in_vhost(shapes.binding_items(await self.sample()), vhost), None)

    async def _ends(self, request: Request) -> tuple[str, str, str, str]:
        vhost = await self.vhost_param(request)
        kind = {"q": "queue", "e": "exchange"}.get(request.path_params["dtype"])
        if kind is None:
            raise not_found()
        return vhost, exchange_name(seg(request, "source")), kind, seg(request, "dest")

    async def _between(self, request: Request) -> tuple[str, str, str, list[dict[str, Any]]]:
        vhost, source, kind, dest = await self._ends(request)
        s = await self.sample()
        items = [b for b in shapes.binding_items(s) if b["source"] == source
                 and b["destination_type"] == kind and b["destination"] == dest
                 and b["vhost"] == vhost]
        return source, kind, dest, items

    async def bindings_between(self, request: Request) -> Response:
        self.auth(request)
        _, _, _, items = await self._between(request)
        return paged(request, items, None)

    async def post_binding(self, request: Request) -> Response:
        self.auth(request)
        vhost, source, kind, dest = await self._ends(request)
        if source == "":
            raise APIError(401, "not_authorised",
                           "operation not permitted on the default exchange")
        body = await body_json(request)
        key = str(body.get("routing_key", ""))
        arguments = dict(body.get("arguments") or {})
        await self.amqp(request, lambda c: c.bind(kind, source, dest, key, arguments), vhost)
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
                                                     b["destination"], b["routing_key"], b["arguments"]),
                        b["vhost"])
        return no_content()

    def routes(self) -> list[Route]:
        V = "{vhost}"
        r = Route
        return [
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
        ]


def routes(ctx: Context) -> list[Route]:
    return Bindings(ctx).routes()
