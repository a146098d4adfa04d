"""Permissions and topic permissions: /api/permissions, /api/topic-permissions and their per-user
and per-vhost views (rabbit_mgmt_wm_permission(s), _permissions_user, _permissions_vhost,
_topic_permission(s), _topic_permissions_user, _topic_permissions_vhost).

The supervisor keeps them (broker.runtime.permissions): every read and change is one of its
control commands (list_/set_/clear_permissions, list_/set_/clear_topic_permissions), so what is
shown is what the workers enforce. As RabbitMQ, every one of these paths is an administrator's
(403 ``not_authorised`` otherwise). A PUT answers 201 when the entry is new, 204 when it
replaced one; a DELETE of an entry that is not there, 404.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management.http import (
    Context,
    Resource,
    bad_request,
    body_json,
    no_content,
    not_found,
    ok,
    paged,
    seg,
)


class Permissions(Resource):
    """The permission tables, through the supervisor's control commands."""

    async def _command(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self.control(request)

    async def _rows(self, topic: bool, **where: str) -> list[dict[str, Any]]:
        command = "list_topic_permissions" if topic else "list_permissions"
        answer = await self._command({"command": command, **where})
        rows: list[dict[str, Any]] = answer["topic_permissions" if topic else "permissions"]
        return rows

    # -- permissions ------------------------------------------------------------------------

    async def permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(False), "user")

    async def user_permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(False, user=seg(request, "user")), "vhost")

    async def vhost_permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(False, vhost=seg(request, "vhost")), "user")

    async def permission(self, request: Request) -> Response:
        self.auth_admin(request)
        rows = await self._rows(False, user=seg(request, "user"), vhost=seg(request, "vhost"))
        if not rows:
            raise not_found()
        return ok(rows[0])

    async def put_permission(self, request: Request) -> Response:
        """PUT /api/permissions/{vhost}/{user}: {"configure", "write", "read"}."""
        self.auth_admin(request)
        user, vhost = seg(request, "user"), seg(request, "vhost")
        body = await body_json(request)
        for key in ("configure", "write", "read"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        had = await self._rows(False, user=user, vhost=vhost)
        await self._command({"command": "set_permissions", "user": user, "vhost": vhost,
                             "configure": str(body["configure"]), "write": str(body["write"]),
                             "read": str(body["read"])})
        return no_content(204 if had else 201)

    async def delete_permission(self, request: Request) -> Response:
        self.auth_admin(request)
        user, vhost = seg(request, "user"), seg(request, "vhost")
        if not await self._rows(False, user=user, vhost=vhost):
            raise not_found()
        await self._command({"command": "clear_permissions", "user": user, "vhost": vhost})
        return no_content()

    # -- topic permissions ------------------------------------------------------------------

    async def topic_permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(True), "user")

    async def user_topic_permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(True, user=seg(request, "user")), "vhost")

    async def vhost_topic_permissions(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, await self._rows(True, vhost=seg(request, "vhost")), "user")

    async def topic_permission(self, request: Request) -> Response:
        """GET /api/topic-permissions/{vhost}/{user}: the user's entries on the vhost, a list."""
        self.auth_admin(request)
        rows = await self._rows(True, user=seg(request, "user"), vhost=seg(request, "vhost"))
        if not rows:
            raise not_found()
        return ok(rows)

    async def put_topic_permission(self, request: Request) -> Response:
        """PUT /api/topic-permissions/{vhost}/{user}: {"exchange", "write", "read"}."""
        self.auth_admin(request)
        user, vhost = seg(request, "user"), seg(request, "vhost")
        body = await body_json(request)
        for key in ("exchange", "write", "read"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        exchange = str(body["exchange"])
        had = [p for p in await self._rows(True, user=user, vhost=vhost)
               if p["exchange"] == exchange]
        await self._command({"command": "set_topic_permissions", "user": user, "vhost": vhost,
                             "exchange": exchange, "write": str(body["write"]),
                             "read": str(body["read"])})
        return no_content(204 if had else 201)

    async def delete_topic_permission(self, request: Request) -> Response:
        """DELETE /api/topic-permissions/{vhost}/{user}: all the user's entries on the vhost."""
        self.auth_admin(request)
        user, vhost = seg(request, "user"), seg(request, "vhost")
        if not await self._rows(True, user=user, vhost=vhost):
            raise not_found()
        await self._command({"command": "clear_topic_permissions", "user": user, "vhost": vhost})
        return no_content()

    def routes(self) -> list[Route]:
        r = Route
        one = "/api/permissions/{vhost}/{user}"
        topic_one = "/api/topic-permissions/{vhost}/{user}"
        return [
            r("/api/permissions", self.permissions, methods=["GET"]),
            r(one, self.permission, methods=["GET"]),
            r(one, self.put_permission, methods=["PUT"]),
            r(one, self.delete_permission, methods=["DELETE"]),
            r("/api/users/{user}/permissions", self.user_permissions, methods=["GET"]),
            r("/api/vhosts/{vhost}/permissions", self.vhost_permissions, methods=["GET"]),
            r("/api/topic-permissions", self.topic_permissions, methods=["GET"]),
            r(topic_one, self.topic_permission, methods=["GET"]),
            r(topic_one, self.put_topic_permission, methods=["PUT"]),
            r(topic_one, self.delete_topic_permission, methods=["DELETE"]),
            r("/api/users/{user}/topic-permissions", self.user_topic_permissions,
              methods=["GET"]),
            r("/api/vhosts/{vhost}/topic-permissions", self.vhost_topic_permissions,
              methods=["GET"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Permissions(ctx).routes()
