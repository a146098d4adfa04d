"""Federation links: /api/federation-links (rabbitmq_federation_management). The links run in the
links process; the supervisor keeps the last status row each reported (control command
``federation_status``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from management.http import Context, Resource, check_vhost, paged, seg


class FederationLinks(Resource):
    async def listing(self, request: Request) -> Response:
        self.auth(request)
        rows = list((await self.control({"command": "federation_status"}))["links"])
        for row in rows:
            row["node"] = self.ctx.node.name
        if "vhost" in request.path_params:
            check_vhost(seg(request, "vhost"))
            rows = [r for r in rows if r["vhost"] == seg(request, "vhost")]
        return paged(request, rows, None)

    def routes(self) -> list[Route]:
        return [Route("/api/federation-links", self.listing, methods=["GET"]),
                Route("/api/federation-links/{vhost}", self.listing, methods=["GET"])]


def routes(ctx: Context) -> list[Route]:
    return FederationLinks(ctx).routes()
