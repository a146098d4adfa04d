"""The management process reads each snapshot row's vhost (broker.runtime.snapshot): two
vhosts' queues of one name stay two objects in the API's shapes, the rates and the Prometheus
series."""

from __future__ import annotations

from typing import Any

from management import shapes
from management.prometheus import ShoalCollector
from management.stats import Sample, Sampler

NODE = shapes.Node("shoal@h", "127.0.0.1", 5672, 15672, "0.1.0")
COUNTS = [0] * 7  # deliver ... get_empty


def _sample(t: float, ready_a: int, ready_b: int) -> Sample:
    def queue(vhost: str, ready: int) -> list[Any]:
        return ["q", True, False, None, {}, ready, 0, 0, ready, *COUNTS, vhost]

    snapshot = {"time": t, "vhost": "/", "queues": [queue("a", ready_a), queue("b", ready_b)],
                "exchanges": [["", "direct", True, False, False, {}, 0, 0, "a"],
                              ["", "direct", True, False, False, {}, 0, 0, "b"]],
                "bindings": [["amq.fanout", "q", "queue", "", {}, "b"]],
                "consumers": [], "channels": [],
                "vhosts": [{"name": "a"}, {"name": "b"}]}
    return Sample.of(snapshot, [])


def test_queues_of_one_name_in_two_vhosts_keep_their_own_counts_and_rates() -> None:
    """Each queue item names its vhost; its rate is its own queue's difference."""
    old, new = _sample(100.0, 0, 10), _sample(105.0, 5, 10)
    items = {q["vhost"]: q for q in shapes.queue_items(new, old, NODE)}
    assert (items["a"]["messages"], items["b"]["messages"]) == (5, 10)
    assert items["a"]["messages_details"] == {"rate": 1.0}
    assert items["b"]["messages_details"] == {"rate": 0.0}
    bindings = shapes.binding_items(new)
    assert {(b["vhost"], b["source"]) for b in bindings} == {("a", ""), ("b", ""), ("b", "amq.fanout")}
    assert {x["vhost"] for x in shapes.exchange_items(new, NODE)} == {"a", "b"}


def test_prometheus_per_object_series_carry_each_queues_vhost() -> None:
    """rabbitmq_queue_messages_ready{vhost, queue}: one series per vhost's queue."""
    sampler = Sampler("/nonexistent")
    sampler.latest = _sample(100.0, 3, 4)
    ready = next(m for m in ShoalCollector(sampler, NODE, True, lambda _: []).collect()
                 if m.name == "rabbitmq_queue_messages_ready")
    assert sorted((s.labels["vhost"], s.labels["queue"], s.value) for s in ready.samples) == [
        ("a", "q", 3), ("b", "q", 4)]
