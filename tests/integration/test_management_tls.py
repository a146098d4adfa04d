"""The management API over TLS (issue 37): `shoal serve --management-tls-port` with the AMQPS
certificate and key, beside the plain --management-port.

Certificates are made at test time with the `openssl` command line (tests.integration.certs).
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.certs import server_cert
from tests.integration.harness import HOST, REPO_ROOT, Broker, finish, start_broker

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server_cert(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    instance = start_broker(tmp_path_factory.mktemp("mgmt-tls"), extra_args=[
        "--management-port", str(_free_port()), "--management-tls-port", str(_free_port()),
        "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
        "--tls-ca", str(certs / "ca.pem")])
    try:
        yield instance
    finally:
        finish(instance)


def _ports(broker: Broker) -> tuple[int, int]:
    info = json.loads(broker.ready_file.read_text())
    return int(info["management_port"]), int(info["management_tls_port"])


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, object]:
    req = urllib.request.Request(url, headers={"Authorization": AUTH})
    with urllib.request.urlopen(req, timeout=30, context=context) as resp:
        return resp.status, json.loads(resp.read())


def test_overview_over_https_trusting_the_ca(broker: Broker, certs: Path) -> None:
    _, tls_port = _ports(broker)
    assert tls_port
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    status, body = _get(f"https://127.0.0.1:{tls_port}/api/overview", context)
    assert status == 200
    assert isinstance(body, dict) and "rabbitmq_version" in body
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.2 is taken too
    assert _get(f"https://localhost:{tls_port}/api/whoami", context)[0] == 200


def test_an_untrusted_client_refuses_the_certificate(broker: Broker) -> None:
    _, tls_port = _ports(broker)
    with pytest.raises(urllib.error.URLError):
        _get(f"https://127.0.0.1:{tls_port}/api/overview", ssl.create_default_context())


def test_plain_http_on_the_tls_port_fails(broker: Broker) -> None:
    _, tls_port = _ports(broker)
    with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
        _get(f"http://127.0.0.1:{tls_port}/api/overview")


def test_the_plain_port_keeps_working(broker: Broker) -> None:
    port, _ = _ports(broker)
    status, body = _get(f"http://127.0.0.1:{port}/api/overview")
    assert status == 200 and isinstance(body, dict)


def test_no_certificate_stops_serve_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0", "--management-port",
         str(_free_port()), "--management-tls-port", str(_free_port()), "--prometheus-port", "0",
         "--data-dir", str(tmp_path / "data"), "--log-level", "error",
         "--control-socket", str(tmp_path / "c.sock"), "--workers", "1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "cannot start: TLS: --management-tls-port needs --tls-cert and --tls-key" in lines[0]
