"""Runtime parameters and shovels: /api/parameters (rabbit_mgmt_wm_parameters, _parameter) and
/api/shovels (rabbitmq_shovel_management). Parameters live in the supervisor
(``broker.runtime.parameters``) and shovels run in the links process; every read and change is a
control command.
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


class Parameters(Resource):
    async def _command(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self.control(request)

    async def listing(self, request: Request) -> Response:
        self.auth(request)
        query: dict[str, Any] = {"command": "list_parameters"}
        if "component" in request.path_params:
            query["component"] = seg(request, "component")
        if "vhost" in request.path_params:
            query["vhost"] = await self.vhost_param(request)
        return paged(request, list((await self._command(query))["parameters"]), None)

    async def one(self, request: Request) -> Response:
        self.auth(request)
        await self.vhost_param(request)
        answer = await self._command({"command": "list_parameters", "vhost": seg(request, "vhost"),
                                      "component": seg(request, "component")})
        for p in answer["parameters"]:
            if p["name"] == seg(request, "name"):
                return ok(p)
        raise not_found()

    async def put(self, request: Request) -> Response:
        """PUT ``{"value": {...}}``: 201 for a new parameter, 204 for a changed one, 400 with
        RabbitMQ's Validation failed text."""
        self.auth_admin(request)
        await self.vhost_param(request)
        body = await body_json(request)
        if "value" not in body:
            raise bad_request("[{key_missing,value}]")
        answer = await self._command({
            "command": "set_parameter", "vhost": seg(request, "vhost"),
            "component": seg(request, "component"), "name": seg(request, "name"),
            "value": body["value"]})
        return no_content(201 if answer.get("created") else 204)

    async def delete(self, request: Request) -> Response:
        self.auth_admin(request)
        await self.vhost_param(request)
        await self._command({"command": "clear_parameter", "vhost": seg(request, "vhost"),
                             "component": seg(request, "component"), "name": seg(request, "name")})
        return no_content()

    async def shovels(self, request: Request) -> Response:
        self.auth(request)
        rows = list((await self._command({"command": "shovel_status"}))["shovels"])
        for row in rows:
            row["node"] = self.ctx.node.name
        if "vhost" in request.path_params:
            await self.vhost_param(request)
            rows = [r for r in rows if r["vhost"] == seg(request, "vhost")]
        if "name" in request.path_params:
            for row in rows:
                if row["name"] == seg(request, "name"):
                    return ok(row)
            raise not_found()
        return paged(request, rows, None)

    def routes(self) -> list[Route]:
        b = "/api/parameters"
        return [
            Route(b, self.listing, methods=["GET"]),
            Route(f"{b}/{{component}}", self.listing, methods=["GET"]),
            Route(f"{b}/{{component}}/{{vhost}}", self.listing, methods=["GET"]),
            Route(f"{b}/{{component}}/{{vhost}}/{{name}}", self.one, methods=["GET"]),
            Route(f"{b}/{{component}}/{{vhost}}/{{name}}", self.put, methods=["PUT"]),
            Route(f"{b}/{{component}}/{{vhost}}/{{name}}", self.delete, methods=["DELETE"]),
            Route("/api/shovels", self.shovels, methods=["GET"]),
            Route("/api/shovels/{vhost}", self.shovels, methods=["GET"]),
            Route("/api/shovels/vhost/{vhost}/{name}", self.shovels, methods=["GET"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Parameters(ctx).routes()
