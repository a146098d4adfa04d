"""The traffic of the traced-broker tests (tests/integration/test_traced_broker.py, and the
report's end to end, tests/report/test_end_to_end.py): a broker with --trace, one pika client
publishing with confirms, then consuming, rejecting the first few and acking the rest."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import finish, start_broker

MESSAGES = 300
REJECTED = 20


def run_traced_broker(directory: Path, trace: Path) -> None:
    """MESSAGES confirmed publishes to queue "traced" of a broker tracing into ``trace``, every
    one delivered, the first REJECTED rejected (requeue=false), the rest acked; the broker is
    stopped (SIGTERM: every process flushes and closes its trace files)."""
    broker = start_broker(directory, extra_args=["--trace", str(trace)])
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare("traced")
        channel.confirm_delivery()
        for i in range(MESSAGES):
            channel.basic_publish("", "traced", str(i).encode())
        channel.basic_qos(prefetch_count=50)
        received = 0
        for method, _, _ in channel.consume("traced", inactivity_timeout=5):
            assert method is not None, f"only {received} of {MESSAGES} messages arrived"
            received += 1
            if received <= REJECTED:
                channel.basic_reject(method.delivery_tag, requeue=False)
            else:
                channel.basic_ack(method.delivery_tag)
            if received == MESSAGES:
                break
        channel.cancel()
        connection.close()
    finally:
        finish(broker)
