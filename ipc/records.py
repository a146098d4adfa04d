"""Every record that crosses a process boundary, in one schema module.

Records travel as msgpack (array-like, tagged) in the per-worker rings:

* ``Request`` records go worker → supervisor on the request ring;
* ``Event`` records go supervisor → worker on the event ring.

Ordering is the contract that keeps the worker simple: the supervisor handles
one worker's requests in ring order and answers in the same order, so a
worker can pipeline a channel's methods and match replies by (conn, ch) alone.

Names here are broker concepts (queues, consumers, bodies), not wire frames:
``ipc/`` knows nothing about AMQP. A body is named by a handle
``(region, offset, header_len, body_len)``: ``offset`` is the payload offset
of an arena block in worker ``region``'s shared memory, holding the content
header payload followed by the body.
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Record(msgspec.Struct, frozen=True, array_like=True, tag_field="t", tag=True):
    pass


# --------------------------------------------------------------------------
# worker → supervisor
# --------------------------------------------------------------------------


class Hello(_Record, frozen=True, tag="hello"):
    """A worker attached to its region and is about to accept connections."""

    pid: int


class ConnOpen(_Record, frozen=True, tag="copen"):
    """Connection ``conn`` is open; ``user`` logged in on it (topic permissions are checked in
    the supervisor, which knows the exchanges' types) to ``vhost``, where every request of the
    connection goes."""

    conn: int
    user: str = ""
    vhost: str = "/"


class ConnClose(_Record, frozen=True, tag="cclose"):
    """A connection is gone: its consumers go, its unacked messages are requeued,
    its exclusive queues are deleted."""

    conn: int


class LimitUsage(_Record, frozen=True, tag="limuse"):
    """What this worker has open of the limited vhosts and users (``workers.limits``), sent
    when it changes: the supervisor tells the other workers (``LimitsChanged``)."""

    vhost_connections: dict[str, int]
    user_connections: dict[str, int]
    user_channels: dict[str, int]


class ChanClose(_Record, frozen=True, tag="chclose"):
    """A channel is gone: its consumers go, its unacked messages are requeued.
    Answered by ``Reply(method="chclose")``, after which nothing more comes
    for that channel number until it is reused."""

    conn: int
    ch: int


class ExchangeDeclare(_Record, frozen=True, tag="xdecl"):
    conn: int
    ch: int
    name: str
    type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]
    nowait: bool


class ExchangeDelete(_Record, frozen=True, tag="xdel"):
    conn: int
    ch: int
    name: str
    if_unused: bool
    nowait: bool


class QueueDeclare(_Record, frozen=True, tag="qdecl"):
    conn: int
    ch: int
    name: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]
    nowait: bool
    # The worker named it (queue.declare of "": amq.gen-..., so that its configure permission
    # is checked on that name before it exists); the amq. prefix is not refused then.
    server_named: bool = False


class QueueBind(_Record, frozen=True, tag="qbind"):
    conn: int
    ch: int
    queue: str
    exchange: str
    routing_key: str
    arguments: dict[str, Any]
    nowait: bool


class QueueUnbind(_Record, frozen=True, tag="qunbind"):
    conn: int
    ch: int
    queue: str
    exchange: str
    routing_key: str
    arguments: dict[str, Any]


class QueuePurge(_Record, frozen=True, tag="qpurge"):
    conn: int
    ch: int
    queue: str
    nowait: bool


class QueueDelete(_Record, frozen=True, tag="qdel"):
    conn: int
    ch: int
    queue: str
    if_unused: bool
    if_empty: bool
    nowait: bool


class Consume(_Record, frozen=True, tag="consume"):
    """Subscribe a consumer to ``queue``; its notifyWork is notify slot ``slot``.

    ``consumer`` is unique for the worker's lifetime (slots are reused, ids
    never), so a late answer for a consumer that is gone cannot reach a new
    one. ``interested`` is the consumer's first setNotifyWorkDesired, sent
    along to save a round trip."""

    conn: int
    ch: int
    consumer: int
    slot: int
    queue: str
    tag: str
    no_ack: bool
    exclusive: bool
    priority: int
    browse: bool
    interested: bool
    nowait: bool


class Cancel(_Record, frozen=True, tag="cancel"):
    conn: int
    ch: int
    consumer: int
    nowait: bool


class Interest(_Record, frozen=True, tag="interest"):
    """setNotifyWorkDesired (docs/design.md; credit, flow, back-pressure)."""

    consumer: int
    desired: bool


class Pull(_Record, frozen=True, tag="pull"):
    """deliverSingleMessage (docs/design.md), up to ``max`` times.

    ``standing``: what the queue does not have for the consumer now stays asked for. The
    supervisor keeps the rest of the pull open, says nothing while nothing comes, and runs it
    where it would have set the consumer's notify slot, answering with the deliveries (a
    ``Pulled`` whose ``open`` says how much is still open). A consumer at a light load then
    costs one supervisor → worker hop per message instead of three (notify, pull, deliveries).
    The pull ends when it is used up, when the queue has more than it asked for, or with an
    empty ``Pulled`` when the consumer says it is no longer interested, is cancelled, or its
    queue goes away.

    A consumer working off a backlog sends its next pull as soon as half its prefetch is back,
    before the last is answered (``workers.channel_consumers``); one that finds the rest of a
    standing pull open adds to it. ``seq`` numbers the consumer's pulls, and each ``Pulled``
    says up to which the supervisor had applied: the worker counts the later ones as still
    asked for.

    ``limited``: the client limits this consumer, not the supervisor: its prefetch was full and
    less than half of it came back within ``workers.consumer_target.PULL_DEFER`` (a slow
    application acking one message at a time). Credit flow's "behind" rule passes over such a
    consumer (``broker.runtime.credit_flow``)."""

    consumer: int
    max: int
    standing: bool = False
    seq: int = 0  # the consumer's pulls numbered from 1 (see above)
    limited: bool = False


class Get(_Record, frozen=True, tag="get"):
    conn: int
    ch: int
    queue: str
    no_ack: bool


class _Publishing(_Record, frozen=True):
    """Where a publish goes and how: the fields a Publish and a PublishRun share (first)."""

    conn: int
    ch: int
    exchange: str
    routing_key: str
    mandatory: bool
    confirm: bool


class Publish(_Publishing, frozen=True, tag="pub"):
    """A complete message whose header+body sit in this worker's arena."""

    offset: int
    header_len: int
    body_len: int
    headers: dict[str, Any] | None
    expiration: str | None = None
    priority: int | None = None
    # A persistent message (delivery_mode 2) with --data-dir: where the worker wrote its header
    # and body (ipc.logfile.BodyLog): (segment, offset, length) in this worker's body log.
    body_at: tuple[int, int, int] | None = None


