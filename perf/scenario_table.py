"""The scenarios S1-S8 (what each runs: publishers, queues, consumers, bodies, rates) and the
options of a run (``python -m perf``'s flags)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    kind: str = "throughput"  # throughput | latency | memory
    body_size: int = 128
    publishers: int = 1
    queues: int = 1
    consumers_per_queue: int = 1
    fanout: bool = False
    prefetch: int = 100
    ack_every: int = 50
    rate: float = 0.0  # msg/s per publisher; 0 = as fast as the window allows
    count: int = 1_000_000  # per publisher
    quick_count: int = 20_000

    @property
    def consumers(self) -> int:
        return self.queues * self.consumers_per_queue


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in [
        Scenario("S1", "1 publisher -> 1 queue -> 1 consumer"),
        Scenario("S2", "4 publishers -> 4 queues -> 4 consumers", publishers=4, queues=4, count=500_000,
                 quick_count=5_000),
        Scenario("S3", "1 publisher -> 1 queue -> 8 competing consumers, prefetch 10", consumers_per_queue=8,
                 prefetch=10, ack_every=5),
        Scenario("S4", "1 publisher -> fanout -> 8 queues -> 8 consumers", queues=8, fanout=True, count=500_000,
                 quick_count=5_000),
        Scenario("S5", "S1 with 4 KiB bodies", body_size=4096, count=500_000, quick_count=10_000),
        Scenario("S6", "S1 with 256 KiB bodies", body_size=256 * 1024, count=20_000, quick_count=500),
        Scenario("S7", "latency at a fixed 1,000 msg/s (1 -> 1 -> 1)", kind="latency", rate=1000.0),
        Scenario("S8", "memory: idle connections; queued 128-byte messages", kind="memory"),
    ]
}  # fmt: skip


@dataclass
class Options:
    seconds: float = 10.0
    quick: bool = False
    window: int = 10_000
    confirm: bool = False
    ack_each: bool = False  # consumers send basic.ack multiple=false per delivery (pika's default)
    global_qos: bool = False  # consumers' basic.qos global=true (celery's choice against RabbitMQ)
    sample_interval: float = 0.5
    s8_messages: int = 1_000_000
    s8_connections: int = 1_000
    s8_seconds: float = 180.0
    s8_drain: bool = False  # then consume every queued message, watching memory (issue 11)
    progress: bool = True
