"""Policies and operator policies: /api/policies, /api/operator-policies (rabbit_mgmt_wm_policies,
_policy, _operator_policies, _operator_policy). They live in the supervisor
(``broker.runtime.policies``): every read and change is a control command.
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
    vhost_names,
)


class Policies(Resource):
    """GET the list, GET/PUT/DELETE one, for ``/api/policies`` or ``/api/operator-policies``."""

    def __init__(self, ctx: Context, operator: bool) -> None:
        super().__init__(ctx)
        self.operator = operator
        self.base = "/api/operator-policies" if operator else "/api/policies"
        self.kind = "operator_polic" if operator else "polic"

    async def _command(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.control(request)
        finally:
            self.ctx.sampler.stale()

    async def _list(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """The policies of ``vhost`` (None: of every vhost)."""
        verb = "list_operator_policies" if self.operator else "list_policies"
        names = [vhost] if vhost is not None else sorted(vhost_names(await self.sample()))
        return [p for name in names
                for p in (await self._command({"command": verb, "vhost": name}))["policies"]]

    async def listing(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request) if "vhost" in request.path_params else None
        return paged(request, await self._list(vhost), None)

    async def one(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)
        name = seg(request, "name")
        for p in await self._list(vhost):
            if p["name"] == name:
                return ok(p)
        raise not_found()

    async def put(self, request: Request) -> Response:
        """PUT: ``pattern`` and ``definition`` needed; ``priority`` (0) and ``apply-to`` (all)
        optional; 201 for a new policy, 204 for a changed one, 400 with RabbitMQ's text."""
        self.auth_admin(request)
        await self.vhost_param(request)
        body = await body_json(request)
        for key in ("pattern", "definition"):
            if key not in body:
                raise bad_request(f"[{{key_missing,{key}}}]")
        answer = await self._command({
            "command": "set_operator_policy" if self.operator else "set_policy",
            "vhost": seg(request, "vhost"), "name": seg(request, "name"),
            "pattern": body["pattern"], "definition": body["definition"],
            "priority": body.get("priority"), "apply-to": body.get("apply-to")})
        return no_content(201 if answer.get("created") else 204)

    async def delete(self, request: Request) -> Response:
        self.auth_admin(request)
        await self.vhost_param(request)
        await self._command({
            "command": "clear_operator_policy" if self.operator else "clear_policy",
            "vhost": seg(request, "vhost"), "name": seg(request, "name")})
        return no_content()

    def routes(self) -> list[Route]:
        b = self.base
        return [
            Route(b, self.listing),
            Route(f"{b}/{{vhost}}", self.listing),
            Route(f"{b}/{{vhost}}/{{name}}", self.one, methods=["GET"]),
            Route(f"{b}/{{vhost}}/{{name}}", self.put, methods=["PUT"]),
            Route(f"{b}/{{vhost}}/{{name}}", self.delete, methods=["DELETE"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Policies(ctx, False).routes() + Policies(ctx, True).routes()
