"""Acceptance: RabbitMQ's own ``rabbitmqadmin`` (3.10, unmodified) against Shoal's management API.

rabbitmqadmin is one Python 3 file; .ci/run takes it out of Debian's rabbitmq-server package
(apt-get download + dpkg-deb -x, best effort) and exports $SHOAL_RABBITMQADMIN. Without it on
PATH or there, these tests skip and say why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import Broker, close_quietly, wait_until
from tests.integration.management_helpers import managed

__all__ = ["managed"]


def _find() -> str | None:
    path = os.environ.get("SHOAL_RABBITMQADMIN")
    if path and Path(path).is_file():
        return path
    return shutil.which("rabbitmqadmin")


ADMIN = _find()
pytestmark = pytest.mark.skipif(
    ADMIN is None, reason="rabbitmqadmin is neither on PATH nor at $SHOAL_RABBITMQADMIN "
    "(.ci/run fetches it from Debian's rabbitmq-server package: apt-get download rabbitmq-server; "
    "dpkg-deb -x)")


def admin(port: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert ADMIN is not None
    result = subprocess.run([sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(port), *args],
                            capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def listed(port: int, kind: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(admin(port, "-f", "raw_json", "list", kind).stdout)
    return rows


def test_declare_list_publish_get_delete(managed: tuple[Broker, int]) -> None:
    _, port = managed
    admin(port, "declare", "exchange", "name=ra-x", "type=direct", "durable=false")
    admin(port, "declare", "queue", "name=ra-q", "durable=false")
    admin(port, "declare", "binding", "source=ra-x", "destination=ra-q", "routing_key=rk")
    assert "ra-q" in admin(port, "list", "queues").stdout
    assert {"name": "ra-x", "type": "direct"} in [
        {k: x[k] for k in ("name", "type")} for x in listed(port, "exchanges")]
    assert ("ra-x", "ra-q", "rk") in [(b["source"], b["destination"], b["routing_key"])
                                       for b in listed(port, "bindings")]
    out = admin(port, "publish", "exchange=ra-x", "routing_key=rk", "payload=hello").stdout
    assert "Message published" in out and "NOT routed" not in out
    assert "NOT routed" in admin(port, "publish", "exchange=ra-x", "routing_key=none",
                                 "payload=x").stdout
    got = json.loads(admin(port, "-f", "raw_json", "get", "queue=ra-q",
                           "ackmode=ack_requeue_false").stdout)
    assert got[0]["payload"] == "hello" and got[0]["routing_key"] == "rk"
    assert "object_totals.queues" in admin(port, "show", "overview").stdout
    admin(port, "purge", "queue", "name=ra-q")
    admin(port, "delete", "binding", "source=ra-x", "destination_type=queue", "destination=ra-q",
          "properties_key=rk")
    assert "ra-x" not in [b["source"] for b in listed(port, "bindings")]
    admin(port, "delete", "queue", "name=ra-q")
    admin(port, "delete", "exchange", "name=ra-x")
    assert "ra-q" not in [q["name"] for q in listed(port, "queues")]
    for kind in ("nodes", "vhosts", "users", "permissions", "channels", "consumers", "policies"):
        admin(port, "list", kind)


def test_export_and_import_definitions(managed: tuple[Broker, int], tmp_path: Path) -> None:
    _, port = managed
    admin(port, "declare", "queue", "name=ra-durable")
    admin(port, "declare", "exchange", "name=ra-fan", "type=fanout")
    admin(port, "declare", "binding", "source=ra-fan", "destination=ra-durable")
    path = tmp_path / "defs.json"
    admin(port, "export", str(path))
    defs = json.loads(path.read_text())
    assert "ra-durable" in [q["name"] for q in defs["queues"]]
    admin(port, "delete", "queue", "name=ra-durable")
    admin(port, "delete", "exchange", "name=ra-fan")
    admin(port, "import", str(path))
    assert "ra-durable" in [q["name"] for q in listed(port, "queues")]
    assert ("ra-fan", "ra-durable") in [(b["source"], b["destination"]) for b in listed(port, "bindings")]
    admin(port, "delete", "queue", "name=ra-durable")
    admin(port, "delete", "exchange", "name=ra-fan")


def test_list_and_close_connection(managed: tuple[Broker, int]) -> None:
    import pika.exceptions

    broker, port = managed
    conn = broker.connect()
    try:
        rows = wait_until(lambda: listed(port, "connections") or None, 10.0, "a connection listed")
        name = str(rows[0]["name"])
        assert name in admin(port, "list", "connections").stdout
        admin(port, "close", "connection", f"name={name}")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):
                conn.process_data_events(0.2)
        assert closed.value.reply_code == 320
    finally:
        close_quietly(conn)
