"""The RabbitMQ collections Shoal has none of (global parameters, feature flags):
each answers an empty list, so tools that read them work. A module that comes to serve one of these
paths takes it out of ``EMPTY``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management.http import Context, Resource, ok

EMPTY = ("/api/global-parameters", "/api/feature-flags")


class Empty(Resource):
    """Each path of ``EMPTY``, answered with ``[]``."""

    async def empty_list(self, request: Request) -> Response:
        """Global parameters, feature flags: Shoal has none."""
        self.auth(request)
        return ok([])

    def routes(self) -> list[Route]:
        return [Route(path, self.empty_list) for path in EMPTY]


def routes(ctx: Context) -> list[Route]:
    return Empty(ctx).routes()
