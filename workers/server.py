"""A worker's trio runtime: its tasks, the listening socket, a reader and a writer per connection.

Tasks of a worker process:

* ``_accept``: takes connections from the listening socket shared with the
  other workers, standing back when it holds more than a peer does
  (:mod:`workers.balance`); each connection gets a reader task (bytes → protocol →
  handler, :mod:`workers.socket_reader`) and a writer task (protocol output → socket,
  :mod:`workers.socket_writer`);
* ``_events``: drains the event ring and notify slots; sleeps on the worker's
  eventfd only after saying so in shared memory and checking once more;
* ``_flusher``: the request outbox goes to the ring once per scheduling round
  (a trio instrument, :class:`_RoundFlush`), this task retrying while it is full;
* ``_body_syncer`` (``--data-dir``): syncs the body log of persistent messages, then lets the
  publisher confirms that waited for it go (:func:`workers.body_sync.sync_bodies`);
* ``_heartbeats``: heartbeat ticks for every connection;
* ``_watch_supervisor``: EOF on the alive pipe means the supervisor died: exit;
* ``_signals``: SIGTERM closes every client with CONNECTION_FORCED (``_SHUTDOWN``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import signal
import socket
import ssl
import time
from typing import Any, Final

import trio

from broker import errors
from ipc import collector, tls
from ipc.region import NOT_ACCEPTING, Region
from ipc.wakeup import wait_for_work
from ipc.worker_config import WorkerConfig
from workers.balance import AcceptBalance
from workers.body_sync import sync_bodies
from workers.client_socket import addresses, is_loopback, linger, socket_queues, tune
from workers.connection import AMQPConnection
from workers.connection_handler import ConnectionHandler
from workers.consumer_target import PULL_DEFER
from workers.login_log import LoginFailureLog
from workers.socket_reader import PublishGates, SocketReader
from workers.socket_writer import Doorbell, SocketWriter
from workers.tls_connection import serve_tls
from workers.tls_socket import TLSSocket
from workers.worker import LAZY_SETTLE_DELAY, Worker

log = logging.getLogger("shoal.worker")
log_connection = logging.getLogger("shoal.connection")
LOGIN_SUMMARY_INTERVAL: Final = 5.0  # seconds between looks for refused-login summaries owed

CLOSED_TICKS = 5  # heartbeat ticks a protocol-closed connection's reader has to finish
SHUTDOWN_GRACE = 1.0
ALLOC_RETRY = 0.002  # the request ring is full: let the supervisor drain it
ACCEPT_PAUSE = 0.1  # out of file descriptors or memory: let connections close first
# Blocks of its arena a worker looks at per half second of heartbeat ticks to give free pages
# back (ipc.arena.Arena.trim): ~2 ms at most, a pass over a full arena of 128-byte messages in
# ~10 s.
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


def server_properties(worker_index: int, cluster_name: str = "shoal") -> dict[str, Any]:
    return {
        "product": "Shoal",
        "version": "0.1.0",
        "platform": "Python",
        "copyright": "Copyright 2026 the Shoal authors",
        "information": "Licensed under the Apache License 2.0",
        "capabilities": dict(CAPABILITIES),
        "cluster_name": cluster_name,
        "shoal_worker": worker_index,
    }


# RabbitMQ's words for the connections a stopping broker closes.
_SHUTDOWN: Final = errors.ConnectionForced("broker forced connection closure with reason 'shutdown'")


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

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._flush_bell = Doorbell()
        self._gates = PublishGates()
        self.worker = Worker(
            config, Region.attach(config.regions[config.index]),
            on_blocked=self._gates.blocked, on_arena_freed=self._gates.on_arena_freed,
            want_flush=self._flush_bell.ring,  # until _flusher installs its round hook
        )
        self._properties = server_properties(config.index, config.cluster_name)
        self._stopping = False
        self._accepting = False
        self._open = 0  # client connections held now
        self._scopes: dict[int, trio.CancelScope] = {}
        self._balance = AcceptBalance(config.index, self.worker.connection_counts)
        self._login_failures = LoginFailureLog()  # the log's limit on refused logins per address

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
            nursery.start_soon(self._login_failure_summaries)
            nursery.start_soon(self._accept, listener, nursery)
            c = self.config
            if c.tls_listen_fd >= 0:  # --tls-port: this worker loads the files itself
                context = tls.server_context(
                    c.tls_cert, c.tls_key, c.tls_ca, verify_peer=c.tls_verify_peer,
                    fail_if_no_peer_cert=c.tls_fail_if_no_peer_cert)
                tls_listener = socket.socket(fileno=c.tls_listen_fd)
                tls_listener.setblocking(False)
                nursery.start_soon(self._accept, tls_listener, nursery, context)
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
            handler.proto.close(_SHUTDOWN.reply_code, _SHUTDOWN.frame_text)
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
        that handled it: a deadline set there counts for the loop's next sleep. Not in
        _RoundFlush.before_io_wait (where the flush that leaves the acks unannounced runs):
        trio has chosen how long to sleep by then, and arming there takes a trip through the
        trio token, an extra round and task step each time.

        A consumer acking each delivery at a steady rate has its acks read by the supervisor
        when something else wakes it (the publisher's records): the timer would go off for
        nothing, a wake-up of this worker every LAZY_SETTLE_DELAY. So an ack sent when the
        deadline is less than half the delay away, and the acks it was set for have reached
        the supervisor (announced, or the request ring is empty), moves it to a whole delay
        from now: it then goes off only when acks wait unread that long."""
        worker = self.worker
        ring = worker.region.request_ring
        scope = trio.CancelScope()
        half = LAZY_SETTLE_DELAY / 2

        def arm() -> None:
            deadline = scope.deadline
            if deadline == math.inf:
                scope.deadline = trio.current_time() + LAZY_SETTLE_DELAY
                return
            now = trio.current_time()
            if deadline - now < half and (not worker.lazy_pending or ring.is_empty()):
                worker.lazy_pending = False
                scope.deadline = now + LAZY_SETTLE_DELAY

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
        """With a body log: a persistent publish rings, the log is synced
        (:func:`workers.body_sync.sync_bodies`) and the worker sends the confirms that waited
        for it (Worker.body_synced)."""
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

    async def _login_failure_summaries(self) -> None:
        """The log's line for the refused logins from an address it did not tell in full, once
        that address's minute is over (``workers.login_log``)."""
        while True:
            await trio.sleep(LOGIN_SUMMARY_INTERVAL)
            _log_summaries(self._login_failures)

    async def _heartbeats(self) -> None:
        """Heartbeats, and the arena's upkeep: its free runs' pages go back to the system
        (ipc.arena.Arena.trim, ARENA_TRIM_STEPS blocks a half second)."""
        whole = False
        halves = False  # a connection has a 1 s heartbeat: the tick comes twice a second
        while True:
            # RabbitMQ sends a heartbeat after heartbeat/2 of silence: while a connection has
            # a 1 s heartbeat, it is due every half second, so the tick comes twice a second and
            # every other connection is looked at once a second; else the tick comes once a
            # second (an idle worker's wake-ups cost ~5 ms each on a VM: perf.at_rest).
            await trio.sleep(0.5 if halves else 1.0)
            whole = not whole or not halves
            region = self.worker.region
            region.arena.trim(region.release_arena_pages,
                              ARENA_TRIM_STEPS if halves else 2 * ARENA_TRIM_STEPS)
            if self.worker.trace is not None and whole:
                self.worker.trace.maybe_flush()
            self.worker.limits_changed()  # a channel closed by an error (workers.limits)
            now = trio.current_time()
            halves = False
            for handler in list(self.worker.handlers.values()):
                closed = handler.proto.closed
                each_half = not closed and handler.proto.heartbeat == 1
                halves = halves or each_half
                if not whole and not each_half:
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

    async def _accept(self, listener: socket.socket, nursery: trio.Nursery,
                      context: ssl.SSLContext | None = None) -> None:
        """Accept from ``listener``: the AMQP port, or with ``context`` the AMQPS one (both
        loops count into the same balance)."""
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
                if context is None:
                    nursery.start_soon(self._connection, stream, sock)
                else:
                    nursery.start_soon(self._tls_connection, stream, sock, context)
        finally:
            self._accepting = False
            region.connections = NOT_ACCEPTING

    def _count_connection(self, delta: int) -> None:
        self._open += delta
        if self._accepting:
            self.worker.region.connections = self._open

    async def _connection(self, stream: trio.SocketStream, sock: socket.socket,
                          session: TLSSocket | None = None) -> None:
        """One client connection: the AMQP protocol over ``sock``, the accepted socket, or with
        ``session`` over the TLS session on it (its reader and writer use ``session``)."""
        c = self.config
        tune(sock)
        peer, local = addresses(sock)
        proto = AMQPConnection(
            server_properties=self._properties, frame_max=c.frame_max,
            channel_max=c.channel_max, heartbeat=c.heartbeat,
            max_body_size=c.max_message_size, users=c.users,
            peer_is_loopback=is_loopback(peer.rpartition(":")[0]),
            loopback_users=c.loopback_users,
            # A certificate is only there when verify_peer checked it against --tls-ca.
            external_user=tls.common_name(session.getpeercert()) if session is not None else None,
        )
        handler = ConnectionHandler(
            self.worker, next(self.worker.conn_ids), proto, arena=self.worker.region.arena,
            peer=peer, local=local, connected_at=time.time(),
            socket_queues=functools.partial(socket_queues, sock),
        )
        log_connection.info("accepting AMQP connection %s", handler.label)
        self.worker.handlers[handler.conn_id] = handler
        writer = SocketWriter(session or sock, handler, self.worker.after_batch)
        reader = SocketReader(session or sock, handler, self.worker, self._gates)
        try:
            with trio.CancelScope() as scope:
                self._scopes[handler.conn_id] = scope
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer.run)
                    await reader.run()
                    await writer.drain(SHUTDOWN_GRACE)
                    nursery.cancel_scope.cancel()
                handler.finish()
                self.worker.after_batch()
                _log_closed(handler, self._login_failures)
                if session is not None:
                    session.close_notify()
                await linger(sock)
        finally:
            self._scopes.pop(handler.conn_id, None)
            if not handler.finished:
                handler.finish()
                self.worker.after_batch()
                _log_closed(handler, self._login_failures)
            self._count_connection(-1)
            await stream.aclose()

    async def _tls_connection(self, stream: trio.SocketStream, sock: socket.socket,
                              context: ssl.SSLContext) -> None:
        """An AMQPS connection (``workers.tls_connection``): the handshake, then this
        connection's protocol over the TLS session."""
        await serve_tls(stream, sock, context, self._connection,
                        functools.partial(self._count_connection, -1))


def _nothing() -> None:
    pass


def _log_closed(handler: ConnectionHandler, login_failures: LoginFailureLog) -> None:
    """RabbitMQ's lines: a normal close at info, an error or a refused login at error (the
    first few per address a minute; then one line says how many more)."""
    proto = handler.proto
    refused = proto.refused_login
    if refused is not None:
        if login_failures.failure(_host(handler.peer)):
            log_connection.error("connection %s: login refused: user '%s' - %s",
                                 handler.label, refused[0], refused[1])
        _log_summaries(login_failures)
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


def _log_summaries(login_failures: LoginFailureLog) -> None:
    for line in login_failures.summaries():
        log_connection.error("%s", line)


def _host(peer: str) -> str:
    """HOST of a HOST:PORT peer (IPv6 hosts have colons of their own)."""
    return peer.rpartition(":")[0] or peer


async def serve(config: WorkerConfig) -> None:
    server = Server(config)
    try:
        await server.run()
    finally:
        server.worker.close()
