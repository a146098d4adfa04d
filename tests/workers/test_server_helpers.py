"""The worker runtime's pure helpers: which peers count as loopback (RabbitMQ's loopback_users)."""

from __future__ import annotations

import pytest

from workers.server import _is_loopback


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("192.0.2.2", False), ("10.0.0.1", False), ("fd00::2", False), ("::ffff:10.0.0.1", False),
    ("", False), ("not-an-address", False),
])
def test_loopback_peers(host: str, loopback: bool) -> None:
    assert _is_loopback(host) is loopback
