"""The management app routes every RabbitMQ HTTP API path Shoal serves, with each method, whichever
module under management/routes/ holds its handler."""

from __future__ import annotations

from starlette.routing import Match

from management.app import Context, api_routes
from management.auth import Users
from management.shapes import Node
from management.stats import Sampler

# (method, a concrete path) for every path of RabbitMQ 3.10's API that Shoal serves.
DOCUMENTED = [
    *[("GET", p) for p in (
        "/api/overview", "/api/whoami", "/api/extensions", "/api/nodes", "/api/nodes/shoal@h",
        "/api/vhosts", "/api/vhosts/%2F", "/api/vhosts/%2F/permissions", "/api/vhosts/%2F/connections",
        "/api/vhosts/%2F/channels", "/api/users", "/api/users/u", "/api/users/u/permissions",
        "/api/permissions", "/api/permissions/%2F/u", "/api/queues", "/api/queues/%2F",
        "/api/queues/%2F/q", "/api/queues/%2F/q/bindings", "/api/exchanges", "/api/exchanges/%2F",
        "/api/exchanges/%2F/x", "/api/exchanges/%2F/x/bindings/source",
        "/api/exchanges/%2F/x/bindings/destination", "/api/bindings", "/api/bindings/%2F",
        "/api/bindings/%2F/e/x/q/q", "/api/bindings/%2F/e/x/q/q/k", "/api/connections",
        "/api/connections/c", "/api/connections/c/channels", "/api/channels", "/api/channels/c",
        "/api/consumers", "/api/consumers/%2F", "/api/definitions", "/api/definitions/%2F",
        "/api/aliveness-test/%2F", "/api/health/checks/alarms", "/api/health/checks/local-alarms",
        "/api/health/checks/port-listener/5672", "/api/health/checks/virtual-hosts",
        "/api/policies", "/api/policies/%2F", "/api/operator-policies", "/api/parameters",
        "/api/global-parameters", "/api/vhost-limits", "/api/topic-permissions", "/api/feature-flags")],
    ("PUT", "/api/users/u"), ("DELETE", "/api/users/u"),
    ("PUT", "/api/queues/%2F/q"), ("DELETE", "/api/queues/%2F/q"),
    ("DELETE", "/api/queues/%2F/q/contents"), ("POST", "/api/queues/%2F/q/get"),
    ("PUT", "/api/exchanges/%2F/x"), ("DELETE", "/api/exchanges/%2F/x"),
    ("POST", "/api/exchanges/%2F/x/publish"),
    ("POST", "/api/bindings/%2F/e/x/q/q"), ("DELETE", "/api/bindings/%2F/e/x/q/q/k"),
    ("DELETE", "/api/connections/c"),
    ("POST", "/api/definitions"), ("POST", "/api/definitions/%2F"),
    *[("GET", p) for p in (  # shovels (issue 39)
        "/api/parameters/shovel", "/api/parameters/shovel/%2F", "/api/parameters/shovel/%2F/s",
        "/api/shovels", "/api/shovels/%2F", "/api/shovels/vhost/%2F/s")],
    ("PUT", "/api/parameters/shovel/%2F/s"), ("DELETE", "/api/parameters/shovel/%2F/s"),
    *[("GET", p) for p in (  # limits (issue 37)
        "/api/vhost-limits/%2F", "/api/user-limits", "/api/user-limits/u")],
    ("PUT", "/api/vhost-limits/%2F/max-queues"), ("DELETE", "/api/vhost-limits/%2F/max-queues"),
    ("PUT", "/api/user-limits/u/max-channels"), ("DELETE", "/api/user-limits/u/max-channels"),
]


def test_every_documented_path_is_routed() -> None:
    """Each (method, path) of the API has a route that fully matches it."""
    ctx = Context(Sampler("/nonexistent/control.sock"), Node("shoal@test", "127.0.0.1", 5672, 15672, "0"),
                  Users({}), "/nonexistent/control.sock", "127.0.0.1", 5672)
    routes = api_routes(ctx)
    missing = [(method, path) for method, path in DOCUMENTED
               if not any(r.matches({"type": "http", "path": path, "method": method})[0] == Match.FULL
                          for r in routes)]
    assert missing == []
