"""What the supervisor hands a worker process at start-up: JSON on its command line
(``python -m workers.main '<WorkerConfig JSON>'``), not a ring record (``ipc.records``)."""

from __future__ import annotations

import msgspec


class WorkerConfig(msgspec.Struct, frozen=True):
    """Everything a worker process needs to attach and serve."""

    index: int
    instance: str
    regions: list[str]
    listen_fd: int
    request_fd: int
    event_fd: int
    alive_fd: int
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 << 20
    log_level: str = "info"
    loopback_users: frozenset[str] = frozenset({"guest"})  # may log in only from loopback
    trace_dir: str = ""  # shoal serve --trace: write trace files here
    data_dir: str = ""  # shoal serve --data-dir: persistent bodies go to DIR/bodies/w<index>
    # broker.permissions' tables; None: everyone may do everything (tests without a supervisor)
    permissions: dict[str, dict[str, tuple[str, str, str]]] | None = None
    topic_permissions: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
    # server_properties' cluster_name: the node's name (broker.federation.node_name), which
    # federation links put in x-received-from and match to stop a message going round a ring
    cluster_name: str = "shoal"
    impersonators: list[str] = []  # users tagged impersonator (user_id, workers.connection_handler)
    vhosts: list[str] = msgspec.field(default_factory=lambda: ["/"])  # may be opened (VhostsChanged)
    # broker.runtime.limits: vhost -> {max-connections, ...}, user -> {max-connections,
    # max-channels}; then LimitsChanged
    vhost_limits: dict[str, dict[str, int]] = {}
    user_limits: dict[str, dict[str, int]] = {}
    # The users (JSON {name: password}) are read from this pipe at start, not passed on the
    # command line or in the environment, where other local users (ps, /proc/PID/environ)
    # could read them. -1: none.
    users_fd: int = -1
    users: dict[str, str] = {}  # name -> password; empty: nobody logs in. Filled from users_fd
    # The AMQPS listener (shoal serve --tls-port), shared as listen_fd is; -1: none. The worker
    # loads the certificate and key from these paths itself (ipc.tls): no key material here.
    tls_listen_fd: int = -1
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
