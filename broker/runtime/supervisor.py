"""The supervisor process: owns the queues, starts and restarts the workers.

Theory of operation
-------------------
:meth:`Supervisor.setup` (``shoal serve``: :func:`broker.runtime.serve.run`) sweeps shared
memory left by dead instances, creates one region and two eventfds per worker, binds the
listening socket, and starts N worker processes that inherit the socket and the fds
(gunicorn's arbiter shape: signal handlers only record, the main loop reaps and restarts).

Each turn of :class:`~broker.runtime.ring_loop.RingLoop` applies a bounded step of every worker's
request ring through the :class:`~broker.runtime.dispatch.Dispatcher`, then *flushes* once: each
outbox goes into its event ring, notify slots are set, and a worker's eventfd is written only if
it said it was going to sleep: a busy broker makes no syscall per message. The control plane
(control socket, processes, signals, the data directory's sync) is trio, the loop's guest.

A worker that dies is forgotten by the dispatcher (its consumers leave, its
unacked messages are requeued, its exclusive queues go), its rings are
reset, arena blocks of publishes it never finished are swept, and a new
process attaches to the same region: queued bodies survive.

If the supervisor dies, the workers see EOF on the ``alive`` pipe and exit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from broker.federation import node_name
from broker.passwords import DEFAULT_USER, hashed
from broker.permissions import Table, TopicTable
from broker.runtime import definitions_io, listeners
from broker.runtime.control import ControlServer, default_control_path
from broker.runtime.dispatch import Dispatcher
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.durability import Durability
from broker.runtime.management_child import ManagementChild
from broker.runtime.parameters import RuntimeParameters
from broker.runtime.permissions import RuntimePermissions
from broker.runtime.policies import RuntimePolicies
from broker.runtime.ring_loop import RingLoop
from broker.runtime.serve_config import ServeConfig
from broker.runtime.shovel_child import ShovelChild
from broker.runtime.users import RuntimeUsers
from broker.runtime.vhost_admin import RuntimeVhosts
from broker.runtime.worker_lifecycle import RESTART_BACKOFF, Restarts, WorkerSlot, start_worker
from ipc import collector
from ipc import records as r
from ipc.profiling import run_profiled, trio_instruments
from ipc.region import NOT_ACCEPTING, Region, region_name, sweep_stale
from ipc.ring import RingCorrupt
from ipc.wakeup import wake_if_sleeping
from ipc.worker_config import WorkerConfig

if TYPE_CHECKING:
    from tracing.procs import ProcSampleWriter

log = logging.getLogger("shoal.supervisor")

SHUTDOWN_GRACE = 5.0
LINKS_GRACE = 3.0  # the links process's own stop, before the workers': its connections closed
BATCH = 1024
# The most a worker's records may ask of one step (then the other tasks have a turn), in the
# dispatcher's units (Dispatcher.work): an entry of a Settle (workers.worker.SETTLE_MAX bounds
# one record), a routed copy of a message (a PublishRun to a fanout of thousands of queues stops
# within a message of it); the other requests are bounded by BATCH. A few milliseconds of work;
# a busy broker's batches are smaller.
STEP_WORK = 2048
IDLE_TICK = 1.0  # the timer's longest sleep
BACKLOG_RETRY = 0.0005  # s: an event ring was full; how soon its worker is offered the rest
# Every FORGET_PAGES_INTERVAL s (at a tick) the arena pages the supervisor touched by freeing
# blocks are unmapped (ipc.region.Region.forget_arena_pages): it never reads a body, and else its
# RSS grows to every arena's size. A pipeline's frees stay in a few pages; a drain's do not.
FORGET_PAGES_INTERVAL = 1.0


class Supervisor:
    """The supervisor process: owns the queues and the consumer manager (through the
    :class:`broker.runtime.dispatch.Dispatcher`), starts and replaces the workers, applies each worker's
    request ring in order, flushes events and notify slots back, and runs the timer and the
    control socket."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.instance = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.codec = r.Codec()
        self.workers: list[WorkerSlot] = []
        self.dispatcher = Dispatcher(
            config.workers, self._free_body, now=time.monotonic(),
            epoch_offset=time.time() - time.monotonic(),
            default_vhost=None if config.data_dir else config.default_vhost,
        )
        self._deadline = 0.0  # when the timer ticks next (the ring loop's longest sleep)
        self._forget_pages_at = 0.0
        self._backlogged = False  # an event ring was full: some worker's events wait (pending)
        self.stopping = False
        self.port = 0
        self._listener: socket.socket | None = None
        self._tls_listener: socket.socket | None = None  # --tls-port
        self._control_sock: socket.socket | None = None
        self.control_path = ""
        self._alive_r, self._alive_w = os.pipe()
        self.durability: Durability | None = None  # --data-dir
        self.users: dict[str, str] = {}  # who may log in: name -> stored password (setup)
        self.permissions: Table = {}  # broker.permissions' tables (setup)
        self.topic_permissions: TopicTable = {}
        self.samples: ProcSampleWriter | None = None  # --trace: CPU and memory of the processes
        self.management: ManagementChild | None = None  # --management-port
        self.shovels = ShovelChild()  # the links process: started by the first shovel
        self._definitions: list[tuple[str, dict[str, Any]]] = []  # --load-definitions, read

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        """Listen first (a port in use fails here, before anything is created), lock the data
        directory and restore durable topology (before any worker runs, so no client sees a
        half-recovered broker), then sweep what dead instances left and create the regions and
        the control socket."""
        self._listener = listeners.bind(self.config.host, self.config.port)
        if self.config.tls_port:
            self._tls_listener = listeners.bind_tls(self.config)
        if self.config.management_port:
            try:
                self.management = ManagementChild(  # binds: a port in use fails here
                    self.config.management_host or self.config.host, self.config.management_port)
            except OSError as exc:
                if self.config.management_required:
                    raise
                log.warning("management API not started: port %d: %s (--management-port "
                            "chooses another)", self.config.management_port, exc.strerror or exc)
        if self.config.management_tls_port:
            listeners.bind_management_tls(self.config, self.management)
        if self.management is not None and self.config.prometheus_port:
            self.management.listen_prometheus(self.config.prometheus_host or self.config.host,
                                              self.config.prometheus_port,
                                              self.config.prometheus_required)
        if self.config.data_dir:
            self.durability = Durability(self.config.data_dir, self.dispatcher)
            self.durability.recover_definitions(self.config.default_vhost)
            self.users = self.durability.recover_users(self.config.users,
                                                       self.config.default_permissions)
        else:  # no data directory (tests): the users given, or guest, this run only
            self.users = hashed(self.config.users or dict([DEFAULT_USER]))
        removed = sweep_stale()
        if removed:
            log.info("swept %d segment(s) left by dead instances", len(removed))
        self.config.fit_arena()
        c = self.config
        for k in range(c.workers):
            region = Region.create(
                region_name(self.instance, k), ring_bytes=c.ring_kb << 10,
                arena_bytes=c.arena_mb << 20,
            )
            self.workers.append(WorkerSlot(k, region))
        high, self.dispatcher.low_watermark = c.arena_watermarks()
        self.dispatcher.high_watermark = high
        queued = c.queued_watermark()
        if queued > 0:
            self.dispatcher.alarms.queued_high = queued
            self.dispatcher.alarms.queued_low = queued * 9 // 10
        if self.durability is not None:  # paging reads bodies back from the data dir
            self.dispatcher.pager.set_marks(high, c.memory_paging_ratio)
            self.durability.recover_messages([w.region.arena for w in self.workers], c.arena_mb)
            for w in self.workers:  # the restored bodies went into their arenas from here
                w.arena_touched = True
        if c.trace:
            from tracing.procs import ProcSampleWriter  # pyarrow: only when tracing
            from tracing.writer import open_writer

            self.dispatcher.trace = DispatchTrace(open_writer(c.trace, "supervisor"))
            self.samples = ProcSampleWriter(c.trace, "supervisor")
        self.port = self._listener.getsockname()[1]
        self.control_path = c.control_socket or default_control_path(self.port)
        store = self.durability.definitions if self.durability is not None else None
        if store is not None:
            self.permissions, self.topic_permissions = store.permissions(), store.topic_permissions()
        else:  # no data directory: the users given, or guest, have default_permissions there
            self.permissions = {name: {c.default_vhost: c.default_permissions}
                                for name in self.users}
        self.permission_admin = RuntimePermissions(
            self.permissions, self.topic_permissions, self.users, store, self.dispatcher, self.flush)
        self.dispatcher.topic_permissions = self.topic_permissions  # checked on publish, bind
        self.user_admin = RuntimeUsers(  # changes self.users (and the tags) in place
            self.users, store.user_tags() if store is not None else {}, store, self.dispatcher,
            self.flush, self.management.tell_users if self.management is not None else None)
        self.dispatcher.limits.attach(store, self.users, self.flush)  # broker.runtime.limits
        if self.management is not None:  # GET /api/users shows the users' limits
            self.dispatcher.limits.on_user_limits = self.management.user_limits_changed
        self._control = ControlServer(
            self.dispatcher, lambda: [w.index for w in self.workers if w.ready], self.flush,
            f"{c.host}:{self.port}", users=self.user_admin, permissions=self.permission_admin)
        self._control_sock = self._control.bind(self.control_path)
        self._control.policies = RuntimePolicies(self.dispatcher, store, self.flush)
        self.parameters = RuntimeParameters(self.dispatcher.vhosts, store, self.shovels)
        self._control.parameters = self.parameters
        self._control.vhosts = RuntimeVhosts(self.dispatcher, store, self.permission_admin,
                                             self.parameters, self.flush)
        if c.load_definitions:  # read now: a malformed file stops the start (run imports it)
            self._definitions = definitions_io.read(c.load_definitions)

    def cleanup(self) -> None:
        if self.dispatcher.trace is not None:
            self.dispatcher.trace.writer.close()
        if self.samples is not None:
            self.samples.close()
        for w in self.workers:
            w.close()
        if self._control_sock is not None:
            self._control.close(self._control_sock, self.control_path)
        if self._listener is not None:
            self._listener.close()
        if self._tls_listener is not None:
            self._tls_listener.close()
        if self.management is not None:
            self.management.close()
        for fd in (self._alive_r, self._alive_w):
            os.close(fd)
        if self.durability is not None:
            self.durability.close()
        if self.config.ready_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.ready_file)

    async def run(self) -> None:
        collector.settle()  # set up (and recovered): what is alive now lives on
        for path, body in self._definitions:  # --load-definitions, before any worker accepts
            await self._control.import_definitions(body, path)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals, nursery)
            if self.durability is not None:
                nursery.start_soon(self.durability.sync_index, self.flush)
                if self.config.disk_free_limit:
                    nursery.start_soon(self.durability.watch_disk, self.config.disk_free_limit,
                                       self.flush)
            assert self._control_sock is not None
            nursery.start_soon(self._control.serve, self._control_sock)
            if self.management is not None:
                nursery.start_soon(self.management.supervise, self._management_settings,
                                   lambda: self.stopping)
                nursery.start_soon(self.management.push_user_limits,
                                   lambda: self.dispatcher.limits.users)
            nursery.start_soon(self.shovels.supervise, self._shovel_settings,
                               self.parameters.listing, lambda: self.stopping)
            for w in self.workers:
                nursery.start_soon(self._supervise, w)

    def serve(self, main: Callable[[], Awaitable[object]] | None = None) -> None:
        """Run the ring loop with ``main`` (default :meth:`run`) as its trio guest, until
        ``main`` returns."""
        loop = RingLoop()
        try:
            for w in self.workers:
                loop.watch(w.request_efd.fileno(), w.region.supervisor_sleeping)
            run_profiled("supervisor", loop.run, main or self.run, self._step, self._has_work,
                         self._timeout, instruments=trio_instruments("supervisor"))
        finally:
            loop.close()

    async def _signals(self, nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s, shutting down", signal.Signals(signum).name)
                await self._shutdown()
                nursery.cancel_scope.cancel()
                return

    async def _shutdown(self) -> None:
        """The links process stops first, then the workers close their clients with 320 and
        exit; stragglers are killed.

        The links first, as RabbitMQ stops its shovel and federation plugins before its
        queues: a shovel still consuming while the workers close their clients would take the
        messages they requeue and forward them with acks that never reach the queues, so
        after the restart they would be forwarded again."""
        self.stopping = True
        self._sample()  # with the sample at each worker's hello: a CPU figure for a short run
        links = self.shovels.process  # the links process (shovels, federation links)
        if links is not None and links.returncode is None:
            links.send_signal(signal.SIGTERM)
            with trio.move_on_after(LINKS_GRACE):
                await links.wait()
                log.info("the links process stopped (its shovels and federation links closed)")
        procs = [w.process for w in self.workers if w.process is not None]
        if self.management is not None and self.management.process is not None:
            procs.append(self.management.process)
        if links is not None:
            procs.append(links)
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        with trio.move_on_after(SHUTDOWN_GRACE):
            for p in procs:
                await p.wait()
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        # What the workers sent last (their clients' final acks) is applied, and the index
        # synced: after a clean stop no acked message comes back.
        for w in self.workers:
            with contextlib.suppress(RingCorrupt):
                self._apply_all(w)
        self.dispatcher.vhosts.drain(whole=True)  # dead letters still waiting for a step: on disk too
        self.flush()
        if self.durability is not None:
            await self.durability.sync_now()
            self.durability.stopped_cleanly()  # the next start may trust the D records

    # -------------------------------------------------------------- workers

    async def _supervise(self, w: WorkerSlot) -> None:
        """Start worker k, and start it again on the same region when it dies (a replacement
        waited for or not, backing off or not: :class:`Restarts`)."""
        restarts = Restarts()
        w.region.mark_starting(self.config.start_grace)
        while not self.stopping:
            started = trio.current_time()
            w.process = await self._spawn(w)
            code = await w.process.wait()
            if self.stopping:
                w.region.connections = NOT_ACCEPTING
                return
            log.warning("worker %d (pid %d) exited with %s; replacing it",
                        w.index, w.process.pid, code)
            replacement = restarts.died(trio.current_time() - started, w.ready)
            self._forget(w, replacement_awaited=replacement.awaited)
            if replacement.back_off:
                await trio.sleep(RESTART_BACKOFF)  # a worker that cannot start must not spin

    async def _spawn(self, w: WorkerSlot) -> trio.Process:
        c = self.config
        assert self._listener is not None
        return await start_worker(WorkerConfig(
            index=w.index, instance=self.instance,
            regions=[s.region.name for s in self.workers],
            listen_fd=self._listener.fileno(), request_fd=w.request_efd.fileno(),
            event_fd=w.event_efd.fileno(), alive_fd=self._alive_r,
            heartbeat=c.heartbeat, frame_max=c.frame_max, channel_max=c.channel_max,
            max_message_size=c.max_message_size, log_level=c.log_level,
            loopback_users=c.loopback_users, cluster_name=node_name(self.port),
            trace_dir=c.trace or "",
            permissions=self.permissions, topic_permissions=self.topic_permissions,
            impersonators=self.user_admin.impersonators(), vhosts=list(self.dispatcher.vhosts.by_name),
            vhost_limits=self.dispatcher.limits.vhosts, user_limits=self.dispatcher.limits.users,
            data_dir=str(self.durability.path) if self.durability is not None else "",
            tls_listen_fd=self._tls_listener.fileno() if self._tls_listener is not None else -1,
            tls_cert=c.tls_cert or "", tls_key=c.tls_key or "", tls_ca=c.tls_ca or "",
            tls_verify_peer=c.tls_verify_peer, tls_fail_if_no_peer_cert=c.tls_fail_if_no_peer_cert,
        ), self.users)

    def _forget(self, w: WorkerSlot, *, replacement_awaited: bool = False) -> None:
        """Seed failure model: a dead worker's consumers and unacked messages
        are released, and its region is made ready for a replacement. Its peers
        leave new connections to the replacement (a starting mark) if it is
        awaited, else they stop leaving connections to this region."""
        w.ready = False
        w.corrupt = False  # its rings are reset below
        if replacement_awaited:
            w.region.mark_starting(self.config.start_grace)
        else:
            w.region.connections = NOT_ACCEPTING
        # Records it finished writing still count: acks settle, publishes route.
        try:
            self._apply_all(w)
        except RingCorrupt as exc:
            log.error("worker %d: request ring corrupt (%s); its last records are lost", w.index, exc)
        self.dispatcher.worker_died(w.index)
        self.dispatcher.limits.forget_worker(w.index)
        self._check_deadline()  # its channels' deliveries go back over the timer's next ticks
        w.pending.clear()
        w.unapplied.clear()
        w.region.request_ring.reset()
        w.region.event_ring.reset()
        w.region.clear_slots()
        w.arena_touched = True
        swept = w.region.arena.sweep(self.dispatcher.live_offsets(w.index))
        if swept:
            log.info("worker %d: reclaimed %d unfinished body block(s)", w.index, swept)
        self.flush()

    def _free_body(self, region: int, offset: int) -> None:
        w = self.workers[region]
        w.arena_touched = True
        w.region.arena.free(offset)

    # ------------------------------------------------------------ the rings

    def _step(self) -> bool:
        """One turn of the ring loop: a bounded step of every worker's requests in ring order,
        the timer when due, one flush. True while work is left (the loop turns again at once,
        after trio's tasks have had their turn)."""
        busy = applied = False
        d = self.dispatcher
        run_pending = d.run_pending
        for w in self.workers:
            ring = w.region.request_ring
            try:
                batch = w.unapplied or (ring.get_all_nowait(BATCH) if not w.corrupt else [])
            except RingCorrupt as exc:
                log.error("worker %d: request ring: %s", w.index, exc)
                w.corrupt = True  # nothing more is read from it until _forget resets it
                w.kill()
                continue
            if batch or run_pending(w.index):
                if not applied:
                    d.begin_batch(time.monotonic())
                self._apply_records(w, batch, STEP_WORK)
                applied = True
                busy = busy or bool(w.unapplied) or run_pending(w.index) or not ring.is_empty()
        if applied:  # the turn's rings are one batch: its dead letters, credit and deadline
            d.end_batch()
            self._check_deadline()
        now = time.monotonic()
        ticked = now >= self._deadline
        if ticked:
            self._tick(now)
        if applied or ticked or self._backlogged:
            self.flush()
        return busy or now >= self._deadline

    def _has_work(self) -> bool:
        """A ring has records (asked once sleep is announced: ipc.wakeup's handshake)."""
        for w in self.workers:
            if not (w.corrupt or w.region.request_ring.is_empty()):
                return True
        return False

    def _timeout(self) -> float:
        """How long the ring loop may sleep: until the timer's tick, or a full event ring's
        next try."""
        delay = self._deadline - time.monotonic()
        return max(0.0, min(delay, BACKLOG_RETRY) if self._backlogged else delay)

    def _apply_all(self, w: WorkerSlot) -> None:
        """Everything worker k's ring holds, what a step left over first."""
        while True:
            batch = w.unapplied or w.region.request_ring.get_all_nowait(BATCH)
            if not batch and not self.dispatcher.run_pending(w.index):
                return
            self._apply(w, batch)

    def _apply(self, w: WorkerSlot, batch: list[bytes], work: int | None = None) -> None:
        """``batch`` as one dispatcher batch of its own (``_apply_records``); the ring loop's
        turn makes one batch of all its rings instead (``_step``)."""
        d = self.dispatcher
        d.begin_batch(time.monotonic())
        self._apply_records(w, batch, work)
        d.end_batch()
        self._check_deadline()

    def _apply_records(self, w: WorkerSlot, batch: list[bytes], work: int | None = None) -> None:
        """Apply ``batch`` (one step) in order, after what is left of a PublishRun the last
        step stopped; with ``work``, only until that much is done (STEP_WORK), keeping the rest
        in ``w.unapplied`` (and the dispatcher) for the next step. Inside the caller's
        dispatcher batch."""
        decode = self.codec.decode_request
        d = self.dispatcher
        d.work = 0
        d.work_limit = work
        w.unapplied = batch
        if d.run_pending(w.index):
            self._apply_one(w, None)
        for i, raw in enumerate(batch):
            if d.run_pending(w.index) or (work is not None and d.work >= work):
                w.unapplied = batch[i:]
                break
            rec = decode(raw)
            if isinstance(rec, r.Hello):
                self._hello(w, rec)
            self._apply_one(w, rec)
        else:
            w.unapplied = []
        d.work_limit = None  # what else runs meanwhile (a dead worker's requeue) is not a step

    def _check_deadline(self) -> None:
        """Bring the timer's next tick forward if the dispatcher's next deadline is earlier (a
        request, or a dead worker's requeue, left work for it)."""
        deadline = self.dispatcher.next_deadline()
        if deadline is not None and deadline < self._deadline:
            self._deadline = deadline

    def _apply_one(self, w: WorkerSlot, rec: r.Request | None) -> None:
        """Apply ``rec`` (None: go on with the worker's stopped PublishRun); a bug is logged
        and costs the request's connection, never the supervisor."""
        try:
            if rec is None:
                self.dispatcher.resume_run(w.index)
            else:
                self.dispatcher.handle(w.index, rec)
        except Exception:
            log.exception("worker %d: failed to apply %r", w.index, rec)
            if rec is not None:
                self.dispatcher.internal_error(w.index, rec)

    def flush(self) -> None:
        """Move every outbox into its event ring and set notify slots; wake
        each worker that sleeps (and only those). Durable topology the batch changed is on
        disk first. Standing pulls that were woken run first (their deliveries go too)."""
        self.dispatcher.serve_standing()
        if self.durability is not None:
            self.durability.save()
        encode = self.codec.encode
        self._backlogged = False
        for w in self.workers:
            out = self.dispatcher.outbox[w.index]
            slots = self.dispatcher.notify[w.index]
            if not (out or slots or w.pending):
                continue
            if out:
                w.pending.extend(encode(e) for e in out)
                out.clear()
            if w.pending:
                try:
                    written = w.region.event_ring.put_many_nowait(w.pending)
                except RingCorrupt as exc:
                    log.error("worker %d: event ring: %s", w.index, exc)
                    w.kill()
                    continue
                del w.pending[:written]
                if w.pending:
                    self._backlogged = True  # the ring loop offers the rest soon (BACKLOG_RETRY)
            for slot in slots:
                w.region.set_slot(slot)
            slots.clear()
            wake_if_sleeping(w.region.worker_sleeping, w.event_efd)

    def _tick(self, now: float) -> None:
        """Message TTL, queue x-expires and held messages: the timer's tick, at the next
        deadline and at least every IDLE_TICK. Each tick is a bounded step: while expired
        messages or purged and deleted queues' bodies are left over, the deadline is now and
        the ring loop ticks again after the other work of its turn."""
        deadline = self.dispatcher.tick(now)
        self._deadline = now + IDLE_TICK if deadline is None else min(deadline, now + IDLE_TICK)
        if self.dispatcher.trace is not None:
            self.dispatcher.trace.writer.maybe_flush()
        if now >= self._forget_pages_at:
            self._forget_pages_at = now + FORGET_PAGES_INTERVAL
            for w in self.workers:
                if w.arena_touched:  # else there is nothing to drop (at rest, say)
                    w.arena_touched = False
                    w.region.forget_arena_pages()
            self._sample()  # tracing.procs.SAMPLE_INTERVAL_S is FORGET_PAGES_INTERVAL too

    def _sample(self) -> None:
        """--trace: the supervisor's and each worker's CPU and memory, in the trace directory's
        ``proc`` table (the report's CPU and memory charts: a point a second, at a tick)."""
        if self.samples is not None:  # a few /proc reads per process: ~0.1 ms each
            pids = {"supervisor": os.getpid()}
            pids.update((f"worker{w.index}", w.process.pid) for w in self.workers
                        if w.process is not None and w.process.returncode is None)
            self.samples.sample_pids(pids)

    # ------------------------------------------------------------ readiness

    def _hello(self, w: WorkerSlot, rec: r.Hello) -> None:
        w.ready = True
        log.info("worker %d ready (pid %d)", w.index, rec.pid)
        if self.dispatcher.limits.vhosts or self.dispatcher.limits.users:  # a restarted worker
            self.dispatcher.outbox[w.index].append(self.dispatcher.limits.for_worker(w.index))
        self._sample()
        if all(s.ready for s in self.workers):
            self._write_ready_file()

    def _management_settings(self) -> dict[str, object]:
        """What the management process is told at each start (management.process)."""
        c = self.config
        return {"control_path": self.control_path, "amqp_host": c.host, "amqp_port": self.port,
                "heartbeat": c.heartbeat, "frame_max": c.frame_max, "channel_max": c.channel_max,
                "data_dir": str(self.durability.path) if self.durability is not None else "",
                "log_level": c.log_level, "alive_fd": self._alive_r, "users": self.users,
                "user_tags": self.user_admin.tags, "user_limits": self.dispatcher.limits.users}

    def _shovel_settings(self) -> dict[str, object]:
        """What the links process is told at each start (links.process; the parameters, with
        their passwords, go on its stdin)."""
        c = self.config
        host = "127.0.0.1" if c.host in ("", "0.0.0.0") else "::1" if c.host == "::" else c.host
        return {"control_path": self.control_path, "amqp_host": host, "amqp_port": self.port,
                "log_level": c.log_level, "alive_fd": self._alive_r}

    def _write_ready_file(self) -> None:
        path = self.config.ready_file
        if not path:
            return
        info = {
            "port": self.port,
            "supervisor_pid": os.getpid(),
            "worker_pids": [s.process.pid if s.process else 0 for s in self.workers],
            "instance": self.instance,
            "control": self.control_path,
            "management_port": self.management.port if self.management is not None else 0,
            "management_tls_port": self.management.tls_port if self.management is not None else 0,
            "tls_port": self._tls_listener.getsockname()[1] if self._tls_listener is not None else 0,
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)

