"""Definitions: GET and POST /api/definitions, the whole broker's or one vhost's
(rabbit_mgmt_wm_definitions). An import goes to the supervisor's import_definitions control
command (broker.runtime.definitions_io), the importer every import path shares.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.limits import export_limits
from management import listing, shapes
from management.http import (
    VHOST,
    Context,
    Resource,
    bad_request,
    body_json,
    no_content,
    ok,
)
from management.routes.users import user_item
from management.stats import ask


class Definitions(Resource):
    """Exports the topology, users and permissions as RabbitMQ's JSON; imports them."""

    async def _permission_rows(self) -> tuple[list[Any], list[Any]]:
        """The permissions and topic permissions the supervisor keeps
        (broker.runtime.permissions), in RabbitMQ's export shape."""
        perms = await ask(self.ctx.control_path, {"command": "list_permissions"})
        topics = await ask(self.ctx.control_path, {"command": "list_topic_permissions"})
        return list(perms.get("permissions") or []), list(topics.get("topic_permissions") or [])

    def _definitions(self, s: Any, whole: bool, perms: tuple[list[Any], list[Any]] = ([], []),
                     vhost: str | None = None) -> dict[str, Any]:
        """Every vhost's objects (``whole``), or those of ``vhost``."""
        exclusive = {(q["vhost"], q["name"]) for q in shapes.queue_items(s, None, self.ctx.node)
                     if q["exclusive"]}
        queues = [{"name": q["name"], "vhost": q["vhost"], "durable": q["durable"],
                   "auto_delete": q["auto_delete"], "arguments": q["arguments"]}
                  for q in shapes.queue_items(s, None, self.ctx.node)
                  if not q["exclusive"] and vhost in (None, q["vhost"])]
        exchanges = [{k: x[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                        "internal", "arguments")}
                     for x in shapes.exchange_items(s, self.ctx.node)
                     if x["name"] and not x["name"].startswith("amq.") and vhost in (None, x["vhost"])]
        bindings = [{k: b[k] for k in ("source", "vhost", "destination", "destination_type",
                                       "routing_key", "arguments")}
                    for b in shapes.binding_items(s)
                    if b["source"] and (b["vhost"], b["destination"]) not in exclusive
                    and vhost in (None, b["vhost"])]
        out: dict[str, Any] = {
            "rabbit_version": self.ctx.node.version,
            "rabbitmq_version": self.ctx.node.version,
            "product_name": "Shoal",
            "product_version": self.ctx.node.version,
        }
        if whole:
            out["users"] = [user_item(self.ctx, n) for n in self.ctx.users.stored if n]
            out["vhosts"] = [{k: v[k] for k in ("name", "description", "tags", "metadata")}
                             for v in s.snapshot.get("vhosts") or [
                                 {"name": VHOST, "description": "", "tags": [],
                                  "metadata": {"description": "", "tags": []}}]]
            out["permissions"], out["topic_permissions"] = perms
            out["parameters"] = []
            out["global_parameters"] = []
        per_vhost = s.snapshot.get("vhost_policies") or {VHOST: s.snapshot.get("policies")}
        out["policies"] = [p for name, table in sorted(per_vhost.items())
                           if vhost in (None, name) for p in (table or {}).get("policies", [])]
        out["queues"] = queues
        out["exchanges"] = exchanges
        out["bindings"] = bindings
        if not whole:
            for kind in ("queues", "exchanges", "bindings"):
                for item in out[kind]:
                    item.pop("vhost", None)
        return out

    async def definitions(self, request: Request) -> Response:
        self.auth(request)
        whole = "vhost" not in request.path_params
        vhost = None if whole else await self.vhost_param(request)
        perms = await self._permission_rows() if whole else ([], [])
        s = await self.sample()
        out = self._definitions(s, whole, perms, vhost)
        if whole:  # the shovels' parameters, from the supervisor (broker.runtime.parameters)
            answer = await ask(self.ctx.control_path, {"command": "list_parameters"})
            out["parameters"] = list(answer.get("parameters") or [])
            vhost_limits = await ask(self.ctx.control_path, {"command": "list_vhost_limits"})
            user_limits = await ask(self.ctx.control_path, {"command": "list_user_limits"})
            export_limits(out, list(vhost_limits.get("limits") or []),
                          list(user_limits.get("limits") or []))
        response = ok(out)
        if listing.truthy(request.query_params.get("download", "false")) or \
                "download" in request.query_params:
            response.headers["Content-Disposition"] = 'attachment; filename="definitions.json"'
        return response

    async def import_definitions(self, request: Request) -> Response:
        """Through the supervisor's import_definitions control command
        (broker.runtime.definitions_io, the one importer of ``shoal serve --load-definitions``
        and ``shoal ctl import_definitions``): users, permissions, topic permissions, policies,
        exchanges, queues and bindings; what Shoal does not support, or refuses, is logged at
        WARNING by the broker; a malformed body is a 400. An administrator's request, as
        RabbitMQ's."""
        self.auth_admin(request)
        if "vhost" in request.path_params:
            await self.vhost_param(request)
        body = await body_json(request)
        if not isinstance(body, dict):
            raise bad_request("expected the definitions as one JSON object")
        try:
            answer = await ask(self.ctx.control_path, {"command": "import_definitions",
                                                       "definitions": body}, timeout=60.0)
        finally:  # what it declared is listed at once, as RabbitMQ lists it
            self.ctx.sampler.stale()
        if "error" in answer:
            raise bad_request(str(answer["error"]))
        return no_content()

    def routes(self) -> list[Route]:
        V = "{vhost}"
        r = Route
        return [
            r("/api/definitions", self.definitions, methods=["GET"]),
            r("/api/definitions", self.import_definitions, methods=["POST"]),
            r(f"/api/definitions/{V}", self.definitions, methods=["GET"]),
            r(f"/api/definitions/{V}", self.import_definitions, methods=["POST"]),
        ]


def routes(ctx: Context) -> list[Route]:
    return Definitions(ctx).routes()
