"""RabbitMQ's ``message_stats`` made from two snapshots' counters (management.shapes). Pure."""

from __future__ import annotations

from typing import Any

from management import shapes
from management.stats import Sample

NODE = shapes.Node("shoal@h", "127.0.0.1", 5672, 15672, "0.1.0")


def snapshot(t: float, scale: int) -> dict[str, Any]:
    """A queue and an exchange whose counters grow with ``scale``."""
    n = scale
    return {
        "time": t, "vhost": "/",
        "queues": [["q", True, False, None, {}, 0, n, 1, 10 * n,
                    4 * n, n, 2 * n, 0, n, 3 * n, 0]],
        "exchanges": [["x", "direct", True, False, False, {}, 10 * n, 20 * n]],
        "bindings": [], "consumers": [], "channels": [],
        "messages": {"publish": 10 * n, "publish_confirm": 0, "routed": 10 * n,
                     "return_unroutable": n, "drop_unroutable": 0, "confirm": 5 * n,
                     "deliver": 4 * n, "deliver_no_ack": n, "get": 2 * n, "get_no_ack": 0,
                     "redeliver": n, "ack": 3 * n, "get_empty": 0},
    }


def test_queue_exchange_and_broker_counters_with_rates() -> None:
    old, new = Sample.of(snapshot(100.0, 1), []), Sample.of(snapshot(102.0, 3), [])
    (q,) = shapes.queue_items(new, old, NODE)
    stats = q["message_stats"]
    assert (stats["publish"], stats["deliver"], stats["deliver_no_ack"], stats["get"]) == (30, 12, 3, 6)
    assert (stats["redeliver"], stats["ack"], stats["deliver_get"]) == (3, 9, 21)
    assert stats["deliver_details"] == {"rate": 4.0} and stats["ack_details"] == {"rate": 3.0}
    assert stats["deliver_get_details"] == {"rate": 7.0}
    (x,) = shapes.exchange_items(new, NODE, old)
    assert x["message_stats"] == {"publish_in": 30, "publish_in_details": {"rate": 10.0},
                                  "publish_out": 60, "publish_out_details": {"rate": 20.0}}
    overview = shapes.message_stats(new, old)
    assert overview["publish"] == 30 and overview["publish_details"] == {"rate": 10.0}
    assert overview["confirm"] == 15 and overview["confirm_details"] == {"rate": 5.0}
    assert overview["return_unroutable"] == 3 and overview["deliver_get"] == 21
    assert "routed" not in overview  # Prometheus's, not the management API's
    first = shapes.message_stats(new, None)
    assert first["ack"] == 9 and first["ack_details"] == {"rate": 0.0}


def test_a_snapshot_without_counters_still_reads() -> None:
    """An older supervisor's rows (nine queue columns, six exchange columns, no totals)."""
    snap = {"time": 1.0, "vhost": "/", "queues": [["q", True, False, None, {}, 1, 0, 0, 7]],
            "exchanges": [["x", "fanout", True, False, False, {}]], "bindings": [],
            "consumers": [], "channels": []}
    s = Sample.of(snap, [])
    (q,) = shapes.queue_items(s, None, NODE)
    assert q["message_stats"]["publish"] == 7 and q["message_stats"]["deliver"] == 0
    (x,) = shapes.exchange_items(s, NODE)
    assert x["message_stats"]["publish_in"] == 0
    assert shapes.message_stats(s, None)["publish"] == 7
