"""The web UI's static files (management/ui/: HTML, CSS, JS written for Shoal, no framework),
served at RabbitMQ's paths: ``/`` (and ``/index.html``), ``/js/…``, ``/css/…``, ``/img/…``.

The page is a small single-page app that reads and writes only the public API (``/api/…``)
with HTTP basic auth from its login form, so serving it needs no login: the files hold no data.
"""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

UI_DIR = Path(__file__).resolve().parent / "ui"
ASSET_DIRS = ("js", "css", "img")
# The browser asks again (a 304 when unchanged), so a broker upgrade is seen on the next load.
NO_CACHE = {"Cache-Control": "no-cache"}


class _Static(StaticFiles):
    def file_response(self, full_path: PathLike[str] | str, stat_result: os.stat_result, scope: Scope,
                      status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(NO_CACHE)
        return response


async def index(request: Request) -> Response:
    return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=NO_CACHE)


def routes() -> list[BaseRoute]:
    return [Route("/", index, methods=["GET", "HEAD"]),
            Route("/index.html", index, methods=["GET", "HEAD"]),
            *[Mount(f"/{d}", app=_Static(directory=UI_DIR / d), name=f"ui-{d}") for d in ASSET_DIRS]]
