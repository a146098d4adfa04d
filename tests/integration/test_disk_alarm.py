"""RabbitMQ's disk alarm: while the data directory's file system has less free space than
--disk-free-limit, publishing connections get connection.blocked, reason 'low on disk'."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import finish, start_broker


@pytest.mark.deadline(60)
def test_a_data_dir_below_the_disk_free_limit_blocks_publishers_low_on_disk(tmp_path: Path) -> None:
    """RabbitMQ's disk alarm: connection.blocked, reason 'low on disk', to publishing connections."""
    broker = start_broker(tmp_path / "b", extra_args=["--disk-free-limit", "1000000000GB"])
    try:
        connection = broker.connect()
        reasons: list[str] = []
        connection.add_on_connection_blocked_callback(
            lambda _connection, blocked: reasons.append(blocked.method.reason))
        channel = connection.channel()
        channel.queue_declare("q")
        channel.basic_publish("", "q", b"x")
        for _ in range(100):  # bounded: 10 s
            connection.process_data_events(time_limit=0.1)
            if reasons:
                break
        assert reasons == ["low on disk"]
        assert "disk alarm set" in broker.log_tail()
    finally:
        finish(broker)
