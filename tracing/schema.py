"""The trace record schemas, shared by the writers (`tracing.writer`, `perf.trace_writers`) and the
readers (`tracing.reader`, the Spark report `report`).

A trace directory holds Arrow IPC *stream* files (``.arrows``): per writing process, one open
file per row kind (a message stage, an event kind, ...), rotated by size::

    <table>-<kind>-<process>-<pid>-<n>.arrows     e.g. msg-publish-worker0-4242-0000.arrows

A file's schema holds only the columns its row kind fills; the columns that are the same for every
row of the file (``stage`` / ``kind``, ``process``, ``pid``, the worker index) are written once as
schema metadata ``shoal.const.<column>`` and put back by the reader (``tracing.reader.conform``),
which conforms every batch to the table's full schema below. Four tables; every column is
nullable: a row has the columns its writer knows, the rest read as null.

``msg`` — message stages (:data:`MESSAGE_SCHEMA`)
    A message's life crosses processes (publish on worker A, enqueue / notify / pull / settle in
    the supervisor, deliver / ack on worker B), so each process writes its own *partial stage row*
    and the report joins them. Two keys make the join possible without adding anything to the
    ring records:

    * ``entry_id`` — the supervisor's ``QueueEntry.id`` (one per message *per queue*, unique for the
      supervisor's lifetime); a worker sees it as ``Delivery.entry`` and sends it back in ``Settle``.
    * ``(pub_worker, pub_pid, pub_seq)`` — the publish key: ``pub_seq`` is the 1-based index of
      the ``Publish`` record among those worker process ``pub_pid`` (worker index ``pub_worker``)
      has put on its request ring. The worker counts them as it sends, the supervisor as it
      drains that worker's ring (rings are FIFO), so both sides name the message the same way.
      The supervisor's rows carry the publish key next to ``entry_id`` and bridge the two.

    Which process writes which stage (``stage`` column), and the columns it fills
    (``C`` = filled once per batch from the writer's identity, not per row):

    ============ ============ ==================================================================
    stage        process      columns
    ============ ============ ==================================================================
    ``publish``  worker A     published_ns, pub_seq, pub_conn, pub_channel, exchange,
                              routing_key, body_size; C: pub_worker, pub_pid
    ``enqueue``  supervisor   enqueued_ns, msg_id, entry_id, queue, pub_worker, pub_pid, pub_seq,
                              exchange, routing_key, body_size               (optional, see below)
    ``notify``   supervisor   notified_ns, entry_id, consumer_worker, consumer_id      (optional)
    ``pull``     supervisor   pulled_ns, entry_id, consumer_worker, consumer_id        (optional)
    ``deliver``  worker B     delivered_ns, entry_id, queue, consumer_id, consumer_tag,
                              redelivered (0/1); C: consumer_worker
    ``ack``      worker B     acked_ns, entry_id, outcome (acked / rejected / requeued: what
                              the client asked for); C: consumer_worker
    ``settle``   supervisor   the wide row, once per entry at its *final* settlement: settled_ns,
                              outcome, msg_id, entry_id, queue, pub_worker, pub_pid, pub_seq,
                              consumer_worker, consumer_id, redelivered (count); enqueued_ns /
                              notified_ns / pulled_ns when the supervisor stamped them on the
                              entry; exchange, routing_key, body_size (optional: they let the
                              report check the publish-key join)
    ============ ============ ==================================================================

    The supervisor may either stamp enqueued/notified/pulled times on the entry and write only the
    wide ``settle`` row (one row per entry: the cheapest), or write the optional partial rows as
    they happen; the report merges both forms by ``entry_id`` (earliest enqueue / notify, first and
    last pull and delivery, latest settlement).

``event`` — small event rows (:data:`EVENT_SCHEMA`), ``kind`` one of :data:`EVENT_KINDS`:
    ``notify`` (supervisor, one per notifyWork: queue, consumer), ``pull`` (supervisor, one per
    Pull answered: queue, consumer, ``n`` entries returned, ``found_work`` = n > 0 for the first
    pull after a notify, null for the others), ``requeue`` (supervisor, one per entry put back:
    queue, entry_id, consumer: a client's nack/reject with requeue, a closed channel, a dead
    worker), ``consume`` / ``cancel`` (queue, consumer, tag, priority, browser). Expiry,
    dead-lettering and drops are final outcomes of the ``settle`` row, not events.

``proc`` — psutil samples (:data:`PROC_SCHEMA`, ``tracing.procs``): the traced broker's supervisor
samples itself and each worker every second; the perf scripts sample the broker and their clients.

``client`` — the load generator's own view (:data:`CLIENT_SCHEMA`): ``send`` rows (a publisher
sent ``n`` messages with sequences ``seq`` … ``seq+n-1`` at ``ts_ns``) and ``recv`` rows (a
consumer received ``publisher``/``seq``, stamped ``sent_ns`` by the sender, at ``ts_ns``).

Every timestamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC): comparable across the processes of
one host, meaningless across hosts or reboots. Use one trace directory per broker run.
"""

from __future__ import annotations

import pyarrow as pa

