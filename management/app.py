"""The management HTTP API as one Starlette application: RabbitMQ 3.10's paths, shapes and errors.

Reads come from the latest sample (management.stats); writes that are AMQP operations go over
AMQP as the HTTP user (management.amqp_ops); closing a connection and changing a user are control
commands. The handlers live in ``management.routes``, a module per resource as RabbitMQ's
``rabbit_mgmt_wm_*``; what they share (the Context, errors, helpers, login) is ``management.http``.
"""

from __future__ import annotations

import socket

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from management import policy_routes, webui
from management.http import APIError, Context, RawPath
from management.routes import (
    bindings,
    connections,
    definitions,
    empty,
    exchanges,
    federation,
    limits,
    overview,
    parameters,
    permissions,
    queues,
    users,
)

__all__ = ["Context", "api_routes", "make_app", "node_name"]

# Each module's ``routes(ctx)``, in the order the router tries them: a new resource module is one
# more entry here. ``empty`` (the paths answered with []) comes last.
ROUTE_MODULES = (overview, users, queues, exchanges, bindings, connections, definitions,
                 policy_routes, parameters, federation, permissions, limits,
                 empty)


def api_routes(ctx: Context) -> list[BaseRoute]:
    return [route for module in ROUTE_MODULES for route in module.routes(ctx)]


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    response = JSONResponse({"error": exc.error, "reason": exc.reason}, status_code=exc.status)
    if exc.status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="RabbitMQ Management"'
    return response


async def http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    if status == 404:
        return JSONResponse({"error": "Object Not Found", "reason": "Not Found"}, status_code=404)
    if status == 405:
        return JSONResponse({"error": "Method Not Allowed", "reason": "Method Not Allowed"},
                            status_code=405)
    return JSONResponse({"error": "bad_request", "reason": str(getattr(exc, "detail", exc))},
                        status_code=status)


def make_app(ctx: Context) -> ASGIApp:
    """The API as an ASGI application (hypercorn serves it in management.process)."""
    app = Starlette(routes=[*api_routes(ctx), *webui.routes()], exception_handlers={
        APIError: api_error, HTTPException: http_error})
    return RawPath(app)


def node_name() -> str:
    return f"shoal@{socket.gethostname().split('.')[0]}"
