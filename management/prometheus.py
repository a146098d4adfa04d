"""Prometheus: ``/metrics`` and ``/metrics/per-object`` as RabbitMQ's rabbitmq_prometheus serves them.

Names, types, labels and help texts are the plugin's (its core, global, alarm collectors), so
RabbitMQ's Grafana dashboards (RabbitMQ-Overview, grafana.com 10991) read Shoal unchanged: every
query joins on ``rabbitmq_identity_info`` (``rabbitmq_node``, ``rabbitmq_cluster``,
``rabbitmq_endpoint``). ``/metrics`` is aggregated (no per-queue series: one sample per metric);
``/metrics/per-object`` adds a series per queue (``vhost``, ``queue``) and per exchange.

Values come from the latest sample (management.stats: the supervisor's ``snapshot`` and the
connections' list), refreshed before a scrape when older than its ``fresh`` seconds, as an API
read is; a scrape never reaches the supervisor more often than that. ``prometheus_client``
writes the exposition (text format 0.0.4, RabbitMQ's) from a custom collector: nothing is
registered per object, nothing kept between scrapes.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import psutil
import trio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from management.stats import QUEUE_COUNTERS, Sample, Sampler, row_vhost, split_object_key

PROTOCOL = {"protocol": "amqp091"}
QUEUE_TYPE = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}

# rabbit_global_counters: (metric, the broker's counter(s) it sums, labels, help).
GLOBAL_COUNTERS: list[tuple[str, tuple[str, ...], dict[str, str], str]] = [
    ("rabbitmq_global_messages_received_total", ("publish",), PROTOCOL,
     "Total number of messages received from publishers"),
    ("rabbitmq_global_messages_received_confirm_total", ("publish_confirm",), PROTOCOL,
     "Total number of messages received from publishers expecting confirmations"),
    ("rabbitmq_global_messages_routed_total", ("routed",), PROTOCOL,
     "Total number of messages routed to queues or streams"),
    ("rabbitmq_global_messages_unroutable_dropped_total", ("drop_unroutable",), PROTOCOL,
     "Total number of messages published as non-mandatory into an exchange and dropped as "
     "unroutable"),
    ("rabbitmq_global_messages_unroutable_returned_total", ("return_unroutable",), PROTOCOL,
     "Total number of messages published as mandatory into an exchange and returned to the "
     "publisher as unroutable"),
    ("rabbitmq_global_messages_confirmed_total", ("confirm",), PROTOCOL,
     "Total number of messages confirmed to publishers"),
    ("rabbitmq_global_messages_delivered_total", ("deliver", "deliver_no_ack", "get", "get_no_ack"),
     QUEUE_TYPE, "Total number of messages delivered to consumers"),
    ("rabbitmq_global_messages_delivered_consume_manual_ack_total", ("deliver",), QUEUE_TYPE,
     "Total number of messages delivered to consumers using basic.consume with manual "
     "acknowledgment"),
    ("rabbitmq_global_messages_delivered_consume_auto_ack_total", ("deliver_no_ack",), QUEUE_TYPE,
     "Total number of messages delivered to consumers using basic.consume with automatic "
     "acknowledgment"),
    ("rabbitmq_global_messages_delivered_get_manual_ack_total", ("get",), QUEUE_TYPE,
     "Total number of messages delivered to consumers using basic.get with manual acknowledgment"),
    ("rabbitmq_global_messages_delivered_get_auto_ack_total", ("get_no_ack",), QUEUE_TYPE,
     "Total number of messages delivered to consumers using basic.get with automatic "
     "acknowledgment"),
    ("rabbitmq_global_messages_get_empty_total", ("get_empty",), QUEUE_TYPE,
     "Total number of times basic.get operations fetched no message"),
    ("rabbitmq_global_messages_redelivered_total", ("redeliver",), QUEUE_TYPE,
     "Total number of messages redelivered to consumers"),
    ("rabbitmq_global_messages_acknowledged_total", ("ack",), QUEUE_TYPE,
     "Total number of messages acknowledged by consumers"),
]
# A queue's depth (queue_coarse_metrics): metric, the sample's column, help.
QUEUE_GAUGES = [
    ("rabbitmq_queue_messages_ready", 1, "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", 2, "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", 0, "Sum of ready and unacknowledged messages - total queue depth"),
]
# A queue's counters (queue_delivery_metrics, per object only): metric, counter, help.
QUEUE_COUNTER_METRICS = [
    ("rabbitmq_queue_get_ack_total", "get",
     "Total number of messages fetched from a queue with basic.get in manual acknowledgement mode"),
    ("rabbitmq_queue_get_total", "get_no_ack",
     "Total number of messages fetched from a queue with basic.get in automatic "
     "acknowledgement mode"),
    ("rabbitmq_queue_messages_delivered_ack_total", "deliver",
     "Total number of messages delivered from a queue to consumers in manual acknowledgement mode"),
    ("rabbitmq_queue_messages_delivered_total", "deliver_no_ack",
     "Total number of messages delivered from a queue to consumers in automatic "
     "acknowledgement mode"),
    ("rabbitmq_queue_messages_redelivered_total", "redeliver",
     "Total number of messages redelivered from a queue to consumers"),
    ("rabbitmq_queue_messages_acked_total", "ack",
     "Total number of messages acknowledged by consumers on a queue"),
    ("rabbitmq_queue_get_empty_total", "get_empty",
     "Total number of times basic.get operations fetched no message on a queue"),
]


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "0.0.0"


@dataclass
class Node:
    """What the metrics say about this broker: names, versions, where its data lives."""

    name: str  # rabbitmq_node (shoal@HOST)
    cluster: str  # rabbitmq_cluster
    version: str
    data_dir: str = ""
    broker_pid: int = field(default_factory=os.getppid)  # the supervisor


def broker_processes(pid: int) -> list[psutil.Process]:
    """The supervisor and every process it started (workers, this one)."""
    parent = psutil.Process(pid)
    return [parent, *parent.children(recursive=True)]


class ShoalCollector(Collector):
    """Turns the sampler's latest sample into RabbitMQ's metric families, at each scrape."""

    def __init__(self, sampler: Sampler, node: Node, per_object: bool,
                 processes: Callable[[int], list[psutil.Process]] = broker_processes) -> None:
        self.sampler = sampler
        self.node = node
        self.per_object = per_object
        self.processes = processes

    def collect(self) -> Iterator[Metric]:
        s = self.sampler.latest
        yield from self._totals(s)
        yield from self._queues(s)
        if self.per_object:
            yield from self._exchanges(s)
        yield from self._global(s)
        yield from self._process(s)
        yield from self._alarms(s)
        yield from self._identity()

    def _totals(self, s: Sample) -> Iterator[Metric]:
        snap = s.snapshot
        yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open",
                                len(s.connections))
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open",
                                sum(c.get("channels", 0) for c in s.connections))
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected",
                                len(snap.get("consumers", ())))
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", len(snap.get("queues", ())))

    def _queues(self, s: Sample) -> Iterator[Metric]:
        rows = s.snapshot.get("queues", ())
        consumers = GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers on a queue",
                                      labels=["vhost", "queue"] if self.per_object else None)
        for metric, column, help_text in QUEUE_GAUGES:
            if not self.per_object:
                total = sum(c[column] for c in s.queue_counters.values())
                yield GaugeMetricFamily(metric, help_text, total)
                continue
            family = GaugeMetricFamily(metric, help_text, labels=["vhost", "queue"])
            for key, counters in s.queue_counters.items():
                family.add_metric(split_object_key(key), counters[column])
            yield family
        if not self.per_object:
            consumers.add_metric([], sum(row[7] for row in rows))
            yield consumers
            return
        for row in rows:
            consumers.add_metric([row_vhost(row, 16), row[0]], row[7])
        yield consumers
        published = CounterMetricFamily(
            "rabbitmq_queue_messages_published_total",
            "Total number of messages published into a queue through an exchange on a channel",
            labels=["vhost", "queue"])
        for key, counters in s.queue_counters.items():
            published.add_metric(split_object_key(key), counters[3])
        yield published
        for metric, counter, help_text in QUEUE_COUNTER_METRICS:
            counter_family = CounterMetricFamily(metric, help_text, labels=["vhost", "queue"])
            i = 4 + QUEUE_COUNTERS.index(counter)
            for key, counters in s.queue_counters.items():
                counter_family.add_metric(split_object_key(key),
                                          counters[i] if len(counters) > i else 0)
            yield counter_family

    def _exchanges(self, s: Sample) -> Iterator[Metric]:
        family = CounterMetricFamily("rabbitmq_exchange_messages_published_total",
                                     "Total number of messages published into an exchange",
                                     labels=["vhost", "exchange"])
        for key, (publish_in, _) in s.exchange_counters.items():
            family.add_metric(split_object_key(key), publish_in)
        yield family

    def _global(self, s: Sample) -> Iterator[Metric]:
        counts = s.message_counts()
        for metric, names, labels, help_text in GLOBAL_COUNTERS:
            family = CounterMetricFamily(metric, help_text, labels=list(labels))
            family.add_metric(list(labels.values()), sum(counts.get(n, 0) for n in names))
            yield family
        consumers = GaugeMetricFamily("rabbitmq_global_consumers", "Current number of consumers",
                                      labels=list(PROTOCOL))
        consumers.add_metric(list(PROTOCOL.values()), len(s.snapshot.get("consumers", ())))
        yield consumers

    def _process(self, s: Sample) -> Iterator[Metric]:
        rss = fds = 0
        max_fds = 0
        uptime = 0.0
        try:
            procs = self.processes(self.node.broker_pid)
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    fds += p.num_fds()
                except (psutil.Error, OSError):  # went meanwhile
                    continue
            max_fds = procs[0].rlimit(psutil.RLIMIT_NOFILE)[0] if procs else 0
            uptime = time.time() - procs[0].create_time() if procs else 0.0
        except (psutil.Error, OSError):
            pass
        yield GaugeMetricFamily("rabbitmq_process_open_fds", "Open file descriptors", fds)
        yield GaugeMetricFamily("rabbitmq_process_max_fds", "Open file descriptors limit", max_fds)
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", rss)
        if self.node.data_dir:
            try:
                free = shutil.disk_usage(self.node.data_dir).free
            except OSError:
                free = 0
            yield GaugeMetricFamily("rabbitmq_disk_space_available_bytes",
                                    "Disk space available in bytes", free)
        yield GaugeMetricFamily("rabbitmq_erlang_uptime_seconds", "Node uptime", round(uptime, 3))

    def _alarms(self, s: Sample) -> Iterator[Metric]:
        alarms = s.snapshot.get("alarms", {})
        memory = bool(alarms.get("memory")) or bool(alarms.get("queued"))
        yield UnknownMetricFamily("rabbitmq_alarms_file_descriptor_limit",
                                  "is 1 if file descriptor limit alarm is in effect", 0)
        yield UnknownMetricFamily("rabbitmq_alarms_free_disk_space_watermark",
                                  "is 1 if free disk space watermark alarm is in effect",
                                  int(bool(alarms.get("disk"))))
        yield UnknownMetricFamily("rabbitmq_alarms_memory_used_watermark",
                                  "is 1 if VM memory watermark alarm is in effect", int(memory))

    def _identity(self) -> Iterator[Metric]:
        build = UnknownMetricFamily(
            "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
            labels=["rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version",
                    "erlang_version", "product_name", "product_version"])
        build.add_metric([self.node.version, self.node.version,
                          _package_version("prometheus_client"), platform.python_version(),
                          "Shoal", self.node.version], 1)
        yield build
        identity = UnknownMetricFamily(
            "rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
            labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id",
                    "rabbitmq_endpoint"])
        identity.add_metric([self.node.name, self.node.cluster, f"shoal-{self.node.cluster}",
                             "per-object" if self.per_object else "aggregated"], 1)
        yield identity


def registry(sampler: Sampler, node: Node, per_object: bool) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ShoalCollector(sampler, node, per_object))
    return reg


def make_metrics_app(sampler: Sampler, node: Node) -> ASGIApp:
    """The Prometheus listener's application: ``/metrics`` and ``/metrics/per-object``."""
    registries = {False: registry(sampler, node, False), True: registry(sampler, node, True)}

    async def scrape(per_object: bool) -> Response:
        await sampler.refresh()  # at most one sample per ``fresh`` seconds, whoever asks
        body = await trio.to_thread.run_sync(generate_latest, registries[per_object])
        return Response(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def metrics(request: Request) -> Response:
        return await scrape(False)

    async def per_object(request: Request) -> Response:
        return await scrape(True)

    async def index(request: Request) -> Response:
        return PlainTextResponse("Shoal's Prometheus metrics: /metrics, /metrics/per-object\n")

    return Starlette(routes=[Route("/metrics", metrics), Route("/metrics/per-object", per_object),
                             Route("/", index)])



async def serve(fd: int, sampler: Sampler, node: Node) -> None:
    """Serve the metrics on the listener the supervisor bound (``--prometheus-port``)."""
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve as hyper_serve

    config = HyperConfig()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("shoal.management.prometheus")
    config.keep_alive_timeout = 30
    await hyper_serve(make_metrics_app(sampler, node), config,  # type: ignore[arg-type]
                      shutdown_trigger=trio.sleep_forever)
