"""Users and vhosts: /api/users, /api/vhosts (rabbit_mgmt_wm_user(s), _vhost(s)). Users change
through the supervisor; there is one vhost. Permissions: management.routes.permissions.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.passwords import HASHINGS, SHA256, algorithm_of
from management import shapes
from management.http import (
    VHOST,
    APIError,
    Context,
    Resource,
    bad_request,
    body_json,
    check_vhost,
    no_content,
    not_found,
    ok,
    paged,
    seg,
)


def user_item(ctx: Context, name: str) -> dict[str, Any]:
    stored = ctx.users.stored[name]
    return {"name": name, "password_hash": stored,
            "hashing_algorithm": algorithm_of(stored) or SHA256,
            "tags": ctx.users.tags_of(name), "limits": {}}


class Users(Resource):
    """Who may log in, with which tags, to which vhost."""

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

    async def users(self, request: Request) -> Response:
        self.auth_admin(request)
        return paged(request, [user_item(self.ctx, n) for n in self.ctx.users.stored if n])

    async def user(self, request: Request) -> Response:
        self.auth_admin(request)
        name = seg(request, "user")
        if name not in self.ctx.users.stored or not name:
            raise not_found()
        return ok(user_item(self.ctx, name))

    async def _users_command(self, request: dict[str, Any]) -> dict[str, Any]:
        """A users change through the supervisor (broker.runtime.users), applied here at once
        too (the supervisor's line on our stdin says the same, later)."""
        answer = await self.control(request)
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
        algorithm = body.get("hashing_algorithm", SHA256)
        if algorithm not in HASHINGS:
            raise bad_request(f"hashing algorithm {algorithm} is not supported")
        command["hashing_algorithm"] = algorithm
        answer = await self._users_command(command)
        return no_content(201 if answer.get("created") else 204)

    async def delete_user(self, request: Request) -> Response:
        self.auth_admin(request)
        await self._users_command({"command": "delete_user", "name": seg(request, "user")})
        return no_content()

    async def bulk_delete_users(self, request: Request) -> Response:
        """POST /api/users/bulk-delete ``{"users": [...]}``: deleted in order; as RabbitMQ, an
        unknown name stops there with 400 ``["no_such_user", NAME]`` (those before it stay
        deleted)."""
        self.auth_admin(request)
        names = (await body_json(request)).get("users")
        if not isinstance(names, list):
            raise bad_request("[{key_missing,users}]")
        for name in names:
            try:
                await self._users_command({"command": "delete_user", "name": str(name)})
            except APIError as exc:
                if exc.status != 404:
                    raise
                raise APIError(400, "bad_request", ["no_such_user", str(name)]) from None
        return no_content()

    def routes(self) -> list[Route]:
        V = "{vhost}"
        r = Route
        return [
            r("/api/vhosts", self.vhosts),
            r(f"/api/vhosts/{V}", self.vhost),
            r("/api/users", self.users),
            r("/api/users/bulk-delete", self.bulk_delete_users, methods=["POST"]),
            r("/api/users/{user}", self.user, methods=["GET"]),
            r("/api/users/{user}", self.put_user, methods=["PUT"]),
            r("/api/users/{user}", self.delete_user, methods=["DELETE"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Users(ctx).routes()