class PublishRun(_Publishing, frozen=True, tag="pubrun"):
    """Publishes one after another on one channel, to one exchange and routing key, without
    properties the supervisor reads (headers, expiration, priority) and not persistent: what a
    publisher sending to one queue makes, one record instead of one each. ``bodies``: offset,
    header length and body length of each, in publish order (flat). The supervisor applies
    them as that many ``Publish`` records (``broker.runtime.dispatch.Dispatcher._publish_run``)."""

    bodies: list[int]


class ArenaWait(_Record, frozen=True, tag="arenawait"):
    """The worker's arena has no block of ``size`` bytes for a publish: answer with
    ``ArenaFreed`` once blocks of this region have been freed (no polling)."""

    size: int


class PagedOut(_Record, frozen=True, tag="pagedout"):
    """The transient bodies a ``PageOut`` asked for, written to this worker's body log:
    (arena offset, segment, offset of the frame in it); segment -1 where the write failed."""

    written: list[tuple[int, int, int]]


class ChannelInfo(msgspec.Struct, frozen=True, array_like=True):
    """One open channel of a listed connection, as its worker knows it (the management API's
    /api/channels: every open channel, not only those the supervisor keeps books for)."""

    number: int
    prefetch: int  # basic.qos global=false (RabbitMQ's prefetch_count)
    global_prefetch: int  # basic.qos global=true (global_prefetch_count)
    confirm: bool
    tx: bool
    consumers: int
    unacked: int


class ConnectionInfo(msgspec.Struct, frozen=True, array_like=True):
    """One client connection as ``shoal list-connections`` shows it (rabbitmqctl's columns)."""

    conn: int
    peer: str  # the client's host:port
    user: str
    vhost: str
    state: str  # running, flow, blocking, blocked, closing (RabbitMQ's names)
    channels: int
    client: str  # client_properties["product"], when the client says
    recv_oct: int
    send_oct: int
    connected_at: float  # wall clock, seconds since the epoch
    # connection.start-ok's client-properties, JSON-able (bytes decoded, nested tables kept)
    client_properties: dict[str, Any] = {}
    open_channels: list[ChannelInfo] = []


class ConnectionsListed(_Record, frozen=True, tag="conns"):
    """The answer to ``ListConnections``: this worker's connections."""

    request: int
    rows: list[ConnectionInfo]


