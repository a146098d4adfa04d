"""Vhost and user limits: /api/vhost-limits and /api/user-limits (rabbit_mgmt_wm_limits,
_limit, _user_limits, _user_limit).

The supervisor keeps them (broker.runtime.limits): every read and change is one of its control
commands. As RabbitMQ: a vhost's limits are listed to any user, the rest is an administrator's;
``PUT .../{name}`` takes ``{"value": N}`` (400 ``[{key_missing,value}]`` without it) and answers
204, as does ``DELETE`` (of a limit that is not set, too); a vhost that does not exist is 404, a
user that does not exist 400 on PUT (RabbitMQ's ``no_such_user``) and 404 elsewhere.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management.http import APIError, Context, Resource, bad_request, body_json, no_content, ok, seg


class Limits(Resource):
    """The limit tables, through the supervisor's control commands."""

    async def _list(self, request: Request, kind: str) -> Response:
        """GET /api/{kind}-limits[/{name}]: the limits set, of one vhost or user or all."""
        where = {kind: seg(request, kind)} if kind in request.path_params else {}
        answer = await self.control({"command": f"list_{kind}_limits", **where})
        return ok(answer["limits"])

    async def vhost_limits(self, request: Request) -> Response:
        self.auth(request)
        return await self._list(request, "vhost")

    async def put_vhost_limit(self, request: Request) -> Response:
        self.auth_admin(request)
        value = await _value(request)
        await self.control({"command": "set_vhost_limit", "vhost": seg(request, "vhost"),
                            "name": seg(request, "name"), "value": value})
        return no_content()

    async def delete_vhost_limit(self, request: Request) -> Response:
        self.auth_admin(request)
        await self.control({"command": "clear_vhost_limit", "vhost": seg(request, "vhost"),
                            "name": seg(request, "name")})
        return no_content()

    async def user_limits(self, request: Request) -> Response:
        self.auth_admin(request)
        return await self._list(request, "user")

    async def put_user_limit(self, request: Request) -> Response:
        self.auth_admin(request)
        user, name = seg(request, "user"), seg(request, "name")
        value = await _value(request)
        try:
            await self.control({"command": "set_user_limits", "user": user,
                                "limits": {name: value}})
        except APIError as exc:
            if exc.status == 404:
                raise APIError(400, "bad_request", ["no_such_user", user]) from None
            raise
        return no_content()

    async def delete_user_limit(self, request: Request) -> Response:
        self.auth_admin(request)
        await self.control({"command": "clear_user_limits", "user": seg(request, "user"),
                            "name": seg(request, "name")})
        return no_content()

    def routes(self) -> list[Route]:
        r = Route
        vhost_one = "/api/vhost-limits/{vhost}/{name}"
        user_one = "/api/user-limits/{user}/{name}"
        return [
            r("/api/vhost-limits", self.vhost_limits, methods=["GET"]),
            r("/api/vhost-limits/{vhost}", self.vhost_limits, methods=["GET"]),
            r(vhost_one, self.put_vhost_limit, methods=["PUT"]),
            r(vhost_one, self.delete_vhost_limit, methods=["DELETE"]),
            r("/api/user-limits", self.user_limits, methods=["GET"]),
            r("/api/user-limits/{user}", self.user_limits, methods=["GET"]),
            r(user_one, self.put_user_limit, methods=["PUT"]),
            r(user_one, self.delete_user_limit, methods=["DELETE"]),
        ]


async def _value(request: Request) -> Any:
    body = await body_json(request)
    if not isinstance(body, dict) or "value" not in body:
        raise bad_request("[{key_missing,value}]")
    return body["value"]


def routes(ctx: Context) -> list[Route]:
    return Limits(ctx).routes()