from tracing.names import ACKED as ACKED  # the outcome column's words, re-exported as ts.ACKED ...
from tracing.names import DEAD_LETTERED as DEAD_LETTERED
from tracing.names import DROPPED as DROPPED
from tracing.names import EXPIRED as EXPIRED
from tracing.names import FINAL_OUTCOMES as FINAL_OUTCOMES
from tracing.names import REJECTED as REJECTED
from tracing.names import REQUEUED as REQUEUED

FORMAT_VERSION = "1"
SUFFIX = ".arrows"
CONST_PREFIX = "shoal.const."  # schema metadata: a column that is the same for a whole file

# ----------------------------------------------------------------------------- table names
MESSAGES = "msg"
EVENTS = "event"
PROCS = "proc"
CLIENT = "client"
TABLES = (MESSAGES, EVENTS, PROCS, CLIENT)

# ----------------------------------------------------------------------------- msg.stage
PUBLISH = "publish"
ENQUEUE = "enqueue"
NOTIFY = "notify"
PULL = "pull"
DELIVER = "deliver"
ACK = "ack"
SETTLE = "settle"
STAGES = (PUBLISH, ENQUEUE, NOTIFY, PULL, DELIVER, ACK, SETTLE)
SUPERVISOR_STAGES = (ENQUEUE, NOTIFY, PULL, SETTLE)

# ----------------------------------------------------------------------------- msg.outcome
# tracing.names (imported above): ACKED, REJECTED, REQUEUED, EXPIRED, DEAD_LETTERED, DROPPED,
# FINAL_OUTCOMES

# ----------------------------------------------------------------------------- event.kind
EV_NOTIFY = "notify"
EV_PULL = "pull"
EV_REQUEUE = "requeue"
EV_CONSUME = "consume"
EV_CANCEL = "cancel"
EVENT_KINDS = (EV_NOTIFY, EV_PULL, EV_REQUEUE, EV_CONSUME, EV_CANCEL)

# ----------------------------------------------------------------------------- client.kind
SEND = "send"
RECV = "recv"


def _f(name: str, type_: pa.DataType, doc: str) -> pa.Field:
    return pa.field(name, type_, nullable=True, metadata={"doc": doc})


_I16, _I32, _I64, _STR = pa.int16(), pa.int32(), pa.int64(), pa.string()

MESSAGE_SCHEMA = pa.schema(
    [
        _f("stage", _STR, "which hook wrote the row: publish, enqueue, notify, pull, deliver, ack, settle"),
        _f("process", _STR, "writer's process name (supervisor, worker0, ...)"),
        _f("pid", _I32, "writer's pid"),
        _f("msg_id", _I64, "supervisor Message.id"),
        _f("entry_id", _I64, "supervisor QueueEntry.id = Delivery.entry (one per message per queue)"),
        _f("pub_worker", _I16, "index of the worker that received the publish"),
        _f("pub_pid", _I32, "pid of that worker process"),
        _f("pub_seq", _I64, "1-based index of the Publish record on that worker's request ring"),
        _f("pub_conn", _I64, "publisher's connection id on its worker"),
        _f("pub_channel", _I32, "publisher's channel number"),
        _f("exchange", _STR, "exchange published to"),
        _f("routing_key", _STR, "routing key"),
        _f("body_size", _I64, "body bytes"),
        _f("queue", _STR, "queue name"),
        _f("consumer_worker", _I16, "worker index of the consumer"),
        _f("consumer_id", _I64, "consumer id on its worker (null for Basic.Get)"),
        _f("consumer_tag", _STR, "consumer tag"),
        _f("published_ns", _I64, "worker: publish fully received (header + body in the arena)"),
        _f("enqueued_ns", _I64, "supervisor: entry added to the queue"),
        _f("notified_ns", _I64, "supervisor: the enqueue notified a consumer (notifyWork)"),
        _f("pulled_ns", _I64, "supervisor: entry acquired by a Pull (deliverSingleMessage)"),
        _f("delivered_ns", _I64, "worker: Basic.Deliver written to the socket buffer"),
        _f("acked_ns", _I64, "worker: the client's ack / nack / reject read"),
        _f("settled_ns", _I64, "supervisor: entry finally settled (acked, rejected, expired, ...)"),
        _f("outcome", _STR, "acked, rejected, requeued (ack rows only), expired, dead-lettered, dropped"),
        _f("redelivered", _I32, "deliver rows: 1 if a redelivery; settle rows: redeliveries"),
    ],
    metadata={"shoal.table": MESSAGES, "shoal.format": FORMAT_VERSION},
)

EVENT_SCHEMA = pa.schema(
    [
        _f("kind", _STR, "notify, pull, requeue, consume, cancel"),
        _f("process", _STR, "writer's process name"),
        _f("pid", _I32, "writer's pid"),
        _f("ts_ns", _I64, "time.monotonic_ns()"),
        _f("queue", _STR, "queue name"),
        _f("consumer_worker", _I16, "worker index of the consumer"),
        _f("consumer_id", _I64, "consumer id on its worker"),
        _f("consumer_tag", _STR, "consume rows: consumer tag"),
        _f("priority", _I16, "consume rows: x-priority"),
        _f("browser", pa.bool_(), "consume rows: a non-acquiring (browsing) consumer"),
        _f("entry_id", _I64, "requeue rows: the entry"),
        _f("n", _I32, "pull rows: entries returned"),
        _f("found_work", pa.bool_(), "pull rows: the first pull after a notify found work (else null)"),
    ],
    metadata={"shoal.table": EVENTS, "shoal.format": FORMAT_VERSION},
)