class ExchangeBind(_Record, frozen=True, tag="xbind"):
    """exchange.bind: messages routed by ``source`` also go to ``destination``."""

    conn: int
    ch: int
    destination: str
    source: str
    routing_key: str
    arguments: dict[str, Any]
    nowait: bool


class ExchangeUnbind(_Record, frozen=True, tag="xunbind"):
    conn: int
    ch: int
    destination: str
    source: str
    routing_key: str
    arguments: dict[str, Any]
    nowait: bool


class Sync(_Record, frozen=True, tag="sync"):
    """A barrier answered by ``Reply(method="sync")`` once everything the
    channel sent before it is applied (tx.commit-ok waits for it)."""

    conn: int
    ch: int


# A delivery of a body this big (octets) goes out as views of its arena block, which the
# delivering worker may hold in unsent output until the socket takes it (workers.codec's
# ZEROCOPY_MIN). The supervisor frees such a block only through that worker's Settle, ChanClose
# or ConnClose, which the worker sends after copying what it still viewed of it, and the pager
# leaves such a message in its arena while a channel holds a delivery of it.
VIEWED_BODY_MIN = 4096

# Settle actions.
ACK = 0  # basic.ack from the client
REQUEUE = 1
DROP = 2
AUTO_ACK = 3  # settled by the worker itself (a no-ack delivery, a browser's): as ACK, but no
#               client acked it (message statistics count ACK's only)


class Settle(_Record, frozen=True, tag="settle"):
    """Acknowledge, requeue or drop entries this channel acquired."""

    conn: int
    ch: int
    entries: list[int]
    action: int


Request = (
    Hello
    | ConnOpen
    | ConnClose
    | LimitUsage
    | ChanClose
    | ExchangeDeclare
    | ExchangeDelete
    | ExchangeBind
    | ExchangeUnbind
    | QueueDeclare
    | QueueBind
    | QueueUnbind
    | QueuePurge
    | QueueDelete
    | Consume
    | Cancel
    | Interest
    | Pull
    | Get
    | Publish
    | PublishRun
    | Settle
    | Sync
    | ArenaWait
    | PagedOut
    | ConnectionsListed
)


# --------------------------------------------------------------------------
# supervisor → worker
# --------------------------------------------------------------------------


class Reply(_Record, frozen=True, tag="ok"):
    """The successful answer to the channel's oldest outstanding request.

    ``method`` names the request's record tag; the other fields are filled
    where the AMQP reply carries them."""

    conn: int
    ch: int
    method: str
    queue: str = ""
    message_count: int = 0
    consumer_count: int = 0


class Error(_Record, frozen=True, tag="err"):
    """The request failed with an AMQP reply code (soft or hard)."""

    conn: int
    ch: int
    code: int
    text: str
    class_id: int
    method_id: int


class Delivery(msgspec.Struct, frozen=True, array_like=True):
    """One message handed to a consumer. ``reheader``: the content header must
    be re-encoded with ``headers`` and ``expiration`` (a dead-lettered message
    carries x-death; a redelivery from a delivery-limited queue x-delivery-count).
    ``stored``: the body was paged out of the arena (``broker.storage.paging``); it is in the body
    log at (worker, segment, offset, length), and ``region`` and ``offset`` mean nothing."""

    entry: int
    redelivered: bool
    exchange: str
    routing_key: str
    region: int
    offset: int
    header_len: int
    body_len: int
    reheader: bool = False
    headers: dict[str, Any] | None = None
    expiration: str | None = None
    stored: tuple[int, int, int, int] | None = None


class Pulled(_Record, frozen=True, tag="pulled"):
    """The answer to a Pull: what was acquired, and whether the consumer is
    still Notified (``more``) or went back to Interested."""

    consumer: int
    deliveries: list[Delivery]
    more: bool
    open: int = 0  # a standing pull: how much of it stays open (0: it is over)
    seq: int = 0  # the consumer's last Pull the supervisor had applied (Pull.seq)


class GetOk(_Record, frozen=True, tag="getok"):
    conn: int
    ch: int
    delivery: Delivery
    message_count: int


class GetEmpty(_Record, frozen=True, tag="getempty"):
    conn: int
    ch: int


class Returned(_Record, frozen=True, tag="ret"):
    """An unroutable mandatory publish: the worker sends basic.return and
    frees the block (it is in its own arena). ``reheader``: send the content
    header re-encoded with ``headers`` and ``expiration`` (BCC removed)."""

    conn: int
    ch: int
    code: int
    text: str
    exchange: str
    routing_key: str
    offset: int
    header_len: int
    body_len: int
    reheader: bool = False
    headers: dict[str, Any] | None = None
    expiration: str | None = None


