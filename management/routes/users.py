"""Users and vhosts: /api/users, /api/vhosts (rabbit_mgmt_wm_user(s), _vhost(s)). Both change
through the supervisor (broker.runtime.users, broker.runtime.vhost_admin); a vhost made here
gives its maker full permissions on it, as rabbit_vhost:put_vhost does. Permissions:
management.routes.permissions.
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
            "tags": ctx.users.tags_of(name), "limits": dict(ctx.users.limits.get(name, {}))}


class Users(Resource):
    """Who may log in, with which tags, to which vhost."""

    def _vhost_item(self, s: Any, base: Any, row: dict[str, Any]) -> dict[str, Any]:
        """One vhost in RabbitMQ's shape; its message counts are its queues' (the snapshot's
        vhost row), the message rates the broker's (they are counted broker-wide)."""
        item = {"name": row["name"], "description": row.get("description", ""),
                "tags": row.get("tags", []),
                "default_queue_type": row.get("default_queue_type", "classic"), "tracing": False,
                "metadata": row.get("metadata") or {"description": "", "tags": []},
                "cluster_state": {self.ctx.node.name: "running"}}
        if len(s.snapshot.get("vhosts") or ()) <= 1:  # the one vhost: with the rates
            item.update(shapes.queue_totals(s, base))
        else:
            for key in ("messages", "messages_ready", "messages_unacknowledged"):
                item[key] = row.get(key, 0)
                item[f"{key}_details"] = {"rate": 0.0}
        item["message_stats"] = shapes.message_stats(s, base)
        return item

    def _vhost_rows(self, s: Any) -> list[dict[str, Any]]:
        return list(s.snapshot.get("vhosts") or [{"name": VHOST}])

    async def vhosts(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        base = self.ctx.sampler.base()
        return paged(request, [self._vhost_item(s, base, row) for row in self._vhost_rows(s)])

    async def vhost(self, request: Request) -> Response:
        self.auth(request)
        name = await self.vhost_param(request)
        s = self.ctx.sampler.latest
        row = next(row for row in self._vhost_rows(s) if row["name"] == name)
        return ok(self._vhost_item(s, self.ctx.sampler.base(), row))

    async def put_vhost(self, request: Request) -> Response:
        """PUT /api/vhosts/NAME ``{description, tags, default_queue_type}``: 201 for a new vhost
        (its maker gets full permissions on it), 204 for one updated."""
        user, _ = self.auth_admin(request)
        body = await body_json(request)
        command: dict[str, Any] = {"command": "add_vhost", "name": seg(request, "vhost"),
                                   "description": str(body.get("description") or ""),
                                   "default_queue_type": str(body.get("default_queue_type") or ""),
                                   "grant_to": user}
        if body.get("tags") is not None:
            command["tags"] = body["tags"]
        answer = await self.control(command)
        self.ctx.sampler.stale()
        return no_content(201 if answer.get("created") else 204)

    async def delete_vhost(self, request: Request) -> Response:
        """DELETE /api/vhosts/NAME: it and everything in it; its connections are closed."""
        self.auth_admin(request)
        await self.control({"command": "delete_vhost", "name": seg(request, "vhost")})
        self.ctx.sampler.stale()
        return no_content()

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
            r(f"/api/vhosts/{V}", self.vhost, methods=["GET"]),
            r(f"/api/vhosts/{V}", self.put_vhost, methods=["PUT"]),
            r(f"/api/vhosts/{V}", self.delete_vhost, methods=["DELETE"]),
            r("/api/users", self.users),
            r("/api/users/bulk-delete", self.bulk_delete_users, methods=["POST"]),
            r("/api/users/{user}", self.user, methods=["GET"]),
            r("/api/users/{user}", self.put_user, methods=["PUT"]),
            r("/api/users/{user}", self.delete_user, methods=["DELETE"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Users(ctx).routes()