PROC_SCHEMA = pa.schema(
    [
        _f("ts_ns", _I64, "time.monotonic_ns() of the sample"),
        _f("pid", _I32, "sampled process"),
        _f("name", _STR, "its role: supervisor, worker0, publisher0, consumer1, ..."),
        _f("cpu_percent", pa.float64(), "psutil cpu_percent since the previous sample (100 = one core)"),
        _f("rss_bytes", _I64, "resident set size"),
        _f("cpu_user_s", pa.float64(), "cumulative user CPU seconds"),
        _f("cpu_system_s", pa.float64(), "cumulative system CPU seconds"),
        _f("ctx_voluntary", _I64, "cumulative voluntary context switches"),
        _f("ctx_involuntary", _I64, "cumulative involuntary context switches"),
    ],
    metadata={"shoal.table": PROCS, "shoal.format": FORMAT_VERSION},
)

CLIENT_SCHEMA = pa.schema(
    [
        _f("kind", _STR, "send or recv"),
        _f("client", _STR, "load generator process name"),
        _f("ts_ns", _I64, "send: when the batch was written; recv: when the delivery was parsed"),
        _f("publisher", _I32, "publisher id"),
        _f("seq", _I64, "send: first sequence of the batch; recv: the message's sequence"),
        _f("n", _I32, "send: messages in the batch; recv: 1"),
        _f("sent_ns", _I64, "recv: the sender's timestamp carried in the message"),
        _f("queue", _STR, "queue consumed from / routing key published to"),
        _f("redelivered", pa.bool_(), "recv: the redelivered flag"),
    ],
    metadata={"shoal.table": CLIENT, "shoal.format": FORMAT_VERSION},
)

SCHEMAS: dict[str, pa.Schema] = {
    MESSAGES: MESSAGE_SCHEMA,
    EVENTS: EVENT_SCHEMA,
    PROCS: PROC_SCHEMA,
    CLIENT: CLIENT_SCHEMA,
}

# Columns each message stage fills per row, in the order the writer's method takes them, and the
# columns filled once per batch from the writer's identity. Shared by the writer and the tests.
STAGE_COLUMNS: dict[str, tuple[str, ...]] = {
    PUBLISH: ("published_ns", "pub_seq", "pub_conn", "pub_channel", "exchange", "routing_key",
              "body_size"),
    ENQUEUE: ("enqueued_ns", "msg_id", "entry_id", "queue", "pub_worker", "pub_pid", "pub_seq",
              "exchange", "routing_key", "body_size"),
    NOTIFY: ("notified_ns", "entry_id", "consumer_worker", "consumer_id"),
    PULL: ("pulled_ns", "entry_id", "consumer_worker", "consumer_id"),
    DELIVER: ("delivered_ns", "entry_id", "queue", "consumer_id", "consumer_tag", "redelivered"),
    ACK: ("acked_ns", "entry_id", "outcome"),
    SETTLE: ("settled_ns", "outcome", "msg_id", "entry_id", "queue", "pub_worker", "pub_pid",
             "pub_seq", "consumer_worker", "consumer_id", "redelivered", "enqueued_ns",
             "notified_ns", "pulled_ns", "exchange", "routing_key", "body_size"),
}
STAGE_CONSTANTS: dict[str, dict[str, str]] = {
    # column -> writer attribute
    PUBLISH: {"pub_worker": "worker", "pub_pid": "pid"},
    DELIVER: {"consumer_worker": "worker"},
    ACK: {"consumer_worker": "worker"},
}

EVENT_COLUMNS: dict[str, tuple[str, ...]] = {
    EV_NOTIFY: ("ts_ns", "queue", "consumer_worker", "consumer_id"),
    EV_PULL: ("ts_ns", "queue", "consumer_worker", "consumer_id", "n", "found_work"),
    EV_REQUEUE: ("ts_ns", "queue", "entry_id", "consumer_worker", "consumer_id"),
    EV_CONSUME: ("ts_ns", "queue", "consumer_worker", "consumer_id", "consumer_tag", "priority",
                 "browser"),
    EV_CANCEL: ("ts_ns", "queue", "consumer_worker", "consumer_id"),
}


def file_name(table: str, kind: str, process: str, pid: int, index: int) -> str:
    """The name of the ``index``-th file of ``table`` rows of ``kind`` written by ``process``."""
    return f"{table}-{kind}-{process}-{pid}-{index:04d}{SUFFIX}"


def table_of(name: str) -> str | None:
    """The table a trace file name belongs to (None for anything else)."""
    if not name.endswith(SUFFIX) and not name.endswith(".parquet"):
        return None
    table = name.split("-", 1)[0]
    return table if table in SCHEMAS else None
