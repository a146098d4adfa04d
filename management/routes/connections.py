"""Connections, channels and consumers: /api/connections (closing one is a control command),
/api/channels, /api/consumers (rabbit_mgmt_wm_connection(s), _channel(s), _consumers).
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
    in_vhost,
    named,
    no_content,
    not_found,
    ok,
    paged,
    seg,
)
from management.stats import ask

FORCED_REASON = "Closed via management plugin"


class Connections(Resource):
    """The clients' connections, their channels and consumers, read from the sample."""

    async def _connections(self) -> list[dict[str, Any]]:
        s = await self.sample()
        return shapes.connection_items(s, self.ctx.sampler.base(), self.ctx.node)

    async def connections(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_scope(request)
        return paged(request, in_vhost(await self._connections(), vhost))

    async def _connection(self, request: Request) -> dict[str, Any]:
        return named(await self._connections(), seg(request, "name"))

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
        vhost = await self.vhost_scope(request)
        return paged(request, in_vhost(shapes.channel_items(await self.sample(), self.ctx.node), vhost))

    async def channel(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        return ok(named(shapes.channel_items(s, self.ctx.node), seg(request, "name")))

    async def consumers(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_scope(request)
        return paged(request, in_vhost(shapes.consumer_items(await self.sample()), vhost,
                                       lambda c: str(c["queue"]["vhost"])), None)

    def routes(self) -> list[Route]:
        V, N = "{vhost}", "{name}"
        r = Route
        return [
            r(f"/api/vhosts/{V}/connections", self.connections),
            r(f"/api/vhosts/{V}/channels", self.channels),
            r("/api/connections", self.connections),
            r(f"/api/connections/{N}", self.connection, methods=["GET"]),
            r(f"/api/connections/{N}", self.close_connection, methods=["DELETE"]),
            r(f"/api/connections/{N}/channels", self.connection_channels),
            r("/api/channels", self.channels),
            r(f"/api/channels/{N}", self.channel),
            r("/api/consumers", self.consumers),
            r(f"/api/consumers/{V}", self.consumers),
        ]


def routes(ctx: Context) -> list[Route]:
    return Connections(ctx).routes()
