"""RabbitMQ's default_vhost and default_permissions in a supervisor without a data directory
(with one: tests/integration/test_config_file.py): a real supervisor's setup, no workers."""

from __future__ import annotations

import pytest

from broker.runtime.supervisor import ServeConfig, Supervisor


@pytest.mark.parametrize(("given", "vhost", "permissions"), [
    ({}, "/", (".*", ".*", ".*")),
    ({"default_vhost": "app", "default_permissions": ("^c", "^w", "^r")}, "app", ("^c", "^w", "^r")),
])
def test_without_a_data_directory_the_broker_starts_with_its_default_vhost(
        given: dict[str, object], vhost: str, permissions: tuple[str, str, str]) -> None:
    """default_vhost: that vhost in the place of "/" (which is not made), and the default
    user's default_permissions on it (by default "/" and full permissions)."""
    sup = Supervisor(ServeConfig(port=0, workers=1, arena_mb=4, ring_kb=64, **given))  # type: ignore[arg-type]
    sup.setup()
    try:
        assert list(sup.dispatcher.vhosts.by_name) == [vhost]
        assert sup.permissions == {"guest": {vhost: permissions}}
    finally:
        sup.cleanup()
