"""The one module of a worker that owns sockets and the trio event loop.

Tasks of a worker process:

* ``_accept``: takes connections from the listening socket shared with the
  other workers, standing back when it holds more than a peer does
  (:mod:`workers.balance`); each connection gets a reader task (bytes → protocol →
  handler) and a writer task (protocol output → socket, :mod:`workers.socket_writer`);
* ``_events``: drains the event ring and notify slots; sleeps on the worker's
  eventfd only after saying so in shared memory and checking once more;
* ``_flusher``: the request outbox goes to the ring once per scheduling round
  (a trio instrument, :class:`_RoundFlush`), this task retrying while it is full;
* ``_body_syncer`` (``--data-dir``): syncs the body log of persistent messages, then lets the
  publisher confirms that waited for it go (:func:`sync_bodies`);
* ``_heartbeats``: heartbeat ticks for every connection;
* ``_watch_supervisor``: EOF on the alive pipe means the supervisor died: exit;
* ``_signals``: SIGTERM closes every client with 320 CONNECTION_FORCED.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import ipaddress
import logging
import math
import signal
import socket
import sys
import termios
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import trio

from broker import errors
from ipc import collector
from ipc import records as r
from ipc.logfile import BodyLog, CpuSaturation, sync_files, sync_pause
from ipc.region import NOT_ACCEPTING, Region
from ipc.wakeup import wait_for_work
from workers import events as ev
from workers.balance import AcceptBalance
from workers.connection import AMQPConnection
from workers.connection_handler import ConnectionHandler
from workers.consumer_target import PULL_DEFER
from workers.socket_writer import Doorbell, SocketWriter
from workers.worker import LAZY_SETTLE_DELAY, Worker

log = logging.getLogger("shoal.worker")
log_connection = logging.getLogger("shoal.connection")

RECEIVE_SIZE = 256 << 10
# What a read asks for after one that did not fill its ask (a client between messages): a bytes
# this size comes from malloc's heap. One of RECEIVE_SIZE is over glibc's mmap threshold, and
# as recv shrinks it to what came, it is never reused: an mmap, an mremap and a munmap per read
# (one publish at a time at 1,000 msg/s: a fifth of the publishing worker's time).
RECEIVE_SMALL = 64 << 10
# A client streaming big messages (a full read of at least BIG_EVENT octets per event) is read
# RECEIVE_BIG at a time, a few messages a read, so that each of the worker's turns and each
# wake-up of the supervisor takes several: with 256 KiB bodies, 1 MiB reads against 256 KiB ones
# took S6 from 3,400 to 4,300 msg/s and the supervisor's CPU a message from 57 to 26 µs. Small
# messages stay at RECEIVE_SIZE: a read is then thousands of publishes, and a bigger one only
# lets more of them in past credit flow (S1u: the backlog grew sixfold).
RECEIVE_BIG = 1 << 20
BIG_EVENT = 32 << 10
CLOSED_TICKS = 5  # heartbeat ticks a protocol-closed connection's reader has to finish
EVENTS_PER_TURN = 64  # client events handled between two checkpoints of a connection's reader
EAGER_READS = 4  # reads a connection's reader may make in a row without waiting (see _reader)
SHUTDOWN_GRACE = 1.0
CLOSE_LINGER = 2.0  # how long a closed connection's socket is read (and dropped) for its EOF
ALLOC_RETRY = 0.002  # the request ring is full: let the supervisor drain it
# A publish waiting for arena room is woken by ArenaFreed; it also looks again this often,
# for room freed while its ArenaWait was on the way (the supervisor did not count that).
ARENA_RECHECK = 0.25
ACCEPT_PAUSE = 0.1  # out of file descriptors or memory: let connections close first
# Blocks of its arena a worker looks at per heartbeat tick (0.5 s) to give free pages back
# (ipc.arena.Arena.trim): ~2 ms at most, a pass over a full arena of 128-byte messages in ~10 s.
ARENA_TRIM_STEPS = 32768
# accept() errors that concern only the connection being accepted (as trio's own listener)
_ACCEPT_SKIP = {
    errno.ECONNABORTED, errno.EPERM, errno.EPROTO, errno.ENETDOWN, errno.ENOPROTOOPT,
    errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH,
}
_ACCEPT_PAUSE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "connection.blocked": True,
    "direct_reply_to": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


def server_properties(worker_index: int) -> dict[str, Any]:
    return {
        "product": "Shoal",
        "version": "0.1.0",
        "platform": "Python",
        "copyright": "Copyright 2026 the Shoal authors",
        "information": "Licensed under the Apache License 2.0",
        "capabilities": dict(CAPABILITIES),
        "cluster_name": "shoal",
        "shoal_worker": worker_index,
    }


class _RoundFlush(trio.abc.Instrument):
    """Server._flusher's hook: the worker's request outbox goes to the ring at the end
    of each scheduling round (``before_io_wait``), outside any task. It must not raise
    (trio would drop it), and what it reschedules would wait for the next I/O (the
    loop's timeout is already set): when the ring is full or the flush fails, it hands
    the outbox to the flusher task through the trio token, which wakes the loop."""

    def __init__(self, worker: Worker, token: trio.lowlevel.TrioToken, retry: Any) -> None:
        self.worker = worker
        self.token = token
        self.retry = retry
        self.retrying = False  # the flusher task has the outbox until it is written

    def before_io_wait(self, timeout: float) -> None:
        if not self.worker.has_requests or self.retrying:
            return
        try:
            if self.worker.flush_requests():
                return
        except Exception:  # noqa: BLE001, S110 -- raised again in the flusher task: the worker fails
            pass
        self.retrying = True
        self.token.run_sync_soon(self.retry)


class Server:
    """The worker's trio runtime: accepts connections (balanced across workers), runs a reader
    and a writer per connection around its sans-IO protocol object, drains the event ring when
    the supervisor kicks the eventfd, and keeps heartbeats, flow control and shutdown."""

    def __init__(self, config: r.WorkerConfig) -> None:
        self.config = config
        self.worker = Worker(config, Region.attach(config.regions[config.index]))
        self._properties = server_properties(config.index)
        self._stopping = False
        self._accepting = False
        self._open = 0  # client connections held now
        self._scopes: dict[int, trio.CancelScope] = {}
        self._flush_bell = Doorbell()
        self.worker.want_flush = self._flush_bell.ring  # until _flusher installs its round hook
        self._unblocked = trio.Event()
        self._unblocked.set()
        self.worker.on_blocked = self._blocked
        self._arena_freed = trio.Event()
        self.worker.on_arena_freed = self._on_arena_freed
        self._balance = AcceptBalance(config.index, self.worker.connection_counts)

    async def run(self) -> None:
        listener = socket.socket(fileno=self.config.listen_fd)
        listener.setblocking(False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_supervisor, nursery)
            nursery.start_soon(self._signals, nursery)
            nursery.start_soon(self._events)
            nursery.start_soon(self._flusher)
            nursery.start_soon(self._lazy_waker)
            nursery.start_soon(self._pull_deferrer)
            nursery.start_soon(self._body_syncer)
            nursery.start_soon(self._heartbeats)
            nursery.start_soon(self._accept, listener, nursery)
            collector.settle()  # started: nothing of a client's is alive yet
            self.worker.hello()

    # ------------------------------------------------------------ lifecycle

    async def _watch_supervisor(self, nursery: trio.Nursery) -> None:
        fd = self.config.alive_fd
        await trio.lowlevel.wait_readable(fd)  # only EOF ever comes: nobody writes
        log.warning("worker %d: supervisor is gone, exiting", self.config.index)
        nursery.cancel_scope.cancel()

    async def _signals(self, nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                await self._shutdown()
                nursery.cancel_scope.cancel()
                return

    async def _shutdown(self) -> None:
        self._stopping = True
        self._accepting = False
        self.worker.region.connections = NOT_ACCEPTING  # peers must not wait for us
        for handler in list(self.worker.handlers.values()):
            handler.proto.close(320, "CONNECTION_FORCED - broker forced connection closure "
                                "with reason 'shutdown'")
            handler.wake_writer()
        with trio.move_on_after(SHUTDOWN_GRACE):
            while self.worker.handlers:
                await trio.sleep(0.01)

    # -------------------------------------------------------- the event ring

    async def _events(self) -> None:
        worker = self.worker
        region = worker.region
        flag = region.worker_sleeping
        trace = worker.trace

        def has_work() -> bool:
            return not region.event_ring.is_empty() or region.any_slot_set()

        while True:
            done = worker.handle_events()
            worker.after_batch()
            if trace is not None:
                trace.maybe_flush()
            # More came in meanwhile: take it once the other ready tasks have run. Else
            # straight to the sleep protocol (another pass would only find both empty).
            if done and has_work():
                await trio.lowlevel.checkpoint()
                continue
            await wait_for_work(flag, worker.event_efd, has_work)

    def _blocked(self, active: bool) -> None:
        if active and self._unblocked.is_set():
            self._unblocked = trio.Event()
        elif not active:
            self._unblocked.set()

    def _on_arena_freed(self) -> None:
        self._arena_freed.set()
        self._arena_freed = trio.Event()

    async def _flusher(self) -> None:
        """Write the request outbox once per scheduling round, after every task that
        was ready has added its records: one ring write, at most one wake-up. A trio
        instrument does it just before the run loop waits for I/O (no task step and
        no extra round per flush, which is most of a quiet worker's rounds); this
        task takes over while the request ring is full, retrying until it has room."""
        worker = self.worker
        bell = self._flush_bell
        token = trio.lowlevel.current_trio_token()
        hook = _RoundFlush(worker, token, bell.ring)
        worker.want_flush = _nothing  # the hook looks at the outbox every round
        # A body write that fails in the hook closes connections: their writers are woken
        # through the token (what the hook reschedules would wait for the next I/O).
        worker.want_after_batch = lambda: token.run_sync_soon(worker.after_batch)
        trio.lowlevel.add_instrument(hook)
        try:
            while True:
                await bell.wait()
                while not worker.flush_requests():
                    await trio.sleep(ALLOC_RETRY)  # request ring full: let the supervisor drain
                hook.retrying = False
        finally:
            worker.want_flush = bell.ring
            worker.want_after_batch = worker.after_batch
            with contextlib.suppress(KeyError):  # trio drops an instrument that raised
                trio.lowlevel.remove_instrument(hook)

    async def _lazy_waker(self) -> None:
        """Acks the worker left in the ring without waking the supervisor (they ride
        with the next record that does) reach it within LAZY_SETTLE_DELAY all the same.

        The timer is armed when an ack is sent (``Worker.want_lazy_timer``), in the task step
        that handled it: a deadline set there counts for the loop's next sleep. (The flush that
        leaves the acks unannounced runs in _RoundFlush.before_io_wait, after trio chose how
        long to sleep: arming there took a trip through the trio token, an extra round and
        task step each time, a fifth of a consuming worker's CPU at 1,000 msg/s.)"""
        worker = self.worker
        scope = trio.CancelScope()

        def arm() -> None:
            if scope.deadline == math.inf:
                scope.deadline = trio.current_time() + LAZY_SETTLE_DELAY

        worker.want_lazy_timer = arm
        worker.want_lazy_wake = arm  # armed already when the acks were sent (a backstop)
        try:
            while True:
                with scope:
                    await trio.sleep_forever()
                scope = trio.CancelScope()
                if worker.lazy_pending:
                    if worker.region.request_ring.is_empty():
                        # The supervisor woke for something else meanwhile and read them.
                        worker.lazy_pending = False
                    else:
                        worker.wake_supervisor()
                if worker.has_requests:  # still in the outbox (a full ring): look again later
                    arm()
        finally:
            worker.want_lazy_timer = _nothing
            worker.want_lazy_wake = worker.wake_supervisor

    async def _pull_deferrer(self) -> None:
        """Consumers waiting for half their prefetch before pulling from a backlog
        (ConsumerTarget.top_up) pull what they have after PULL_DEFER. Armed from the task that
        handled the ack (``ConsumerTargets.defer``): no trio token needed."""
        worker = self.worker
        targets = worker.targets
        bell = Doorbell()
        targets.arm_defer = bell.ring
        try:
            while True:
                await bell.wait()
                await trio.sleep(PULL_DEFER)
                for target in targets.take_deferred():
                    handler = worker.handlers.get(target.conn)
                    if handler is not None:
                        handler.pull_due(target)
                        worker.dirty.add(handler)
                worker.after_batch()
        finally:
            targets.arm_defer = None

    async def _body_syncer(self) -> None:
        """With a body log: a persistent publish rings, the log is synced (:func:`sync_bodies`)
        and the worker sends the confirms that waited for it (Worker.body_synced)."""
        worker = self.worker
        body_log = worker.body_log
        if body_log is None:
            return
        bell = Doorbell()  # rung from tasks (a reader's publish): no trio token needed
        worker.want_body_sync = bell.ring
        try:
            await sync_bodies(body_log, bell, worker.body_synced, worker.write_bodies)
        finally:
            worker.want_body_sync = _nothing

    async def _heartbeats(self) -> None:
        """Heartbeats, and the arena's upkeep: its free runs' pages go back to the system
        (ipc.arena.Arena.trim, ARENA_TRIM_STEPS blocks a tick)."""
        whole = False
        while True:
            # Twice a second: a 1 s heartbeat is due every half second (RabbitMQ sends one
            # after heartbeat/2 of silence); every other connection is looked at once a second.
            await trio.sleep(0.5)
            whole = not whole
            region = self.worker.region
            region.arena.trim(region.release_arena_pages, ARENA_TRIM_STEPS)
            if self.worker.trace is not None and whole:
                self.worker.trace.maybe_flush()
            now = trio.current_time()
            for handler in list(self.worker.handlers.values()):
                closed = handler.proto.closed
                if not whole and (closed or handler.proto.heartbeat != 1):
                    continue
                alive = handler.heartbeat_tick(now)
                handler.wake_writer()
                if closed and handler.closed_ticks < CLOSED_TICKS:
                    # Closed by the protocol (the client's connection.close, say): its reader
                    # is still handling what it read before the close -- publishes that must
                    # not be lost -- and ends the connection itself. Cut only a stuck one.
                    handler.closed_ticks += 1
                    continue
                if not alive:
                    scope = self._scopes.get(handler.conn_id)
                    if scope is not None:
                        scope.cancel()

    # ---------------------------------------------------------- connections

    async def _accept(self, listener: socket.socket, nursery: trio.Nursery) -> None:
        region = self.worker.region
        self._accepting = True
        region.connections = self._open
        try:
            while True:
                await trio.lowlevel.wait_readable(listener)
                if not self._stopping:
                    await self._balance.wait_turn(trio.sleep)  # a peer with fewer, or starting
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue  # a peer took it
                except OSError as exc:
                    if exc.errno in _ACCEPT_SKIP:
                        continue
                    if exc.errno in _ACCEPT_PAUSE:
                        log.error("accept: %s; pausing for %.1f s", exc, ACCEPT_PAUSE)
                        await trio.sleep(ACCEPT_PAUSE)
                        continue
                    raise
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                if self._stopping:
                    await stream.aclose()
                    continue
                self._count_connection(+1)
                nursery.start_soon(self._connection, stream, sock)
        finally:
            self._accepting = False
            region.connections = NOT_ACCEPTING

    def _count_connection(self, delta: int) -> None:
        self._open += delta
        if self._accepting:
            self.worker.region.connections = self._open

    async def _connection(self, stream: trio.SocketStream, sock: socket.socket) -> None:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = self.config
        peer = local = ""
        with contextlib.suppress(OSError):
            peer_host, peer_port = sock.getpeername()[:2]
            peer = f"{peer_host}:{peer_port}"
            local_host, local_port = sock.getsockname()[:2]
            local = f"{local_host}:{local_port}"
        proto = AMQPConnection(
            server_properties=self._properties, frame_max=c.frame_max,
            channel_max=c.channel_max, heartbeat=c.heartbeat,
            max_body_size=c.max_message_size, users=c.users or None,
            peer_is_loopback=_is_loopback(peer.rpartition(":")[0]),
        )
        handler = ConnectionHandler(self.worker, next(self.worker.conn_ids), proto)
        proto.place_bodies(functools.partial(handler.place_body, self.worker.region.arena),
                           handler.release_body)
        handler.connected_at = time.time()
        handler.peer, handler.local = peer, local
        log_connection.info("accepting AMQP connection %s", handler.label)
        self.worker.handlers[handler.conn_id] = handler
        writer = SocketWriter(sock, handler, self.worker.after_batch)
        handler.wake_writer = writer.send_now
        handler.socket_queues = functools.partial(_socket_queues, sock)
        try:
            with trio.CancelScope() as scope:
                self._scopes[handler.conn_id] = scope
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer.run)
                    await self._reader(handler, sock)
                    await writer.drain(SHUTDOWN_GRACE)
                    nursery.cancel_scope.cancel()
                handler.finish()
                self.worker.after_batch()
                _log_closed(handler)
                await _linger(sock)
        finally:
            self._scopes.pop(handler.conn_id, None)
            if not handler.finished:
                handler.finish()
                self.worker.after_batch()
                _log_closed(handler)
            self._count_connection(-1)
            await stream.aclose()

    async def _reader(self, handler: ConnectionHandler, sock: socket.socket) -> None:
        proto = handler.proto
        worker = self.worker
        arena = worker.region.arena
        recv = sock.recv
        recv_into = sock.recv_into
        eager = 0  # reads that may still go without waiting first
        ask = RECEIVE_SMALL  # the next read's size: more after one that filled its ask
        while not proto.closed:
            if handler.reading_stop is not None:
                await self._stop_reading(handler)
            # Wait, then read: what trio's receive_some does, less its two checkpoints and
            # the failed recv it tries first (a client is mostly quiet between messages).
            # A read that filled what it asked for is likely followed by more: the next read
            # goes first, without the wait (at most EAGER_READS in a row, so a client that
            # never pauses cannot hog the worker). A big body frame's payload is received
            # straight into the arena block its publish goes to (AMQPConnection.place_bodies),
            # the rest of another big frame where it is being assembled: no copy either way.
            try:
                waited = not eager
                if waited:
                    await trio.lowlevel.wait_readable(sock)
                # Asked after the wait: meanwhile another task may have closed the channel
                # whose publish the room was in, and freed its block.
                room = proto.receive_room()
                if room is None:
                    want = ask
                    data = recv(want)
                    size = len(data)
                else:
                    want = len(room)
                    size = recv_into(room)
            except BlockingIOError:
                eager = 0
                continue
            except (OSError, trio.ClosedResourceError):
                return
            if not size:
                return
            eager = 0 if size != want else EAGER_READS if waited else eager - 1
            try:
                events = proto.receive_data(data) if room is None else proto.received_into(size)
                if room is None:
                    ask = _next_ask(want, size, len(events))
                for n, event in enumerate(events, 1):
                    if isinstance(event, ev.PublishReceived):
                        if worker.blocked or handler.publish_at_once(event, arena):
                            await self._publish(handler, event)
                    else:
                        handler.handle(event)
                    if not n % EVENTS_PER_TURN:
                        # One read can hold a few thousand publishes (tens of ms of work):
                        # hand what we have to the supervisor and let the worker's other
                        # connections and the event ring have a turn.
                        worker.after_batch()
                        await trio.lowlevel.checkpoint()
            except Exception:  # one connection's bug must not end the worker
                log.exception("connection %d: internal error", handler.conn_id)
                handler.fail(errors.InternalError("internal error"))
            if handler.proto_has_output():  # publishes alone give the writer nothing to do
                worker.dirty.add(handler)
            worker.after_batch()

    async def _stop_reading(self, handler: ConnectionHandler) -> None:
        """Credit flow and bounded output: leave the socket unread (the client's TCP
        window fills and its writes stop, as RabbitMQ's reader does) until the
        supervisor gives credit back or the writer has sent enough."""
        with _not_reading(handler):
            try:
                while (why := handler.reading_stop) is not None:
                    # Unsent output is the client's doing, not ours: its heartbeats are then
                    # looked for in the socket's queues (ConnectionHandler.heartbeat_tick).
                    handler.proto.reading_paused = why == "flow"
                    resume = trio.Event()
                    handler.wake_reader = resume.set
                    self.worker.after_batch()
                    await resume.wait()
            finally:
                handler.wake_reader = _nothing

    async def _publish(self, handler: ConnectionHandler, event: ev.PublishReceived) -> None:
        """A publish that waits: while a memory alarm is on, and for room in this worker's
        arena (the client is back-pressured by our not reading its socket). The rest take
        ``ConnectionHandler.publish_at_once`` without a coroutine."""
        worker = self.worker
        if worker.blocked:  # memory alarm: stop reading publishers (RabbitMQ does)
            handler.publishes = True
            with _not_reading(handler):
                while worker.blocked:
                    handler.set_blocked(True, worker.block_reason)
                    worker.after_batch()
                    await self._unblocked.wait()
        arena = worker.region.arena
        while needed := handler.publish_at_once(event, arena):
            await self._wait_for_room(handler, needed)

    async def _wait_for_room(self, handler: ConnectionHandler, size: int) -> None:
        """The arena has no block of ``size``: tell our publishers connection.blocked and
        wait until the supervisor has freed that much here (ArenaFreed), not polling."""
        worker = self.worker
        arena = worker.region.arena
        with _not_reading(handler):
            while True:
                worker.set_arena_full(True)
                worker.send(r.ArenaWait(size))
                worker.after_batch()
                with trio.move_on_after(ARENA_RECHECK):
                    await self._arena_freed.wait()
                offset = arena.alloc(size)
                if offset is not None:  # room: the caller allocates it again, with nothing between
                    arena.free(offset)
                    worker.set_arena_full(False)
                    return


def _nothing() -> None:
    pass


def _next_ask(asked: int, got: int, events: int) -> int:
    """What a connection's next plain read asks for, after one that asked ``asked`` octets
    and got ``got``, which made ``events``: RECEIVE_SMALL after a short read (the client paused),
    else RECEIVE_SIZE, or RECEIVE_BIG once a full read of at least that much came to BIG_EVENT
    octets an event or more (big messages)."""
    if got < asked:
        return RECEIVE_SMALL
    if got >= RECEIVE_SIZE and got >= BIG_EVENT * events:
        return RECEIVE_BIG
    return RECEIVE_SIZE


async def sync_bodies(body_log: BodyLog, bell: Doorbell, synced: Callable[[], object],
                      write: Callable[[], object] = _nothing,
                      saturated: Callable[[], bool] | None = None) -> NoReturn:
    """Sync ``body_log`` whenever it has unsynced appends (``bell`` rings after each), calling
    ``write`` before each sync (Worker.write_bodies: the queued frames written, a failure dealt
    with) and ``synced`` after it. Group commit: appends made while a sync runs in its thread
    are covered by the next one, which starts as soon as that one is done; with nothing
    unsynced it sleeps on the bell. A failed sync ends the worker: the confirms waiting for
    it are never sent, and the supervisor sees the worker go. Under load the next sync waits a
    little (ipc.logfile.sync_pause; ``saturated`` says whether the host's CPUs are busy)."""
    if saturated is None:
        saturated = CpuSaturation()
    while True:
        if not body_log.unsynced:
            await bell.wait()
            continue
        write()
        began = trio.current_time()
        appended, fds = body_log.sync_plan()
        try:
            await trio.to_thread.run_sync(sync_files, fds)
        except OSError:
            log.critical("worker %d: syncing its body log in %s failed", body_log.worker,
                         body_log.data_dir)
            raise
        covered = appended - body_log.synced
        body_log.synced_to(appended, fds)
        synced()
        pause = sync_pause(covered, trio.current_time() - began, saturated)
        if pause:  # under load: let the next sync cover more
            await trio.sleep(pause)


async def _linger(sock: socket.socket) -> None:
    """After our last frame (close-ok, or our connection.close): send FIN, then read and drop
    what the client still sends until it closes its end, for at most CLOSE_LINGER seconds.
    Closing a socket with unread input sends a TCP reset, which can reach the client before
    the close-ok it is waiting for (amqplib writes connection.close ahead of publishes it
    still has buffered). RabbitMQ reads on after close-ok the same way."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with trio.move_on_after(CLOSE_LINGER):
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
                if not sock.recv(RECEIVE_SIZE):
                    return
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError):
                return


def _socket_queues(sock: socket.socket) -> tuple[int, int]:
    """Bytes received and not read yet, bytes sent and not acknowledged yet (Linux ioctls)."""
    try:
        unread = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        unacked = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return (-1, -1)
    return int.from_bytes(unread, sys.byteorder), int.from_bytes(unacked, sys.byteorder)


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _log_closed(handler: ConnectionHandler) -> None:
    """RabbitMQ's lines: a normal close at info, an error or a refused login at error."""
    proto = handler.proto
    refused = proto.refused_login
    if refused is not None:
        log_connection.error("connection %s: login refused: user '%s' - %s",
                             handler.label, refused[0], refused[1])
        return
    reason = proto.close_reason or "client closed the TCP connection"
    if handler.opened:
        who = f"vhost: '{proto.vhost}', user: '{proto.user}'"
        if proto.close_reason is None or reason.startswith("closed by client: 200"):
            log_connection.info("closing AMQP connection %s, %s", handler.label, who)
        else:
            log_connection.error("closing AMQP connection %s, %s: %s", handler.label, who, reason)
    else:
        log_connection.info("connection %s closed before it was opened: %s", handler.label, reason)


@contextlib.contextmanager
def _not_reading(handler: ConnectionHandler) -> Iterator[None]:
    """While the broker leaves a connection's socket unread (credit flow, unsent output, an
    alarm, no arena room), the client's silence is ours: no missed-heartbeat timeout."""
    handler.proto.reading_paused = True
    try:
        yield
    finally:
        handler.proto.reading_paused = False


async def serve(config: r.WorkerConfig) -> None:
    server = Server(config)
    try:
        await server.run()
    finally:
        server.worker.close()
