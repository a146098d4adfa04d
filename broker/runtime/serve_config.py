"""What `shoal serve` tells the supervisor (cli.main builds it), and the defaults that depend
on the machine: the memory alarms' marks and arenas that fit /dev/shm."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("shoal.supervisor")

# The supervisor's memory alarm by default (ServeConfig.queued_high_watermark): RabbitMQ's
# vm_memory_high_watermark (0.4) of the machine's memory, at the most a queued copy costs the
# supervisor (a featured queue's entry object, ~200 B; a plain queue's copy is ~30-60 B).
QUEUED_MEMORY_FRACTION = 0.4
QUEUED_BYTES = 200
SHM_DIR = "/dev/shm"


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 5672
    workers: int = os.cpu_count() or 1
    # Longest time the other workers leave new connections to a worker that is starting or being
    # replaced (workers.balance); a Python worker takes ~0.5-1.5 s to start. 0: never wait.
    start_grace: float = 2.0
    arena_mb: int = 256
    ring_kb: int = 4096
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 << 20
    # Memory alarm per worker arena: bytes of messages held in one worker's arena at which its
    # publishers are blocked (0: 80% of --arena-mb), and below which they are unblocked
    # (0: 90% of the high watermark).
    memory_high_watermark: int = 0
    memory_low_watermark: int = 0
    # The supervisor's memory alarm: messages queued in all queues (each copy counted) at which
    # every publisher is blocked (0: 40% of the machine's memory at QUEUED_BYTES a copy; -1:
    # never), unblocked below 90% of it.
    queued_high_watermark: int = 0
    # With a data dir, persistent bodies are paged out of an arena holding more than this
    # fraction of the high watermark (RabbitMQ's vm_memory_high_watermark_paging_ratio).
    memory_paging_ratio: float = 0.5
    trace: str | None = None  # directory for trace files (shoal report reads them)
    # Durable topology lives here (broker.storage.data_dir); None: nothing survives a restart.
    # `shoal serve` always passes one (--data-dir, default broker.storage.data_dir.default_data_dir).
    data_dir: str | None = None
    # The disk alarm: publishers are blocked while the data directory has less free space
    # (bytes; RabbitMQ's disk_free_limit, 50 MB by default). 0: no disk alarm.
    disk_free_limit: int = 50_000_000
    log_level: str = "info"
    ready_file: str | None = None
    control_socket: str | None = None  # shoal list-connections asks here; None: the default path
    # The management HTTP API (management/, a process of its own): its port (0: none) and
    # address (None: --host's).
    management_port: int = 0
    management_host: str | None = None
    management_required: bool = True  # False: a management port in use is a warning, not a failure
    # The management API over HTTPS too (RabbitMQ's management.ssl.*): its port (0: none) on
    # --management-host's address, and the PEM files (None: --tls-cert, --tls-key, --tls-ca).
    management_tls_port: int = 0
    management_tls_cert: str | None = None
    management_tls_key: str | None = None
    management_tls_ca: str | None = None
    # Prometheus metrics (rabbitmq_prometheus's /metrics), served by the management process on
    # a listener of their own: port (0: none; none either without the management process) and
    # address (None: --host's).
    prometheus_port: int = 0
    prometheus_host: str | None = None
    prometheus_required: bool = True  # False: a Prometheus port in use is a warning
    # Users allowed to log in, name -> password; empty: guest/guest (RabbitMQ's default user).
    users: dict[str, str] = field(default_factory=dict)
    # RabbitMQ's default_vhost: the vhost a new data directory (or none) starts with, instead
    # of "/"; the users given at that first start, or guest, get full permissions on it.
    default_vhost: str = "/"
    # RabbitMQ's default_permissions: what those users get there (configure, write, read).
    default_permissions: tuple[str, str, str] = (".*", ".*", ".*")
    # RabbitMQ's loopback_users: these may log in only from a loopback address.
    loopback_users: frozenset[str] = frozenset({"guest"})
    # The AMQPS listener (RabbitMQ's listeners.ssl.default and ssl_options; ipc.tls): its port
    # (0: none) on --host's address, the PEM files, and whether client certificates are asked
    # for and checked (verify_peer) and required (fail_if_no_peer_cert).
    tls_port: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
    # RabbitMQ's load_definitions: a definitions file (or a directory of *.json) imported at every
    # start by broker.runtime.definitions_io, after recovery and before a worker accepts.
    load_definitions: str | None = None


    def arena_watermarks(self) -> tuple[int, int]:
        """The memory alarm's marks per worker arena: (high, low) in bytes."""
        high = self.memory_high_watermark or (self.arena_mb << 20) * 4 // 5
        return high, min(self.memory_low_watermark or high * 9 // 10, high)

    def queued_watermark(self) -> int:
        """The supervisor's memory alarm: copies queued at which publishers are blocked (≤ 0:
        never)."""
        return self.queued_high_watermark or int(
            os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * QUEUED_MEMORY_FRACTION
        ) // QUEUED_BYTES

    def fit_arena(self) -> None:
        """Shrink the arenas to what /dev/shm can hold: tmpfs pages are only
        allocated when touched, and touching one past the mount's size limit
        kills the worker with SIGBUS."""
        st = os.statvfs(SHM_DIR)
        free_mb = st.f_bavail * st.f_frsize >> 20
        per_worker = free_mb // self.workers - 2 * self.ring_kb // 1024 - 1
        if per_worker < self.arena_mb:
            fitted = max(per_worker, 4)
            log.warning("%s has %d MiB free: arenas shrunk from %d to %d MiB per worker",
                        SHM_DIR, free_mb, self.arena_mb, fitted)
            self.arena_mb = fitted