class Confirm(_Record, frozen=True, tag="confirm"):
    """Publisher confirms for the channel's ``count`` oldest unconfirmed publishes, all acks or
    all nacks: the supervisor folds a run of them into one record (a record per publish cost
    the supervisor and the worker a few microseconds each)."""

    conn: int
    ch: int
    ack: bool
    count: int = 1


class Cancelled(_Record, frozen=True, tag="cancelled"):
    """The broker cancelled a consumer (its queue was deleted)."""

    consumer: int


class Blocked(_Record, frozen=True, tag="blocked"):
    """A resource alarm (RabbitMQ's) started or ended for this worker's publishers:
    connection.blocked with ``reason`` / connection.unblocked, publishing paused. Memory:
    message bodies held in this worker's arena crossed its high watermark, or fell below its
    low one; disk: the data directory's free space fell below --disk-free-limit."""

    active: bool
    reason: str = "low on memory"


class Credit(_Record, frozen=True, tag="credit"):
    """Publish credit given back (credit flow): connection ``conns[i]`` may send
    ``counts[i]`` more Publish records. Withheld while the supervisor is behind."""

    conns: list[int]
    counts: list[int]


class ListConnections(_Record, frozen=True, tag="lsconns"):
    """Answer with ``ConnectionsListed(request, ...)`` (shoal list-connections)."""

    request: int


class CloseConnection(_Record, frozen=True, tag="closeconn"):
    """Close connection ``conn`` with 320 CONNECTION_FORCED, ``reason`` its text (the
    management API's ``DELETE /api/connections/{name}``, its X-Reason header)."""

    conn: int
    reason: str


class UsersChanged(_Record, frozen=True, tag="users"):
    """Who may log in changed at runtime (``shoal ctl add_user`` etc.): ``users`` were added or
    got a new stored password (name -> ``broker.passwords`` hash), ``removed`` were deleted --
    their open connections are closed with 320 CONNECTION_FORCED."""

    users: dict[str, str]
    removed: list[str]
    impersonators: list[str] | None = None  # who is tagged impersonator now (None: unchanged)


class VhostsChanged(_Record, frozen=True, tag="vhosts"):
    """The vhosts changed at runtime (``shoal ctl add_vhost`` etc.): ``vhosts`` is the whole
    set now (connection.open to another is 530); the open connections of each of ``removed``
    are closed with ``320 CONNECTION_FORCED - vhost 'V' is deleted``."""

    vhosts: list[str]
    removed: list[str] = []


class PermissionsChanged(_Record, frozen=True, tag="perms"):
    """The permissions changed at runtime (``shoal ctl set_permissions`` etc.): both tables
    whole (``broker.permissions``), which replace the worker's."""

    permissions: dict[str, dict[str, tuple[str, str, str]]]
    topic_permissions: dict[str, dict[str, dict[str, tuple[str, str]]]]


class LimitsChanged(_Record, frozen=True, tag="limits"):
    """The vhost and user limits (``broker.runtime.limits``) and what the other workers use of
    them: each worker's check at connection.open and channel.open counts its own connections
    and channels and adds these (``workers.limits``)."""

    vhosts: dict[str, dict[str, int]]  # vhost -> {max-connections, max-queues}
    users: dict[str, dict[str, int]]  # user -> {max-connections, max-channels}
    vhost_connections: dict[str, int]  # on the other workers, of the limited vhosts and users
    user_connections: dict[str, int]
    user_channels: dict[str, int]


class ArenaFreed(_Record, frozen=True, tag="arenafreed"):
    """Blocks of this worker's arena were freed since its ``ArenaWait``: allocate again."""


class PageOut(_Record, frozen=True, tag="pageout"):
    """Append these transient bodies of this worker's arena -- (offset, header_len, body_len)
    -- to its body log and say where they went (``PagedOut``); the supervisor keeps each block
    until then (broker.storage.paging)."""

    bodies: list[tuple[int, int, int]]


Event = (
    Reply
    | Error
    | Pulled
    | GetOk
    | GetEmpty
    | Returned
    | Confirm
    | Cancelled
    | Blocked
    | Credit
    | ArenaFreed
    | PageOut
    | ListConnections
    | CloseConnection
    | UsersChanged
    | PermissionsChanged
    | VhostsChanged
    | LimitsChanged
)


class Codec:
    """One encoder and decoder per direction, built once per process."""

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._req = msgspec.msgpack.Decoder(Request)
        self._evt = msgspec.msgpack.Decoder(Event)
        self.encode = self._enc.encode
        self.decode_request = self._req.decode
        self.decode_event = self._evt.decode
