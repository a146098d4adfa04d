"""A broker with its management API on, and a small HTTP client for it (urllib: no extra)."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import HOST, Broker, finish, start_broker, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


class HTTP:
    """Requests to one management API as one user; answers (status, headers, parsed JSON)."""

    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.base = f"http://{HOST}:{port}"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                status, hdrs = resp.status, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            status, hdrs = exc.code, dict(exc.headers)
        return status, hdrs, json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        status, _, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body


def start_with_management(directory: Path) -> tuple[Broker, int]:
    port = free_port()
    broker = start_broker(directory, extra_args=["--management-port", str(port)])
    http = HTTP(port)

    def up() -> bool:
        try:
            return http.request("GET", "/api/overview")[0] == 200
        except OSError:
            return False

    wait_until(up, 30.0, "the management API answers")
    return broker, port


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, int]]:
    broker, port = start_with_management(tmp_path_factory.mktemp("managed"))
    try:
        yield broker, port
    finally:
        finish(broker)
