"""Definitions: GET and POST /api/definitions, the whole broker's or one vhost's
(rabbit_mgmt_wm_definitions). An import declares over AMQP as the HTTP user.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management import amqp_ops, listing, shapes
from management.http import (
    VHOST,
    Context,
    Resource,
    bad_request,
    body_json,
    check_vhost,
    flag,
    no_content,
    ok,
    seg,
)
from management.routes.users import user_item
from management.stats import ask


class Definitions(Resource):
    """Exports the topology and users as RabbitMQ's JSON; imports the topology."""

    async def _permission_rows(self) -> tuple[list[Any], list[Any]]:
        """The permissions and topic permissions the supervisor keeps
        (broker.runtime.permissions), in RabbitMQ's export shape."""
        perms = await ask(self.ctx.control_path, {"command": "list_permissions"})
        topics = await ask(self.ctx.control_path, {"command": "list_topic_permissions"})
        return list(perms.get("permissions") or []), list(topics.get("topic_permissions") or [])

    def _definitions(self, s: Any, whole: bool,
                     perms: tuple[list[Any], list[Any]] = ([], [])) -> dict[str, Any]:
        exclusive = {q[0] for q in s.snapshot.get("queues", ()) if q[3] is not None}
        queues = [{"name": q["name"], "vhost": q["vhost"], "durable": q["durable"],
                   "auto_delete": q["auto_delete"], "arguments": q["arguments"]}
                  for q in shapes.queue_items(s, None, self.ctx.node) if not q["exclusive"]]
        exchanges = [{k: x[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                        "internal", "arguments")}
                     for x in shapes.exchange_items(s, self.ctx.node)
                     if x["name"] and not x["name"].startswith("amq.")]
        bindings = [{k: b[k] for k in ("source", "vhost", "destination", "destination_type",
                                       "routing_key", "arguments")}
                    for b in shapes.binding_items(s)
                    if b["source"] and b["destination"] not in exclusive]
        out: dict[str, Any] = {
            "rabbit_version": self.ctx.node.version,
            "rabbitmq_version": self.ctx.node.version,
            "product_name": "Shoal",
            "product_version": self.ctx.node.version,
        }
        if whole:
            out["users"] = [user_item(self.ctx, n) for n in self.ctx.users.stored if n]
            out["vhosts"] = [{"name": VHOST, "description": "Default virtual host", "tags": [],
                              "metadata": {"description": "Default virtual host", "tags": []}}]
            out["permissions"], out["topic_permissions"] = perms
            out["parameters"] = []
            out["global_parameters"] = []
        out["policies"] = list((s.snapshot.get("policies") or {}).get("policies", []))
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
        if not whole:
            check_vhost(seg(request, "vhost"))
        perms = await self._permission_rows() if whole else ([], [])
        s = await self.sample()
        out = self._definitions(s, whole, perms)
        if whole:  # the shovels' parameters, from the supervisor (broker.runtime.parameters)
            answer = await ask(self.ctx.control_path, {"command": "list_parameters"})
            out["parameters"] = list(answer.get("parameters") or [])
        response = ok(out)
        if listing.truthy(request.query_params.get("download", "false")) or \
                "download" in request.query_params:
            response.headers["Content-Disposition"] = 'attachment; filename="definitions.json"'
        return response

    async def import_definitions(self, request: Request) -> Response:
        """Exchanges, queues, bindings are declared (over AMQP, as the HTTP user); users,
        vhosts, permissions, policies and parameters are not imported (Shoal has no runtime
        user or vhost management yet)."""
        self.auth(request)
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
        body = await body_json(request)

        def vhost_ok(item: dict[str, Any]) -> bool:
            return item.get("vhost", VHOST) == VHOST

        for p in body.get("policies") or []:  # through the supervisor, before the queues
            if isinstance(p, dict) and vhost_ok(p):
                answer = await ask(self.ctx.control_path, {**p, "command": "set_policy",
                                                           "vhost": VHOST})
                if "error" in answer:
                    raise bad_request(str(answer["error"]))

        async def run(c: amqp_ops.Client) -> None:
            for x in body.get("exchanges") or []:
                if vhost_ok(x) and x.get("name") and not str(x["name"]).startswith("amq."):
                    await c.exchange_declare(x["name"], x.get("type", "direct"),
                                             flag(x, "durable", True), flag(x, "auto_delete", False),
                                             flag(x, "internal", False), dict(x.get("arguments") or {}))
            for q in body.get("queues") or []:
                if vhost_ok(q) and q.get("name"):
                    args = dict(q.get("arguments") or {})
                    if args.get("x-queue-type") == "classic":
                        args.pop("x-queue-type")
                    await c.queue_declare(q["name"], flag(q, "durable", True),
                                          flag(q, "auto_delete", False), args)
            for b in body.get("bindings") or []:
                if vhost_ok(b) and b.get("source"):
                    await c.bind(b.get("destination_type", "queue"), b["source"], b["destination"],
                                 b.get("routing_key", ""), dict(b.get("arguments") or {}))

        await self.amqp(request, run)
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
