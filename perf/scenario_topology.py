"""A scenario's queues and exchange, over a plain AMQP client (perf.wire): named for the run,
declared before it, their depths asked after it, deleted at the end."""

from __future__ import annotations

import os
import time

from perf.brokers import Broker
from perf.scenario_table import Scenario
from perf.wire import Client


def scenario_names(broker: Broker, scenario: Scenario) -> tuple[str, list[str]]:
    prefix = f"perf.{os.getpid()}.{int(time.time() * 1000) % 10**9}.{scenario.key}"
    return f"{prefix}.x", [f"{prefix}.q{i}" for i in range(scenario.queues)]


def declare_topology(broker: Broker, scenario: Scenario, exchange: str, queues: list[str]) -> None:
    client = Client(broker.port)
    try:
        for queue in queues:
            client.queue_declare(queue)
        if scenario.fanout:
            client.exchange_declare(exchange, "fanout")
            for queue in queues:
                client.queue_bind(queue, exchange)
    finally:
        client.close()


def queue_depths(broker: Broker, queues: list[str]) -> list[int | None]:
    """Messages in each queue (passive queue.declare), None where that cannot be asked."""
    if not broker.alive():
        return [None] * len(queues)
    try:
        client = Client(broker.port)
    except Exception:  # noqa: BLE001 - the broker is in trouble; the run reports that already
        return [None] * len(queues)
    out: list[int | None] = []
    try:
        for queue in queues:
            try:
                out.append(client.queue_declare(queue, passive=True))
            except Exception:  # noqa: BLE001
                out.append(None)
                break
    finally:
        client.close()
    return out + [None] * (len(queues) - len(out))


def teardown(broker: Broker, scenario: Scenario, exchange: str, queues: list[str]) -> str | None:
    if not broker.alive():
        return "broker not running at teardown"
    return delete_topology(broker.port, queues, exchange if scenario.fanout else None)


def delete_topology(port: int, queues: list[str], exchange: str | None,
                    timeout: float = 10.0) -> str | None:
    """Delete a scenario's queues (and its exchange); None, or what went wrong."""
    try:
        client = Client(port, timeout=timeout)
    except Exception as exc:  # noqa: BLE001
        return f"teardown connect failed: {exc!r}"
    try:
        for queue in queues:
            client.queue_delete(queue)
        if exchange is not None:
            client.exchange_delete(exchange)
    except Exception as exc:  # noqa: BLE001
        return f"teardown failed: {exc!r}"
    finally:
        client.close()
    return None
