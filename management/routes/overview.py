"""The node as a whole: /api/overview, whoami, extensions, nodes, the aliveness test and the
health checks (rabbit_mgmt_wm_overview, _whoami, _nodes, _aliveness_test, _health_check_*).
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from typing import Any

import psutil
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management import amqp_ops, shapes
from management.http import (
    EXCHANGE_TYPES,
    VHOST,
    Context,
    Resource,
    bad_request,
    not_found,
    ok,
    paged,
    seg,
)


class Overview(Resource):
    """The node, its identity and its health."""

    async def overview(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        base = self.ctx.sampler.base()
        node = self.ctx.node
        snap = s.snapshot
        return ok({
            "management_version": node.version,
            "rates_mode": "basic",
            "sample_retention_policies": {"global": [600, 3600, 28800, 86400],
                                          "basic": [600, 3600], "detailed": [600]},
            "exchange_types": EXCHANGE_TYPES,
            "product_version": node.version,
            "product_name": "Shoal",
            "rabbitmq_version": node.version,
            "cluster_name": node.name,
            "erlang_version": platform.python_version(),
            "erlang_full_version": f"Python {platform.python_version()} ({platform.python_implementation()})",
            "disable_stats": False,
            "enable_queue_totals": True,
            "message_stats": shapes.message_stats(s, base),
            "churn_rates": {},
            "queue_totals": shapes.queue_totals(s, base),
            "object_totals": {
                "channels": sum(c.get("channels", 0) for c in s.connections),
                "connections": len(s.connections),
                "consumers": len(snap.get("consumers", ())),
                "exchanges": len(snap.get("exchanges", ())),
                "queues": len(snap.get("queues", ())),
            },
            "statistics_db_event_queue": 0,
            "node": node.name,
            "listeners": [
                {"node": node.name, "protocol": "amqp", "ip_address": node.amqp_host,
                 "port": node.amqp_port, "socket_opts": []},
                {"node": node.name, "protocol": "http", "ip_address": "", "port": node.http_port,
                 "socket_opts": []},
            ],
            "contexts": [{"node": node.name, "description": "RabbitMQ Management",
                          "path": "/", "port": str(node.http_port)}],
        })

    async def whoami(self, request: Request) -> Response:
        user, _ = self.auth(request)
        return ok({"name": user, "tags": self.ctx.users.tags_of(user)})

    def _node_item(self) -> dict[str, Any]:
        node = self.ctx.node
        s = self.ctx.sampler.latest
        alarms = s.snapshot.get("alarms", {})
        mem_used = 0
        try:
            parent = psutil.Process(os.getppid())
            mem_used = sum(p.memory_info().rss for p in [parent, *parent.children()])
        except (psutil.Error, OSError):  # the process went meanwhile
            mem_used = 0
        disk_free = 0
        if self.ctx.data_dir:
            try:
                disk_free = shutil.disk_usage(self.ctx.data_dir).free
            except OSError:
                disk_free = 0
        return {
            "name": node.name,
            "type": "disc",
            "running": True,
            "os_pid": str(os.getppid()),
            "mem_used": mem_used,
            "mem_alarm": bool(alarms.get("memory")) or bool(alarms.get("queued")),
            "disk_free": disk_free,
            "disk_free_alarm": bool(alarms.get("disk")),
            "processors": os.cpu_count() or 1,
            "uptime": int((time.time() - self.ctx.started) * 1000),
            "partitions": [],
            "rates_mode": "basic",
            "being_drained": False,
            "applications": [],
            "exchange_types": EXCHANGE_TYPES,
            "net_ticktime": 60,
            "enabled_plugins": ["rabbitmq_management"],
        }

    async def nodes(self, request: Request) -> Response:
        self.auth(request)
        await self.sample()
        return paged(request, [self._node_item()])

    async def node(self, request: Request) -> Response:
        self.auth(request)
        if seg(request, "node") != self.ctx.node.name:
            raise not_found()
        await self.sample()
        return ok(self._node_item())

    async def extensions(self, request: Request) -> Response:
        self.auth(request)
        return ok([])

    async def cluster_name(self, request: Request) -> Response:
        """GET /api/cluster-name: RabbitMQ's default is its node's name; Shoal is one node."""
        self.auth(request)
        return ok({"name": self.ctx.node.name})

    async def healthcheck_node(self, request: Request) -> Response:
        """GET /api/healthchecks/node[/NODE]: RabbitMQ 3.x's old (deprecated) node check, which
        amqpstorm's ``api.healthchecks.get()`` calls; ``{"status": "ok"}`` while we answer."""
        self.auth(request)
        if "node" in request.path_params and seg(request, "node") != self.ctx.node.name:
            raise not_found()
        return ok({"status": "ok"})

    async def aliveness(self, request: Request) -> Response:
        self.auth(request)
        vhost = await self.vhost_param(request)

        async def run(c: amqp_ops.Client) -> bool:
            await c.queue_declare("aliveness-test", False, False, {})
            await c.publish("", "aliveness-test", b"test_message", {})
            got = await c.get("aliveness-test", 1, "ack_requeue_false")
            return bool(got) and got[0].body == b"test_message"

        if not await self.amqp(request, run, vhost):
            return ok({"status": "failed", "reason": "the test message did not come back"}, 503)
        return ok({"status": "ok"})

    async def check_alarms(self, request: Request) -> Response:
        self.auth(request)
        s = await self.sample()
        alarms = s.snapshot.get("alarms", {})
        active = []
        if alarms.get("memory") or alarms.get("queued"):
            active.append({"node": self.ctx.node.name, "resource": "memory"})
        if alarms.get("disk"):
            active.append({"node": self.ctx.node.name, "resource": "disk"})
        if active:
            return ok({"status": "failed", "reason": "resource alarm(s) in effect in the cluster",
                       "alarms": active}, 503)
        return ok({"status": "ok"})

    async def check_port(self, request: Request) -> Response:
        self.auth(request)
        try:
            port = int(request.path_params["port"])
        except ValueError:
            raise bad_request("port must be an integer") from None
        ports = [self.ctx.node.amqp_port, self.ctx.node.http_port]
        if port in ports:
            return ok({"status": "ok", "port": port})
        return ok({"status": "failed", "reason": "No active listener", "missing": port,
                   "ports": ports}, 503)

    async def check_vhosts(self, request: Request) -> Response:
        self.auth(request)
        await self.ctx.sampler.refresh()
        if self.ctx.sampler.error:
            return ok({"status": "failed", "reason": f"Virtual host '/' is down: {self.ctx.sampler.error}",
                       "virtual-hosts": [VHOST]}, 503)
        return ok({"status": "ok"})

    def routes(self) -> list[Route]:
        V = "{vhost}"
        r = Route
        return [
            r("/api/overview", self.overview),
            r("/api/whoami", self.whoami),
            r("/api/extensions", self.extensions),
            r("/api/nodes", self.nodes),
            r("/api/nodes/{node}", self.node),
            r("/api/cluster-name", self.cluster_name, methods=["GET"]),
            r("/api/healthchecks/node", self.healthcheck_node),
            r("/api/healthchecks/node/{node}", self.healthcheck_node),
            r(f"/api/aliveness-test/{V}", self.aliveness),
            r("/api/health/checks/alarms", self.check_alarms),
            r("/api/health/checks/local-alarms", self.check_alarms),
            r("/api/health/checks/port-listener/{port}", self.check_port),
            r("/api/health/checks/virtual-hosts", self.check_vhosts),
        ]


def routes(ctx: Context) -> list[Route]:
    return Overview(ctx).routes()
