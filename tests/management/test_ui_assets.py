"""The web UI's static files (management/ui/), served by the management app with no broker: every
asset the page names is there, nothing is fetched from another host, the app calls only /api/."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import trio

from management.app import Context, make_app
from management.auth import Users
from management.shapes import Node
from management.stats import Sampler
from management.webui import UI_DIR

# An XML namespace name (SVG's), written in the SVG file and in createElementNS: never fetched.
NAMESPACES = {"http://www.w3.org/2000/svg"}
TYPES = {".html": "text/html", ".js": "javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def app() -> Any:
    ctx = Context(Sampler("/nonexistent/control.sock"), Node("shoal@test", "127.0.0.1", 5672, 15672, "0"),
                  Users({}), "/nonexistent/control.sock", "127.0.0.1", 5672)
    return make_app(ctx)


async def get(path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET through the ASGI app, as hypercorn would make it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"localhost:15672")],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 15672)}
    sent: list[dict[str, Any]] = []
    asked: list[bool] = []
    done = trio.Event()

    async def receive() -> dict[str, Any]:
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()  # the client stays until the whole response is sent
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app()(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body


class Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("#"):
                self.refs.append(value)


async def test_the_page_and_every_asset_it_names_are_served() -> None:
    status, headers, body = await get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    parser = Refs()
    parser.feed(body.decode())
    assert len(parser.refs) >= 4, parser.refs  # the icon, the stylesheet, the two scripts
    for ref in parser.refs:
        url = urlsplit(urljoin("http://localhost:15672/", ref))
        assert url.netloc == "localhost:15672", f"{ref} is not served by the broker"
        status, headers, body = await get(url.path)
        assert status == 200 and body, (ref, status)
        assert TYPES[Path(url.path).suffix] in headers["content-type"], (ref, headers["content-type"])
    assert (await get("/index.html"))[0] == 200


async def test_every_file_under_ui_is_served_at_its_path() -> None:
    files = sorted(p for p in UI_DIR.rglob("*") if p.is_file())
    assert {p.suffix for p in files} == set(TYPES)
    for path in files:
        rel = path.relative_to(UI_DIR).as_posix()
        status, _, body = await get("/" if rel == "index.html" else f"/{rel}")
        assert status == 200 and body == path.read_bytes(), rel
    assert (await get("/js/no-such-file.js"))[0] == 404


def test_no_asset_names_another_host() -> None:
    for path in UI_DIR.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text()
        urls = set(re.findall(r"""https?://[^\s"'`)<>]+""", text)) - NAMESPACES
        assert not urls, f"{path.relative_to(UI_DIR)} names other hosts: {sorted(urls)}"
        assert not re.search(r"""(src|href)\s*=\s*["']//""", text), f"{path}: a protocol-relative URL"
        assert "@import" not in text and "url(" not in text.replace("URL.createObjectURL(", ""), \
            f"{path}: CSS that fetches"


def test_the_app_calls_only_the_api() -> None:
    """Every absolute path the scripts name is the public API's, and one function fetches."""
    fetches = 0
    for path in (UI_DIR / "js").glob("*.js"):
        text = path.read_text()
        fetches += len(re.findall(r"\bfetch\(", text))
        for literal in re.findall(r"""[`'"](/[A-Za-z][\w.-]*/[^`'"\s]*)""", text):
            assert literal.startswith("/api/"), f"{path.name} names {literal!r}"
    assert fetches == 1  # api() in main.js: the Authorization header goes on every request


async def test_the_api_still_wants_a_login() -> None:
    status, headers, _ = await get("/api/overview")
    assert status == 401 and "www-authenticate" in headers
