"""What every management route module shares: the :class:`Context`, errors as RabbitMQ writes
them, request and response helpers, and :class:`Resource` (login, the latest sample, an AMQP
connection as the HTTP user).

Names in paths are percent-encoded (``%2F`` is the vhost ``/``); a raw ``:`` is taken too.
The router matches the undecoded path (``raw_path``, see :class:`RawPath`), so an encoded ``/``
stays inside its segment, and each handler decodes its segments with :func:`seg`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from management import amqp_ops, listing, shapes
from management.auth import Users
from management.stats import Sampler, ask

VHOST = "/"
EXCHANGE_TYPES = [{"name": n, "description": d, "enabled": True}
                  for n, d in shapes.EXCHANGE_DESCRIPTIONS.items()]


class APIError(Exception):
    def __init__(self, status: int, error: str, reason: str | list[str]) -> None:
        super().__init__(str(reason))
        self.status = status
        self.error = error
        self.reason = reason


def not_found() -> APIError:
    return APIError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> APIError:
    return APIError(400, "bad_request", reason)


@dataclass
class Context:
    """What every handler reads: the sampler, the node, the users, where the broker is."""

    sampler: Sampler
    node: shapes.Node
    users: Users
    control_path: str
    amqp_host: str
    amqp_port: int
    data_dir: str = ""
    started: float = field(default_factory=time.time)


# ----------------------------------------------------------------------------- helpers

class RawPath:
    """ASGI middleware: route on the undecoded path (``%2F`` stays in its segment)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("raw_path"):
            raw = scope["raw_path"].decode("latin-1").split("?", 1)[0]
            scope = dict(scope, path=raw)
        await self.app(scope, receive, send)


def seg(request: Request, name: str) -> str:
    return unquote(request.path_params[name])


def ok(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status)


def no_content(status: int = 204) -> Response:
    return Response(status_code=status)


def check_vhost(vhost: str) -> None:
    """Only "/": routes use :meth:`Resource.vhost_param`, which knows the live vhosts."""
    if vhost != VHOST:
        raise not_found()


def vhost_names(sample: Any) -> set[str]:
    """The vhosts a sample's snapshot lists (broker.runtime.snapshot)."""
    return {str(v["name"]) for v in sample.snapshot.get("vhosts") or [{"name": VHOST}]}


def params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


def in_vhost(items: list[dict[str, Any]], vhost: str | None,
             where: Callable[[dict[str, Any]], str] = lambda item: str(item["vhost"]),
             ) -> list[dict[str, Any]]:
    """The items of ``vhost`` (``where`` reads an item's), all of them for None."""
    return items if vhost is None else [item for item in items if where(item) == vhost]


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The item called ``name``: 404 when there is none."""
    for item in items:
        if item["name"] == name:
            return item
    raise not_found()


def paged(request: Request, items: list[dict[str, Any]], default_sort: str | None = "name") -> Response:
    try:
        return ok(listing.apply(items, params(request), default_sort))
    except listing.BadRequest as exc:
        raise bad_request(str(exc)) from None


async def body_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise bad_request("body is not JSON") from None
    if not isinstance(value, dict):
        raise bad_request("body must be a JSON object")
    return value


def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    return listing.truthy(body[key]) if key in body else default


def exchange_name(name: str) -> str:
    return "" if name == shapes.DEFAULT_EXCHANGE_PATH else name


AMQP_STATUS = {404: (404, "not_found"), 403: (401, "not_authorised"), 530: (401, "not_authorised"),
               406: (400, "bad_request"), 405: (400, "bad_request"), 402: (400, "bad_request"),
               504: (400, "bad_request")}


def amqp_error(exc: amqp_ops.AMQPFailure) -> APIError:
    status, error = AMQP_STATUS.get(exc.code, (500, "internal_server_error"))
    reason = exc.text.split(" - ", 1)[1] if " - " in exc.text else exc.text
    if status == 404:
        return APIError(404, "Object Not Found", reason)
    return APIError(status, error, reason)


Handler = Callable[[Request], Awaitable[Response]]


class Resource:
    """A group of handlers over one :class:`Context`, as RabbitMQ's ``rabbit_mgmt_wm_*``
    modules are one per resource; ``routes()`` names its paths."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def auth(self, request: Request) -> tuple[str, str]:
        client = request.client.host if request.client else None
        who = self.ctx.users.check(request.headers.get("authorization"), client)
        if who is None:
            raise APIError(401, "not_authorised", "Login failed")
        return who

    async def sample(self) -> Any:
        return await self.ctx.sampler.refresh()

    async def vhost_param(self, request: Request) -> str:
        """The path's ``{vhost}``, which must exist (404 otherwise): the sample's vhosts, and a
        fresh sample's before a name it lacks is refused (one made by shoal ctl just now)."""
        name = seg(request, "vhost")
        if name in vhost_names(await self.sample()):
            return name
        if name in vhost_names(await self.ctx.sampler.refresh(force=True)):
            return name
        raise not_found()

    async def vhost_scope(self, request: Request) -> str | None:
        """A listing's vhost: the path's ``{vhost}`` (404 when it does not exist), or None
        under the path without one (every vhost)."""
        return await self.vhost_param(request) if "vhost" in request.path_params else None

    async def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A control command to the supervisor: 503 when it does not answer, 404 for what is
        missing, 400 for what it refuses."""
        try:
            answer = await ask(self.ctx.control_path, request)
        except (OSError, ValueError) as exc:
            raise APIError(503, "service_unavailable", f"the broker does not answer: {exc}") from None
        if "error" in answer:
            if answer.get("code") == "missing":
                raise not_found()
            raise bad_request(str(answer["error"]))
        return answer

    async def amqp(self, request: Request, op: Callable[[amqp_ops.Client], Awaitable[Any]],
                   vhost: str = VHOST) -> Any:
        """``op`` on an AMQP connection to ``vhost`` as the HTTP request's user."""
        user, password = self.auth(request)
        try:
            async with amqp_ops.connect(self.ctx.amqp_host, self.ctx.amqp_port, user, password,
                                        vhost) as client:
                return await op(client)
        except amqp_ops.AMQPFailure as exc:
            raise amqp_error(exc) from None
        except OSError as exc:
            raise APIError(503, "service_unavailable", f"the broker does not answer: {exc}") from None
        finally:
            self.ctx.sampler.stale()

    def auth_admin(self, request: Request) -> tuple[str, str]:
        """As ``auth``, and the user must be tagged administrator (RabbitMQ: 403 otherwise)."""
        who = self.auth(request)
        if not self.ctx.users.is_admin(who[0]):
            raise APIError(403, "not_authorised", "Not administrator user")
        return who

