"""A worker process's state: its region, its connection handlers, its consumer targets.

The worker end of the rings (no trio here; ``workers.server`` drives it):
requests are encoded into an outbox and written to the request ring in
batches; events are drained from the event ring and routed to connection
handlers and consumer targets; set notify slots are notifyWork and lead to pulls
(deliverSingleMessage: target → channel → pull; docs/design.md, Glossary).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

from broker import errors
from ipc import records as r
from ipc.logfile import BodyLog
from ipc.region import Region
from ipc.wakeup import EventFd, wake_if_sleeping
from ipc.worker_config import WorkerConfig
from tracing import TraceWriter
from workers import codec
from workers.access import PermissionTables
from workers.arenas import Arenas
from workers.channel_config import ChannelResources
from workers.confirm_gate import BodySyncGate
from workers.connection_handler import ConnectionHandler
from workers.consumer_target import ConsumerTarget, ConsumerTargets
from workers.limits import WorkerLimits

log = logging.getLogger("shoal.worker")

EVENT_BATCH = 1024
# Acks alone do not wake a sleeping supervisor: they go to the ring and ride with the next
# record that does (a pull, a publish), or wake it this long after the first of them
# (workers.server._lazy_waker). Nothing a client sees waits for an ack to reach the
# supervisor (prefetch credit is the worker's); what waits is freeing the body, and a
# consumer acking each delivery at a steady rate saves the supervisor a wake-up per message.
LAZY_SETTLE_DELAY = 0.005
# Entries per Settle record. One basic.ack (or nack, or basic.recover) with multiple=true can
# settle everything a channel without prefetch holds, a million deliveries and more; as one
# record it would hold the supervisor for seconds. Records of at most 4,096 entry ids (37 KB)
# are a bounded step each (docs/design.md, Glossary: Bounded step).
SETTLE_MAX = 4096


def _ignore(_: bool) -> None:
    pass


def _nothing() -> None:
    pass


class Worker:
    """One worker process's state, without IO: its region and rings, its connection handlers
    (client connections) and consumer targets, and with ``--data-dir`` its body log (persistent
    messages). Requests go out through ``send`` (an outbox written to the request ring once per
    scheduling round), events come in through ``handle_events``; :class:`workers.server.Server`
    drives it from trio (and syncs the body log)."""

    def __init__(self, config: WorkerConfig, region: Region, *,
                 on_blocked: Callable[[bool], object] = _ignore,
                 on_arena_freed: Callable[[], object] = _nothing,
                 want_flush: Callable[[], object] | None = None) -> None:
        self.config = config
        # broker.permissions' tables (workers.access): replaced by PermissionsChanged
        self.permissions = PermissionTables(config.permissions, config.topic_permissions)
        # users tagged impersonator: may publish with another user_id (UsersChanged)
        self.impersonators: set[str] = set(config.impersonators)
        # the vhosts a connection may open: replaced by VhostsChanged
        self.vhosts: set[str] = set(config.vhosts)
        self.index = config.index
        self.region = region
        self.request_efd = EventFd(fd=config.request_fd)
        self.event_efd = EventFd(fd=config.event_fd)
        self.arenas = Arenas(region, config.index, list(config.regions), config.data_dir)
        self.codec = r.Codec()
        self._encode = self.codec.encode
        self.outbox: list[bytes] = []
        # The record being joined, after the outbox's last: a Settle that later acks of its
        # channel extend (_send_settle), or the first Publish of a run (_send_publish) and the
        # run's bodies so far. Encoded into the outbox once something else is sent, and before
        # the outbox is written (seal_requests).
        self._open: r.Settle | r.Publish | None = None
        self._run_bodies: list[int] = []
        self._urgent = False  # the outbox holds a record that must wake the supervisor
        self.lazy_pending = False  # acks in the ring that no wake-up announced yet
        self.want_lazy_wake: Callable[[], object] = self.wake_supervisor  # the server defers it
        # Called when an ack is sent: the server arms the timer that announces unannounced acks
        # within LAZY_SETTLE_DELAY (Server._lazy_waker); nothing without one.
        self.want_lazy_timer: Callable[[], object] = lambda: None
        self.handlers: dict[int, ConnectionHandler] = {}
        # broker.runtime.limits as this worker has them (workers.limits): LimitsChanged
        self.limits = WorkerLimits(self.handlers, config.vhost_limits, config.user_limits)
        self.targets = ConsumerTargets(len(region.slots))
        self.conn_ids = itertools.count(1)
        self.dirty: set[ConnectionHandler] = set()
        self.trace: TraceWriter | None = None  # shoal serve --trace
        if config.trace_dir:
            from tracing.writer import open_writer  # pyarrow: only when tracing

            self.trace = open_writer(config.trace_dir, f"worker{config.index}", worker=config.index)
        self.blocked = False  # the supervisor says: a resource alarm (memory, disk) is on
        self.block_reason = "low on memory"  # connection.blocked's reason while it is
        self.arena_full = False  # a publish found no room in our arena and waits for some
        self.on_blocked = on_blocked  # an alarm went on or off (the server's readers wait on it)
        self.on_arena_freed = on_arena_freed  # ArenaFreed came: publishes waiting for room look
        # The outbox has records: written at once, unless the server defers it to its round.
        self.want_flush: Callable[[], object] = want_flush or self.flush_requests
        # shoal serve --data-dir: persistent bodies are appended here as they are published;
        # the server's sync task syncs them (want_body_sync) and calls body_synced.
        self.body_log: BodyLog | None = None
        if config.data_dir:
            self.body_log = BodyLog(config.data_dir, config.index)
        self.want_body_sync: Callable[[], object] = lambda: None
        self._body_conns: set[int] = set()  # connections with bodies queued in the body log
        # After a failed body write closed connections: their writers must be woken (the server
        # defers it through the trio token: the write may run just before the loop sleeps).
        self.want_after_batch: Callable[[], object] = self.after_batch
        self.confirm_waiters: set[BodySyncGate] = set()  # channels' confirms held for a sync
        # (BodyLog.appended to reach, then what to call): tx.commits waiting for a sync
        self._sync_waiters: list[tuple[int, Callable[[], object]]] = []
        # What every channel of this worker draws on (workers.channel_config).
        self.channel_resources = ChannelResources(
            self.arenas, self.targets, self.body_log, self.confirm_waiters, self.trace)

    # ---------------------------------------------------------- requests

    def send(self, rec: Any) -> None:
        kind = type(rec)
        if kind is r.Publish:
            self._urgent = True
            self._send_publish(rec)
            return
        if kind is r.Settle:
            # An ack of a delivery the client has not read all of: copied first. An honest
            # client acks what it has; then this is a set lookup.
            self._unview(rec.conn, rec.entries)
            self._send_settle(rec)
            if rec.action == r.REQUEUE or rec.action == r.DROP:
                self._urgent = True  # a requeue is for other consumers, now
            else:
                self.want_lazy_timer()
            return
        if kind is r.ChanClose or kind is r.ConnClose:
            # The supervisor requeues what the channel or connection held, and another
            # consumer may settle it: nothing of ours may still view those blocks.
            self._unview(rec.conn, None)
        if self._open is not None:
            self.seal_requests()
        self._urgent = True
        self.outbox.append(self._encode(rec))

    def _unview(self, conn: int, entries: list[int] | None) -> None:
        """A record about to go lets the supervisor free the blocks of these deliveries of
        ``conn`` (None: any it holds): what of its output not written yet views one of them
        is copied first (``ConnectionHandler.seal_held``)."""
        handler = self.handlers.get(conn)
        if handler is not None and handler.holds_views and (
                entries is None or handler.views(entries)):
            handler.seal_held()

    def _send_publish(self, rec: r.Publish) -> None:
        """A publisher sending to one queue fills a read with publishes alike but for their
        bodies: a Publish that directly follows one of the same channel, exchange, routing key,
        mandatory and confirm flags, neither with properties the supervisor reads nor
        persistent, joins it in a PublishRun (encoded once it is over). The supervisor
        decodes, dispatches and reads one record for the run instead of one a message. Not
        while tracing, whose rows count Publish records."""
        run = self._open
        if (rec.headers is None and rec.expiration is None and rec.priority is None
                and rec.body_at is None and self.trace is None):
            if (type(run) is r.Publish and run.ch == rec.ch and run.conn == rec.conn
                    and run.routing_key == rec.routing_key and run.exchange == rec.exchange
                    and run.mandatory == rec.mandatory and run.confirm == rec.confirm):
                self._run_bodies += (rec.offset, rec.header_len, rec.body_len)
                return
            if run is not None:
                self.seal_requests()
            self._open = rec
            self._run_bodies = [rec.offset, rec.header_len, rec.body_len]
            return
        if run is not None:
            self.seal_requests()
        self.outbox.append(self._encode(rec))

    def _send_settle(self, rec: r.Settle) -> None:
        """A client acking each message sends its acks in bursts, and one read holds many:
        a Settle that directly follows one of the same channel and action joins it (nothing
        changes order), and the supervisor gets one record instead of one per ack, encoded
        once. No record carries more than SETTLE_MAX entries: a longer settle goes as several,
        in order."""
        entries = rec.entries
        if len(entries) > SETTLE_MAX:
            for start in range(0, len(entries), SETTLE_MAX):
                self._send_settle(r.Settle(rec.conn, rec.ch, entries[start:start + SETTLE_MAX],
                                           rec.action))
            return
        last = self._open
        if (type(last) is r.Settle and last.ch == rec.ch and last.conn == rec.conn
                and last.action == rec.action and len(last.entries) + len(entries) <= SETTLE_MAX):
            last.entries.extend(entries)
            return
        if last is not None:
            self.seal_requests()
        self._open = rec

    def seal_requests(self) -> None:
        """The record being joined goes to the outbox, encoded (a run of one publish as the
        Publish it is); later records start afresh."""
        last = self._open
        if last is None:
            return
        self._open = None
        if type(last) is r.Settle:
            self.outbox.append(self._encode(last))
            return
        assert type(last) is r.Publish
        bodies = self._run_bodies
        if len(bodies) == 3:
            self.outbox.append(self._encode(last))
            return
        self.outbox.append(self._encode(r.PublishRun(
            last.conn, last.ch, last.exchange, last.routing_key, last.mandatory, last.confirm,
            bodies)))

    def flush_requests(self) -> bool:
        """Write the outbox to the request ring; True when it all fitted. A sleeping
        supervisor is woken unless all that was written is acks (LAZY_SETTLE_DELAY). The body
        log's queued frames are written first: no record reaches the supervisor before the
        bodies it names are in the file."""
        body_log = self.body_log
        if body_log is not None and body_log.pending:
            self.write_bodies()
        if self._open is not None:
            self.seal_requests()
        if self.outbox:
            written = self.region.request_ring.put_many_nowait(self.outbox)
            del self.outbox[:written]
            if self._urgent or self.outbox:
                self._urgent = False
                self.wake_supervisor()
            elif not self.lazy_pending:
                self.lazy_pending = True
                self.want_lazy_wake()
        return not self.outbox

    @property
    def has_requests(self) -> bool:
        """Records wait for the request ring (the outbox, or a run of publishes being joined)."""
        return bool(self.outbox) or self._open is not None

    def wake_supervisor(self) -> None:
        self.lazy_pending = False
        wake_if_sleeping(self.region.supervisor_sleeping, self.request_efd)

    def hello(self) -> None:
        self.send(r.Hello(os.getpid()))
        self.flush_requests()

    # ------------------------------------------------------------- bodies

    def connection_counts(self) -> list[int]:
        """Every worker's open-connection count, as published in its region (workers.balance)."""
        return [self.arenas.region(k).connections for k in range(len(self.arenas))]

    def store_body(self, offset: int, header_len: int, body_len: int,
                   conn: int) -> tuple[int, int, int] | None:
        """A persistent message's header and body, from our arena, queued in the body log (the
        sync task is told; :meth:`write_bodies` writes them); where it goes
        (``Publish.body_at``), or None for a transient message. Refused (its block freed: no
        record will name it) when the content header is too short to say (501 FRAME_ERROR).
        A failed write closes connection ``conn`` (:meth:`write_bodies`)."""
        body_log = self.body_log
        if body_log is None:
            return None
        header, body = self.arenas.own_body(offset, header_len, body_len)
        try:
            if not codec.is_persistent(header):
                return None
        except codec.DecodeError as exc:
            self.region.arena.free(offset)
            raise errors.FrameError(str(exc), codec.BASIC_CLASS, codec.BASIC_PUBLISH) from exc
        where = body_log.append(header, body)
        self._body_conns.add(conn)
        self.want_body_sync()
        return where

    def write_bodies(self) -> bool:
        """Write the body log's queued frames (before any record naming them goes to the ring,
        and before a sync); False when the write failed. Then every connection with a body in
        the failed batch is closed with 541 INTERNAL_ERROR, as RabbitMQ does on a store
        failure: its channels drop their confirm gates, so no later sync confirms those
        messages. Their Publish records may still reach the supervisor (never confirmed: a
        restart finds the frame torn or missing and forgets them)."""
        body_log = self.body_log
        if body_log is None:
            return True
        try:
            body_log.write_pending()
        except OSError as exc:
            conns, self._body_conns = self._body_conns, set()
            log.error("worker %d: cannot write persistent messages' bodies: %s; closing %d "
                      "connection(s)", self.index, exc, len(conns))
            for conn in conns:
                handler = self.handlers.get(conn)
                if handler is not None and not handler.finished:
                    handler.fail(errors.InternalError(f"cannot store message: {exc.strerror}",
                                                      codec.BASIC_CLASS, codec.BASIC_PUBLISH))
                    self.dirty.add(handler)
            self.want_after_batch()
            return False
        self._body_conns.clear()
        return True

    def page_out(self, bodies: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Transient bodies of our arena, (offset, header_len, body_len), to the body log for
        the supervisor to page out (broker.storage.paging); where each went: (offset, segment, offset
        in it), segment -1 where it could not be written. Never synced: they are transient."""
        body_log = self.body_log
        if body_log is None:
            return [(offset, -1, 0) for offset, _, _ in bodies]
        self.write_bodies()  # persistent bodies queued before: not lost with a failed page-out
        own_body = self.arenas.own_body
        written: list[tuple[int, int, int]] = []
        for offset, header_len, body_len in bodies:
            segment, at, _ = body_log.append(*own_body(offset, header_len, body_len))
            written.append((offset, segment, at))
        try:
            body_log.write_pending()  # now: the supervisor may free the blocks once told
        except OSError as exc:
            log.error("worker %d: cannot page message bodies out: %s", self.index, exc)
            return [(offset, -1, 0) for offset, _, _ in bodies]
        return written

    def body_synced(self) -> None:
        """The body log was synced (``BodyLog.synced`` moved): the confirms it held go out."""
        for gate in list(self.confirm_waiters):
            handler = self.handlers.get(gate.conn)
            if handler is None:  # the connection is gone (its channels dropped their gates)
                self.confirm_waiters.discard(gate)
            else:
                handler.release_confirms(gate.ch)
        if self._sync_waiters and self.body_log is not None:
            synced = self.body_log.synced
            due = [call for mark, call in self._sync_waiters if mark <= synced]
            self._sync_waiters = [(m, c) for m, c in self._sync_waiters if m > synced]
            for call in due:
                call()
        self.after_batch()

    def after_body_sync(self, call: Callable[[], object]) -> None:
        """Call ``call`` once every body appended so far is on disk (at once if it is)."""
        log = self.body_log
        if log is None or not log.unsynced:
            call()
            return
        self._sync_waiters.append((log.appended, call))

    def close(self) -> None:
        """The worker stops: close its files (the trace, the body log)."""
        if self.trace is not None:
            self.trace.close()
        self.arenas.close_files()
        if self.body_log is not None:
            self.body_log.close()
            self.body_log = None

    # ------------------------------------------------------------- events

    def handle_events(self) -> int:
        """Drain the event ring and the notify slots; returns how much was done."""
        batch = self.region.event_ring.get_all_nowait(EVENT_BATCH)
        decode = self.codec.decode_event
        for raw in batch:
            event = decode(raw)
            try:
                self._dispatch(event)
            except Exception:  # noqa: BLE001 -- one connection's bug must not end the worker
                self._internal_error(event)
        slots = self.region.take_set_slots()
        if slots:
            self.notify_slots(slots)
        for handler in list(self.dirty):
            if handler.confirms_pending:
                handler.flush_confirms()
        self.arenas.close_files()
        return len(batch) + len(slots)

    def notify_slots(self, slots: list[int]) -> None:
        """notifyWork for the targets of these set slots. Those without a pull in flight are
        marked notified before any is acted on: under basic.qos global=true the first one's
        pull then shares its channel's credit with the others notified in the same batch
        instead of taking it all (slots are read in index order: the same consumer would come
        first each time). One that a sibling's shared pull already asked for is done."""
        by_slot = self.targets.by_slot
        handlers = self.handlers
        notified: list[tuple[ConnectionHandler, ConsumerTarget, bool]] = []
        for slot in slots:
            target = by_slot(slot)
            if target is not None:
                handler = handlers.get(target.conn)
                if handler is not None:
                    idle = not target.pulling
                    if idle:
                        target.notified = True
                    notified.append((handler, target, idle))
        dirty = self.dirty
        for handler, target, idle in notified:
            if idle and target.pulling:
                continue
            handler.notify(target)
            dirty.add(handler)

    def _dispatch(self, event: Any) -> None:
        match event:
            case r.Pulled(consumer=cid):
                target = self.targets.get(cid)
                if target is not None and (handler := self.handlers.get(target.conn)) is not None:
                    handler.on_pulled(target, event)
                    self.dirty.add(handler)
            case r.Cancelled(consumer=cid):
                target = self.targets.get(cid)
                if target is not None and (handler := self.handlers.get(target.conn)) is not None:
                    handler.on_cancelled(target)
                    self.dirty.add(handler)
            case r.Credit(conns=conns, counts=counts):
                handlers = self.handlers
                for conn, n in zip(conns, counts, strict=True):
                    handler = handlers.get(conn)
                    if handler is not None:
                        handler.add_credit(n)
            case r.Blocked(active=active, reason=reason):
                self.blocked = active
                self.block_reason = reason if active else "low on memory"
                self._tell_blocked()
                self.on_blocked(active)
            case r.ArenaFreed():
                self.on_arena_freed()
            case r.PageOut(bodies=bodies):
                self.send(r.PagedOut(self.page_out(bodies)))
            case r.ListConnections(request=request):
                rows = [handler.info() for handler in self.handlers.values() if handler.opened]
                self.send(r.ConnectionsListed(request, rows))
            case r.CloseConnection(conn=conn, reason=reason):  # the management API's close
                if (handler := self.handlers.get(conn)) is not None:
                    handler.proto.close(320, f"CONNECTION_FORCED - {reason}")
                    handler.wake_writer()
            case r.UsersChanged(users=users, removed=removed, impersonators=impersonators):
                self.users_changed(users, removed)
                if impersonators is not None:
                    self.impersonators = set(impersonators)
            case r.VhostsChanged(vhosts=vhosts, removed=removed):
                self.vhosts_changed(vhosts, removed)
            case r.PermissionsChanged(permissions=table, topic_permissions=topics):
                self.permissions.replace(table, topics)  # every connection's cache is stale now
            case r.LimitsChanged():
                self.limits.apply(event)
            case r.Returned():
                self._handler_event(event)
                self.region.arena.free(event.offset)  # our own block, always
            case _:
                self._handler_event(event)

    def limits_changed(self) -> None:
        """Tell the supervisor this worker's use of the limited vhosts and users, if it changed
        (workers.limits): after a connection or channel opened or closed, and each tick."""
        if (usage := self.limits.changed()) is not None:
            self.send(usage)

    def users_changed(self, users: dict[str, str], removed: list[str]) -> None:
        """The supervisor changed who may log in: the table every connection's login checks
        (``config.users``, which workers.sasl reads at each start-ok) changes in place, and the
        connections of a deleted user are closed with RabbitMQ's 320 text."""
        table = self.config.users
        table.update(users)
        for name in removed:
            table.pop(name, None)
        if not removed:
            return
        gone = set(removed)
        for handler in self.handlers.values():
            user = handler.proto.user
            if user in gone and not handler.finished:
                handler.proto.close(320, f"CONNECTION_FORCED - user '{user}' is deleted")
                handler.wake_writer()

    def vhosts_changed(self, vhosts: list[str], removed: list[str]) -> None:
        """The supervisor added or deleted vhosts: connection.open checks the new set, and
        the connections on a deleted one are closed with RabbitMQ's 320 text (rabbit_vhost)."""
        self.vhosts.clear()  # in place: each connection's check holds this set
        self.vhosts.update(vhosts)
        if not removed:
            return
        gone = set(removed)
        for handler in self.handlers.values():
            vhost = handler.proto.vhost
            if handler.opened and vhost in gone and not handler.finished:
                handler.proto.close(320, f"CONNECTION_FORCED - vhost '{vhost}' is deleted")
                handler.wake_writer()

    @property
    def alarmed(self) -> bool:
        """Publishers here are told connection.blocked: memory alarm or a full arena."""
        return self.blocked or self.arena_full

    def set_arena_full(self, full: bool) -> None:
        """A publish waits for arena room (``full``), or got it: our publishers are told
        connection.blocked meanwhile, as for the memory alarm, instead of stalling silently."""
        if full != self.arena_full:
            self.arena_full = full
            if full:
                log.warning("worker %d: arena full; its publishers are blocked until the "
                            "supervisor frees room", self.index)
            else:
                log.warning("worker %d: arena has room again; its publishers are unblocked",
                            self.index)
            self._tell_blocked()

    def _tell_blocked(self) -> None:
        alarmed = self.alarmed
        reason = self.block_reason if self.blocked else "low on memory"  # else: arena full
        for handler in self.handlers.values():
            handler.set_blocked(alarmed, reason)
            self.dirty.add(handler)

    def _internal_error(self, event: Any) -> None:
        """An event we failed to apply: close its connection with 541 INTERNAL_ERROR (the
        supervisor then requeues what it held) and carry on with every other connection."""
        handler = None
        if isinstance(event, (r.Pulled, r.Cancelled)):
            target = self.targets.get(event.consumer)
            handler = self.handlers.get(target.conn) if target is not None else None
        elif hasattr(event, "conn"):
            handler = self.handlers.get(event.conn)
        log.exception("internal error on %s (connection %s)", type(event).__name__,
                      handler.conn_id if handler is not None else "-")
        if handler is not None and not handler.finished:
            handler.fail(errors.InternalError("INTERNAL_ERROR"))
            self.dirty.add(handler)

    def _handler_event(self, event: Any) -> None:
        handler = self.handlers.get(event.conn)
        if handler is not None:
            handler.on_event(event)
            self.dirty.add(handler)

    def after_batch(self) -> None:
        """Wake the socket writers of handlers with output; ask for a flush of
        the requests (the server folds the flushes of one scheduling round
        into one, so a sleeping supervisor is woken once, not per connection)."""
        for _ in range(4):  # a send that lifts back-pressure may make more output
            if not self.dirty:
                break
            dirty, self.dirty = self.dirty, set()
            for handler in dirty:
                handler.wake_writer()
        if self.has_requests:
            self.want_flush()
