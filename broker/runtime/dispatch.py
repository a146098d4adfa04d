"""The supervisor's side of the ring protocol: requests in, events out.

Theory of operation
-------------------
The supervisor is the single owner of queue state (DESIGN.md). Every worker's
request ring is drained in order and each record is applied to the domain
(:class:`broker.topology.vhost.VirtualHost`) here. Nothing in this module does IO: the
answers are appended to a per-worker *outbox* and the consumers to wake are
appended to a per-worker *notify* list; the runtime (``broker.runtime.supervisor``)
writes outboxes into event rings, sets notify slots and kicks eventfds.

A consumer is known to the domain as a :class:`QueueConsumer` keyed by
``(worker, consumer id, slot)``: setting notify slot ``slot`` in that
worker's shared memory is the seed's ``QueueConsumer#notifyWork``. Acquired entries are tracked per channel
``(worker, conn, ch)`` (:mod:`broker.runtime.open_channels`) so that a channel, connection or whole
worker going away requeues exactly what it held, to its original position.

Bodies never pass through here: a message carries its arena handle
``(region, offset, header_len, body_len)``; when the last reference to a
message goes, ``free_body(region, offset)`` hands the block back.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from broker.constants import REPLY_TO
from broker.errors import AMQPError, InternalError
from broker.messages.body_ref import (
    ARENA_BODY_CODEC,
    arena_block,
    body_log_at,
    pack_body_ref,
    unpack_body_ref,
)
from broker.messages.message import (
    FullMessage,
    Message,
    PageableMessage,
    PlainMessage,
    delivered_headers,
    drop_reference,
)
from broker.messages.message_journal import IndexSyncGate
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue import Queue, QueueEntry
from broker.runtime.alarms import Alarms
from broker.runtime.credit_flow import ANYWHERE, CREDIT_CHUNK, FLOW_BACKLOG, CreditFlow, Destination
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.listing import Listing, Listings
from broker.runtime.open_channels import (
    ChannelKey,
    ChannelLedger,
    Detaching,
    Held,
    OpenChannels,
    Pin,
    Returning,
    Subscription,
)
from broker.storage.paging import Pager
from broker.topology.vhost import NO_ROUTE, PublishOutcome, Routing, VirtualHost
from ipc import records as r

log = logging.getLogger("shoal.dispatch")

# Deliveries of closed channels requeued (or unpinned) per step (Overload: no single operation
# holds the supervisor for long). A channel without prefetch can hold a million; what a step
# leaves goes back over the next timer ticks, which come at once (``next_deadline``).
RETURN_SLICE = 1000
# Consumers of closed channels taken off their queues per step (~1.2 µs each warm, ~2.3 µs
# cold: a channel with 20,000 consumers held the supervisor 25-46 ms in one call). Meanwhile
# the rest stay on their queues, closed (``ChannelLedger.closed``): a standing pull of theirs is
# never served, and what their queue notified them of goes on to another consumer as each
# is taken off.
DETACH_SLICE = 512
# Consumers cancelled at once when their queue goes (the rest share DETACH_SLICE a step): a
# queue deleted with 20,000 consumers held the supervisor 17 ms.
CANCEL_AT_ONCE = 256
# A publish routed to more queues than a step has left to do is offered to at least this many
# of them in the step (and to the rest in later ones): a publish to fewer is never split.
ROUTE_SLICE_MIN = 256
# Work a copy of a split publish counts for (an unsplit one's count 1): the queues of a fanout
# to thousands are cold in the cache, ~2.4 µs a copy at 10,000 queues against ~0.6 µs at 1,000
# (perf.bench_supervisor_slices, fanout-single and fanout-wide).
ROUTE_COPY_WORK = 2
# How often (seconds of the runtime's clock, at most) the messages queued in all queues are
# counted for the supervisor's memory alarm (Alarms.check_queued): O(queues) each time.
QUEUED_CHECK_INTERVAL = 0.1
# ... counting this many queues or channels a step (100,000 of each took 40 ms in one call):
# a count under way goes on in the next steps, which the timer makes come at once.
QUEUED_COUNT_SLICE = 5000


class _Cancelling:
    """Consumers whose queue went away, still to be told (``consumers[at:]``)."""

    __slots__ = ("at", "consumers")

    def __init__(self, consumers: list[QueueConsumer]) -> None:
        self.consumers = consumers
        self.at = 0


class _QueuedCount:
    """A count of the messages in every queue and the deliveries held by every channel (the
    supervisor's memory alarm), a slice per step over the queues there were when it began, then
    the channels there were when those were done (a snapshot of 100,000 is ~1.7 ms): an alarm
    needs the order of magnitude, not one instant's exact figure."""

    __slots__ = ("at", "channels", "open_channels", "queues", "total")

    def __init__(self, queues: list[Queue], open_channels: Callable[[], list[ChannelLedger]]) -> None:
        self.queues = queues
        self.open_channels = open_channels
        self.channels: list[ChannelLedger] | None = None
        self.at = 0  # into queues, then into channels
        self.total = 0

    def step(self, n: int) -> bool:
        """Count ``n`` more; True once all are counted."""
        if self.channels is None:
            chunk = self.queues[self.at:self.at + n]
            self.total += sum(q.message_count for q in chunk)
            self.at += len(chunk)
            if self.at < len(self.queues) or len(chunk) == n:
                return False
            n -= len(chunk)
            self.channels, self.at = self.open_channels(), 0
        held = self.channels[self.at:self.at + n]
        self.total += sum(len(chan.acquired) for chan in held)
        self.at += len(held)
        return self.at >= len(self.channels)


class _Stopped:
    """A worker's publish that a step's limit stopped (``Dispatcher._runs``): a PublishRun's
    publishes from flat index ``start`` on, and first, when ``routing`` is set, the rest of
    one publish's queues (a fanout to thousands); ``published`` holds what ``_published``
    needs once that publish's last queue has been offered it."""

    __slots__ = ("published", "rec", "routing", "start")

    def __init__(self, rec: r.Publish | r.PublishRun, start: int | None,
                 routing: Routing | None = None, published: tuple[Any, ...] = ()) -> None:
        self.rec = rec
        self.start = start
        self.routing = routing
        self.published = published


__all__ = ["CREDIT_CHUNK", "FLOW_BACKLOG", "Dispatcher", "Listing"]


class Dispatcher:
    """Applies worker requests to the virtual host; collects events and wake-ups."""

    def __init__(self, workers: int, free_body: Callable[[int, int], None], *,
                 now: float = 0.0, epoch_offset: float = 0.0) -> None:
        self._free_body = free_body
        # Time comes in from the runtime (monotonic seconds); epoch_offset turns it
        # into wall-clock time for x-death and held-message headers.
        self.vhost = VirtualHost("/", on_drop=self._drop, now=now, epoch_offset=epoch_offset)
        self.vhost.body_codec = ARENA_BODY_CODEC  # plain queues may keep waiting messages as handles
        self.outbox: list[list[r.Event]] = [[] for _ in range(workers)]
        self.notify: list[list[int]] = [[] for _ in range(workers)]
        self._channels = OpenChannels()  # consumers and unsettled deliveries per channel
        self._subs = self._channels.subs  # (worker, consumer id) → Subscription, on the hot path
        # Exchange-to-exchange walks count as a step's work (exchanges visited), as routed copies do.
        self._router = self.vhost.router
        self._returning = self._channels.returning  # closed channels' deliveries still held
        # The runtime's bounded steps (broker.runtime.supervisor.STEP_WORK): work done since it last set
        # this to 0 (a settled entry, a routed copy of a message; other requests are bounded by
        # the batch), and the most a step may do (None: no limit). A PublishRun that reaches
        # the limit stops, as does a publish to more queues than the step has left; what is
        # left of them waits here, per worker, for its next step.
        self.work = 0
        self.work_limit: int | None = None
        self._runs: dict[int, _Stopped] = {}
        self.return_slice = RETURN_SLICE
        self.route_slice_min = ROUTE_SLICE_MIN
        self._return_budget = RETURN_SLICE  # what is left of it in this step
        self.detach_slice = DETACH_SLICE
        self.cancel_at_once = CANCEL_AT_ONCE
        self._detach_budget = DETACH_SLICE
        # Closed channels' consumers still on their queues, and consumers of deleted queues not
        # told yet: DETACH_SLICE of them a step.
        self._detaching: deque[Detaching | _Cancelling] = deque()
        # Standing pulls (r.Pull.standing): (worker, consumer id) → how many deliveries are
        # still asked for; those of them woken meanwhile are run before the flush.
        self._standing: dict[tuple[int, int], int] = {}
        self._to_serve: dict[tuple[int, int], None] = {}
        self._ids = itertools.count(1)
        self._handlers: dict[type, Callable[[int, Any], None]] = {
            r.Hello: self._hello,
            r.ConnOpen: self._conn_open,
            r.ConnClose: self._conn_close,
            r.ChanClose: self._chan_close,
            r.ExchangeDeclare: self._exchange_declare,
            r.ExchangeDelete: self._exchange_delete,
            r.ExchangeBind: self._exchange_bind,
            r.ExchangeUnbind: self._exchange_unbind,
            r.QueueDeclare: self._queue_declare,
            r.QueueBind: self._queue_bind,
            r.QueueUnbind: self._queue_unbind,
            r.QueuePurge: self._queue_purge,
            r.QueueDelete: self._queue_delete,
            r.Consume: self._consume,
            r.Cancel: self._cancel,
            r.Interest: self._interest,
            r.Pull: self._pull,
            r.Get: self._get,
            r.Publish: self._publish,
            r.PublishRun: self._publish_run,
            r.Settle: self._settle,
            r.Sync: self._sync,
            r.ArenaWait: self._arena_wait,
            r.PagedOut: lambda worker, rec: self.pager.paged_out(worker, rec.written),
            r.ConnectionsListed: lambda worker, rec: self.listings.listed(worker, rec),
        }
        # Tracing (shoal serve --trace): the writer's hooks, else None;
        # every hook below is behind one `is not None` check.
        self.trace: DispatchTrace | None = None
        self.worker_pids = [0] * workers
        self._pub_seq = [0] * workers  # Publish records seen per worker incarnation
        # Memory alarm, per worker arena: bytes of messages held in region k; its publishers
        # are blocked at high_watermark and unblocked below low_watermark (hysteresis).
        self.alarms = Alarms(workers)  # broker.runtime.alarms: memory per arena, disk
        self.region_bytes = self.alarms.region_bytes  # kept here, on the hot path
        self._queued_checked = float("-inf")  # when the last count of them began
        self._queued_count: _QueuedCount | None = None  # one under way
        self.queued_count_slice = QUEUED_COUNT_SLICE
        # A worker whose arena had no room for a publish: bytes it waits for, bytes freed since.
        self._arena_need = [0] * workers
        self._arena_freed = [0] * workers
        self._credit = CreditFlow()  # publish credit due, and whether we are behind
        # Publisher confirms waiting for the index log's sync (shoal serve --data-dir).
        self.confirms = IndexSyncGate()
        self.listings = Listings()  # shoal list-connections requests in progress
        # Message bodies paged out of arenas past their mark (--data-dir; broker.storage.paging).
        self.pager = Pager(self.region_bytes, self._free,
                           lambda message: drop_reference(message, self._drop), self._paged_body,
                           self._channels.viewed)

    # ------------------------------------------------------------------ entry

    def handle(self, worker: int, rec: r.Request) -> None:
        """Apply one request from ``worker``'s ring (in ring order)."""
        try:
            self._handlers[type(rec)](worker, rec)
        except AMQPError as exc:
            self._fail(worker, rec, exc)

    def run_pending(self, worker: int) -> bool:
        """A publish or PublishRun of ``worker`` stopped at the step's limit: it goes on
        (``resume_run``) before any later request of that worker."""
        return worker in self._runs

    def resume_run(self, worker: int) -> None:
        """Go on with ``worker``'s publishes where the last step's limit stopped them."""
        stop = self._runs.pop(worker)
        try:
            if stop.routing is not None and not self._route_on(worker, stop):
                return
            if stop.start is not None:
                self._run_publishes(worker, stop.rec, stop.start)  # type: ignore[arg-type]
        except AMQPError as exc:
            self._fail(worker, stop.rec, exc)

    def _route_limit(self, work: int | None = None) -> int | None:
        """How many queues a publish may be offered to in what is left of this step (``work``:
        done so far, when not ``self.work``); one routed to more is split."""
        limit = self.work_limit
        if limit is None:
            return None
        return max((limit - (self.work if work is None else work)) // ROUTE_COPY_WORK,
                   self.route_slice_min)

    def _route_on(self, worker: int, stop: _Stopped, *, whole: bool = False) -> bool:
        """Offer ``stop``'s publish to its next queues (``whole``: all that are left): whether
        it is done (else it waits in ``_runs`` for the next step again)."""
        routing = stop.routing
        assert routing is not None
        outcome = self.vhost.route_on(routing, None if whole else self._route_limit())
        if outcome.routing is not None:
            self._stop_routing(worker, stop, outcome)
            return False
        self.work += routing.offered * ROUTE_COPY_WORK
        message, offset, header_len, body_len, pageable, mark, expiration = stop.published
        self._published(worker, stop.rec, message, outcome, offset, header_len, body_len,
                        pageable, mark, expiration)
        return True

    def _hello(self, worker: int, rec: r.Hello) -> None:
        """A worker (re)started: its Publish records are counted afresh (trace join key);
        a replacement learns that its arena is still over the memory watermark."""
        self.worker_pids[worker] = rec.pid
        self._pub_seq[worker] = 0
        if self.alarms.told_blocked(worker):
            self.outbox[worker].append(r.Blocked(True, self.alarms.reason()))

    def begin_batch(self, now: float) -> None:
        """Requests of one ring batch happen at ``now`` (TTL, x-expires, x-death time); the
        batch is a step (``return_slice``)."""
        self.vhost.advance(now)
        self._return_budget = self.return_slice
        self._detach_budget = self.detach_slice

    def end_batch(self) -> None:
        """Route the dead letters the batch made (pull, get, release, discard can);
        block or unblock publishers around the memory high watermark."""
        if woken := self.vhost.drain():
            self._wake(woken)
        self.flow_tick()

    def flow_tick(self, *, all_credit: bool = False) -> None:
        """Give back publish credit unless the supervisor is behind (broker.runtime.credit_flow);
        raise or clear each worker's memory alarm. Called after every batch and by the timer
        (so credit held back while nothing else arrives is released within a tick)."""
        if self._credit.due:
            for worker, grant in self._credit.grants(self._subs, self._reaches,
                                                     all_credit=all_credit,
                                                     now=self.vhost.now).items():
                self.outbox[worker].append(grant)
        if self.pager.high:
            for region, bodies in self.pager.check().items():
                self.outbox[region].append(r.PageOut(bodies))
        if self.alarms.high_watermark:
            self.alarms.check_memory(self.outbox)
        if self.alarms.queued_high:
            self._count_queued()

    def _count_queued(self) -> None:
        """The supervisor's memory alarm: count what is queued and held (``queued_messages``)
        at most every QUEUED_CHECK_INTERVAL, ``queued_count_slice`` queues or channels a step."""
        count = self._queued_count
        if count is None:
            if self.vhost.now < self._queued_checked + QUEUED_CHECK_INTERVAL:
                return
            self._queued_checked = self.vhost.now
            count = self._queued_count = _QueuedCount(list(self.vhost.queues.values()),
                                                      self._channels.open_channels)
        if count.step(self.queued_count_slice):
            self._queued_count = None
            self.alarms.check_queued(count.total, self.outbox)

    def queued_messages(self) -> int:
        """Messages waiting in all queues, each queue's copy counted, and deliveries not
        settled yet (the supervisor's memory alarm: a consumer without prefetch that never acks
        holds them all): a whole count at once, as the alarm's goes a slice per step."""
        count = _QueuedCount(list(self.vhost.queues.values()), self._channels.open_channels)
        count.step(sys.maxsize)
        return count.total

    @property
    def behind(self) -> bool:
        """Publish credit is withheld from the publishers of a queue on which a consumer we woke
        still waits on a backlog, so its settles and pulls get the supervisor first."""
        return bool(self._credit.behind_on)

    def credit_withheld(self) -> dict[tuple[int, int], int]:
        """Grants held back per (worker, conn) since the start (the control socket's
        credit_flow)."""
        return dict(self._credit.withheld)

    def _reaches(self, destination: Destination) -> list[str] | None:
        """The names of the queues a publish to ``destination`` is routed to now (credit flow
        asks only while it is behind on a queue); None: it may reach any."""
        if destination is None:  # ANYWHERE
            return None
        exchange_name, routing_key = destination
        if not exchange_name:
            return [routing_key]
        exchange = self.vhost.exchanges.get(exchange_name)
        if exchange is None:
            return []
        return [q.name for q in self._router.route(exchange, PlainMessage(
            exchange_name, routing_key, None, 0))]

    def set_disk_alarm(self, active: bool) -> None:
        """The disk alarm (RabbitMQ's disk_free_limit): every worker's publishers block."""
        self.alarms.set_disk(active, self.outbox)

    @property
    def high_watermark(self) -> int:
        return self.alarms.high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self.alarms.high_watermark = value

    @property
    def low_watermark(self) -> int:
        return self.alarms.low_watermark

    @low_watermark.setter
    def low_watermark(self, value: int) -> None:
        self.alarms.low_watermark = value

    def tick(self, now: float) -> float | None:
        """The timer: expire messages, delete unused x-expires queues, release held
        messages, free a slice of purged and deleted queues' bodies -- a bounded step
        (broker.topology.step_host). Returns the next deadline (None: nothing pending; ``now`` or
        earlier: more to do at once)."""
        self.vhost.advance(now)
        self._return_budget = self.return_slice
        self._detach_budget = self.detach_slice
        self._detach_some()
        self._return_some()
        outcome = self.vhost.tick(now)
        self._wake(outcome.notify)
        self._cancel_all(outcome.cancelled)
        self.flow_tick(all_credit=True)
        return self.next_deadline()

    def next_deadline(self) -> float | None:
        """When the runtime's timer should next call :meth:`tick`: ``now`` while closed
        channels' deliveries are still to requeue, else the virtual host's next deadline."""
        if self._returning or self._detaching or self._queued_count is not None:
            return self.vhost.now
        return self.vhost.next_deadline()

    def internal_error(self, worker: int, rec: r.Request) -> None:
        """A request failed unexpectedly: close its connection with 541."""
        if hasattr(rec, "conn"):
            self._fail(worker, rec, InternalError("internal error"))

    def worker_died(self, worker: int) -> None:
        """Forget a dead worker: its consumers leave every queue, its channels'
        unacked messages go back to their original positions, its connections'
        exclusive queues are deleted."""
        # A publish of it being offered to its queues a slice at a time is offered to the rest
        # now, first (its confirm and wake-ups are cleared below with the rest).
        stop = self._runs.get(worker)
        if stop is not None and stop.routing is not None:
            self._route_on(worker, stop, whole=True)
        owners = self._channels.connections_on(worker)
        for q in self.vhost.queues.values():
            owner = q.exclusive_owner
            if isinstance(owner, tuple) and owner[0] == worker:
                owners.add(owner)
        for owner in sorted(owners):
            self._conn_close(worker, r.ConnClose(conn=owner[1]), worker_died=True)
        # Its closed channels' consumers all go now: its replacement numbers consumers from 1.
        self._detach_some(worker)
        self.outbox[worker].clear()
        self.notify[worker].clear()
        for key in [k for k in self._standing if k[0] == worker]:
            del self._standing[key]
        self._credit.forget_worker(worker)
        self._runs.pop(worker, None)  # its ring was lost before the run was done: so is the run
        self.pager.worker_gone(worker)
        self.confirms.forget(lambda key: key[0] == worker)
        self._arena_need[worker] = 0
        self.listings.worker_gone(worker)

    def live_offsets(self, region: int) -> set[int]:
        """Arena offsets in ``region`` still referenced by a queue or a channel, or by a
        purged or deleted queue's entry whose body is not freed yet (it will be, once)."""
        live: set[int] = set()
        refs = [ref for q in self.vhost.queues.values() for ref in q.body_refs()]
        refs.extend(self.vhost.buried_body_refs())
        for ref in refs:
            block = arena_block(ref)
            if block is not None and block[0] == region:  # None: paged out
                live.add(block[1])
        live.update(self._channels.held_offsets(region))
        return live

    # ------------------------------------------------------------- plumbing

    def _fail(self, worker: int, rec: r.Request, exc: AMQPError) -> None:
        class_id, method_id = exc.class_id, exc.method_id
        if not class_id:
            class_id, method_id = r.METHOD_IDS.get(type(rec), (0, 0))
        conn, ch = getattr(rec, "conn", 0), getattr(rec, "ch", 0)
        self._answer(worker, conn, ch,
                     r.Error(conn, ch, exc.reply_code, exc.reply_text, class_id, method_id))

    def _reply(self, worker: int, rec: Any, **fields: Any) -> None:
        if not getattr(rec, "nowait", False):
            self._answer(worker, rec.conn, rec.ch,
                         r.Reply(rec.conn, rec.ch, rec.__struct_config__.tag, **fields))

    def _answer(self, worker: int, conn: int, ch: int, event: r.Event) -> None:
        """An answer to channel (conn, ch): behind its held confirms if it has any."""
        if self.confirms and self.confirms.holds((worker, conn, ch)):
            self.confirms.admit((worker, conn, ch), event, 0)
        else:
            self.outbox[worker].append(event)

    def _sync(self, worker: int, rec: r.Sync) -> None:
        """The barrier a worker waits on (tx.commit, local replies): answered once the index
        log holds what came before it, so a commit-ok means the commit is on disk."""
        journal = self.vhost.messages
        need = journal.mark if journal is not None and journal.mark > self.confirms.synced else 0
        if need:
            self.confirms.admit((worker, rec.conn, rec.ch), r.Reply(rec.conn, rec.ch, "sync"), need)
        else:
            self._reply(worker, rec)

    def _wake(self, consumers: Iterable[QueueConsumer]) -> None:
        """seed: QueueConsumer#notifyWork: the consumer's notify slot is set, or, when it has
        a standing pull, that pull runs (before the flush: ``serve_standing``)."""
        trace = self.trace
        woke = self._credit.woke
        now = self.vhost.now
        standing = self._standing
        for c in consumers:
            worker, cid, slot = c.key
            key = (worker, cid)
            if key in standing:
                self._to_serve[key] = None
            else:
                self.notify[worker].append(slot)
            woke(key, now)
            if trace is not None:
                sub = self._subs.get(key)
                trace.notified(sub.queue.name if sub else "", worker, cid)

    def index_synced(self, mark: int) -> None:
        """The index log is on disk up to journal mark ``mark``: send the confirms it held."""
        if self.vhost.messages is not None:  # old index files wait for it (broker.storage.index_moves)
            self.vhost.messages.synced = max(self.vhost.messages.synced, mark)
        for (worker, _, _), event in self.confirms.release(mark):
            if type(event) is r.Confirm:
                _send_confirm(self.outbox[worker], event)
            else:
                self.outbox[worker].append(event)

    def drop_unqueued(self, message: Message) -> None:
        """A message restored at start that no queue took: free its body."""
        self._drop(message)

    def _drop(self, message: Message) -> None:
        if message.stored is not None and self.vhost.messages is not None:
            self.vhost.messages.body_dropped(message.stored)
        ref = message.body_ref
        if ref < 0:  # paged out: nothing left in the arena
            if message.stored is None and self.vhost.messages is not None:  # a transient one
                worker, segment, _, _ = body_log_at(ref)
                self.vhost.messages.segment_released(worker, segment)
            return
        region, offset, header_len, body_len = unpack_body_ref(ref)
        self.region_bytes[region] -= header_len + body_len
        self._free(region, offset, header_len + body_len)

    def _paged_body(self, worker: int, segment: int) -> None:
        """A transient body was paged out to ``worker``'s body log segment ``segment``."""
        if self.vhost.messages is not None:
            self.vhost.messages.segment_used(worker, segment)

    def _free(self, region: int, offset: int, size: int) -> None:
        """Hand an arena block back; wake its worker if a publish there waits for room."""
        self._free_body(region, offset)
        if self._arena_need[region]:
            self._arena_freed[region] += size
            if self._arena_freed[region] >= self._arena_need[region]:
                self._arena_need[region] = 0
                self.outbox[region].append(r.ArenaFreed())

    def list_connections(self, request: int, workers: Iterable[int],
                         done: Callable[[], object]) -> Listing:
        """Ask ``workers`` for their connections; ``done`` is called once all answered."""
        return self.listings.start(request, workers, done, self.outbox)

    def _arena_wait(self, worker: int, rec: r.ArenaWait) -> None:
        self._arena_need[worker] = rec.size
        self._arena_freed[worker] = 0

    # ------------------------------------------------- connections, channels

    def _conn_open(self, worker: int, rec: r.ConnOpen) -> None:
        self._channels.connection_opened((worker, rec.conn))

    def _conn_close(self, worker: int, rec: r.ConnClose, *, worker_died: bool = False) -> None:
        owner = (worker, rec.conn)
        self.confirms.forget(lambda key: key[:2] == owner)
        for ch in self._channels.close_connection(owner):
            self._release_channel((worker, rec.conn, ch))
        self._cancel_all(self.vhost.delete_owned_queues(owner, self._cancel_all, at_once=worker_died))

    def _chan_close(self, worker: int, rec: r.ChanClose) -> None:
        key = (worker, rec.conn, rec.ch)
        self.confirms.forget(lambda k: k == key)
        self._release_channel(key)
        # The barrier: whatever the worker receives for (conn, ch) before this
        # belongs to the closed channel, not to a reopened one of the same number.
        self.outbox[worker].append(r.Reply(rec.conn, rec.ch, "chclose"))

    def _release_channel(self, key: ChannelKey) -> None:
        chan = self._channels.close(key)
        if chan is None:
            return
        # Its consumers leave their queues as many as this step allows now, the rest over the
        # next steps (DETACH_SLICE), before what it held goes back.
        if chan.consumers:
            self._detaching.append(Detaching(key[0], chan))
            self._detach_some()
        # AMQP 0-9-1 §4.7: unacknowledged messages of a closed channel are requeued (to their
        # original positions): as many as this step allows now, the rest over the next steps.
        if chan.acquired:
            self._returning.append(Returning(key[0], chan.acquired))
            self._return_some()

    def _detach_some(self, worker: int | None = None) -> None:
        """Take closed channels' consumers off their queues, oldest channel first, while this
        step's ``detach_slice`` lasts; with ``worker`` (it died), all of that worker's."""
        detaching = self._detaching
        if worker is not None:
            for mine in [job for job in detaching
                         if isinstance(job, Detaching) and job.worker == worker]:
                self._detach(mine, len(mine.cids))
                detaching.remove(mine)
            return
        budget = self._detach_budget
        while detaching and budget > 0:
            job = detaching[0]
            if isinstance(job, Detaching):
                budget -= self._detach(job, budget)
                done = job.at == len(job.cids)
            else:
                budget -= self._cancel_some(job, budget)
                done = job.at == len(job.consumers)
            if done:
                detaching.popleft()
        self._detach_budget = budget

    def _detach(self, job: Detaching, n: int) -> int:
        """Take the next ``n`` of ``job``'s consumers off their queues; how many there were."""
        worker, chan = job.worker, job.chan
        cids = job.cids[job.at:job.at + n]
        job.at += len(cids)
        for cid in cids:
            sub = self._channels.forget(worker, cid, chan)
            if sub is not None:
                self._end_standing(worker, cid, answer=False)
                self._wake(self.vhost.remove_consumer(sub.queue, sub.consumer))
        return len(cids)

    def _return_some(self) -> None:
        """Requeue (or unpin) what closed channels held, oldest channel first and each in
        delivery order, while this step's ``return_slice`` lasts."""
        returning = self._returning
        budget = self._return_budget
        while returning and budget > 0:
            ret = returning[0]
            for held in itertools.islice(ret.rest, budget):
                budget -= 1
                ret.done += 1
                if self.trace is not None and isinstance(held, QueueEntry):
                    self.trace.requeued(held, ret.worker)
                self._channels.released(held)
                self._requeue(held)
            if ret.done == len(ret.held):
                returning.popleft()
                if ret.done > self.return_slice:  # a million-item dict freed at once: ~10 ms
                    self.vhost.discard(ret.held)  # the graveyard's, a slice per step
        self._return_budget = budget

    def _requeue(self, held: Held) -> None:
        if isinstance(held, Pin):
            self._unpin(held)
        else:
            self._wake(held.queue.release(held))

    def _unpin(self, pin: Pin) -> None:
        drop_reference(pin.message, self._drop)

    def _cancel_all(self, consumers: list[QueueConsumer]) -> None:
        """The broker cancels consumers whose queue went away (consumer_cancel_notify):
        CANCEL_AT_ONCE now, the rest DETACH_SLICE a step. Meanwhile a pull of theirs finds
        the deleted queue empty; nothing else of theirs reaches it."""
        job = _Cancelling(consumers)
        self._cancel_some(job, self.cancel_at_once)
        if job.at < len(consumers):
            self._detaching.append(job)

    def _cancel_some(self, job: _Cancelling, n: int) -> int:
        consumers = job.consumers[job.at:job.at + n]
        job.at += len(consumers)
        subs = self._subs
        for c in consumers:
            worker, cid, _ = c.key
            sub = subs.get((worker, cid))
            if sub is None or sub.consumer is not c:  # gone already (a replaced worker's id)
                continue
            self._channels.unsubscribe(worker, cid)
            if sub.chan.closed:  # its channel is gone, the worker forgot it: nothing to say
                self._end_standing(worker, cid, answer=False)
                continue
            self._end_standing(worker, cid, answer=True, seq=sub.pull_seq)
            self.outbox[worker].append(r.Cancelled(cid))
        return len(consumers)

    # ------------------------------------------------------------ exchanges

    def _exchange_declare(self, worker: int, rec: r.ExchangeDeclare) -> None:
        self.vhost.declare_exchange(
            rec.name, rec.type, passive=rec.passive, durable=rec.durable,
            auto_delete=rec.auto_delete, internal=rec.internal, arguments=rec.arguments,
        )
        self._reply(worker, rec)

    def _exchange_delete(self, worker: int, rec: r.ExchangeDelete) -> None:
        self.vhost.delete_exchange(rec.name, if_unused=rec.if_unused)
        self._reply(worker, rec)

    def _exchange_bind(self, worker: int, rec: r.ExchangeBind) -> None:
        self.vhost.bind_exchange(rec.destination, rec.source, rec.routing_key, rec.arguments)
        self._reply(worker, rec)

    def _exchange_unbind(self, worker: int, rec: r.ExchangeUnbind) -> None:
        self.vhost.unbind_exchange(rec.destination, rec.source, rec.routing_key, rec.arguments)
        self._reply(worker, rec)

    # --------------------------------------------------------------- queues

    def _queue_declare(self, worker: int, rec: r.QueueDeclare) -> None:
        if rec.passive and rec.name == REPLY_TO:  # RabbitMQ: the pseudo-queue always "exists"
            self._reply(worker, rec, queue=REPLY_TO)
            return
        q = self.vhost.declare_queue(
            rec.name, owner=(worker, rec.conn), passive=rec.passive, durable=rec.durable,
            exclusive=rec.exclusive, auto_delete=rec.auto_delete, arguments=rec.arguments,
        )
        self._reply(
            worker, rec, queue=q.name, message_count=q.message_count,
            consumer_count=q.consumer_count,
        )

    def _queue_bind(self, worker: int, rec: r.QueueBind) -> None:
        self.vhost.bind_queue(
            rec.queue, rec.exchange, rec.routing_key, rec.arguments, owner=(worker, rec.conn)
        )
        self._reply(worker, rec)

    def _queue_unbind(self, worker: int, rec: r.QueueUnbind) -> None:
        self.vhost.unbind_queue(
            rec.queue, rec.exchange, rec.routing_key, rec.arguments, owner=(worker, rec.conn)
        )
        self._reply(worker, rec)

    def _queue_purge(self, worker: int, rec: r.QueuePurge) -> None:
        count = self.vhost.purge_queue(rec.queue, owner=(worker, rec.conn))
        self._reply(worker, rec, message_count=count)

    def _queue_delete(self, worker: int, rec: r.QueueDelete) -> None:
        count, consumers = self.vhost.delete_queue(
            rec.queue, owner=(worker, rec.conn), if_unused=rec.if_unused, if_empty=rec.if_empty
        )
        self._cancel_all(consumers)
        self._reply(worker, rec, message_count=count)

    # ------------------------------------------------------------ consumers

    def _consume(self, worker: int, rec: r.Consume) -> None:
        if rec.queue == REPLY_TO:
            q = self._reply_queue(worker, rec)
        else:
            q = self.vhost.queue(rec.queue, owner=(worker, rec.conn))
        consumer = QueueConsumer(
            (worker, rec.consumer, rec.slot), rec.tag, priority=rec.priority, acquiring=not rec.browse,
            exclusive=rec.exclusive, no_ack=rec.no_ack,
        )
        q.add_consumer(consumer)
        self._channels.subscribe(worker, rec.consumer, Subscription(consumer, q, (worker, rec.conn, rec.ch)))
        self._reply(worker, rec, queue=q.name)
        if self.trace is not None:
            self.trace.consumed(q.name, worker, rec.consumer, rec.tag, rec.priority, rec.browse)
        if rec.interested:
            self._wake(q.set_notify_work_desired(consumer, True))

    def _reply_queue(self, worker: int, rec: r.Consume) -> Queue:
        """Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): the consuming channel
        gets a queue of its own, named for the requester's reply_to; it goes with
        the consumer (auto-delete) or the connection (exclusive)."""
        name = f"{REPLY_TO}.{secrets.token_urlsafe(18)}"
        return self.vhost.declare_queue(name, owner=(worker, rec.conn), exclusive=True,
                                        auto_delete=True, reserved=True)

    def _cancel(self, worker: int, rec: r.Cancel) -> None:
        self._end_standing(worker, rec.consumer, answer=True)
        sub = self._channels.unsubscribe(worker, rec.consumer)
        if sub is not None:
            if self.trace is not None:
                self.trace.cancelled(sub.queue.name, worker, rec.consumer)
            self._wake(self.vhost.remove_consumer(sub.queue, sub.consumer))
        self._reply(worker, rec)

    def _interest(self, worker: int, rec: r.Interest) -> None:
        if not rec.desired:
            self._end_standing(worker, rec.consumer, answer=True)
        sub = self._subs.get((worker, rec.consumer))
        if sub is not None:
            self._wake(sub.queue.set_notify_work_desired(sub.consumer, rec.desired))

    def _pull(self, worker: int, rec: r.Pull) -> None:
        """A pull sent before the consumer's last was answered (a backlog being worked off)
        may find that one's standing rest open (the queue ran dry meanwhile): it adds to it."""
        key = (worker, rec.consumer)
        sub = self._subs.get(key)
        if sub is None:  # cancelled while the pull was in flight
            self.outbox[worker].append(r.Pulled(rec.consumer, [], False, 0, rec.seq))
            return
        sub.pull_seq = rec.seq
        rest = self._standing.pop(key, 0)
        self._run_pull(worker, sub, rec.consumer, rec.max + rest, standing=rec.standing or rest > 0)

    def serve_standing(self) -> None:
        """Run the standing pulls of the consumers woken since the last flush (the runtime
        calls this before it flushes), and route the dead letters they make."""
        to_serve = self._to_serve
        while to_serve:
            for key in list(to_serve):
                del to_serve[key]
                budget = self._standing.pop(key, None)
                if budget is None:
                    continue
                sub = self._subs.get(key)
                if sub is None:  # gone meanwhile: the worker waits for the empty answer
                    self.outbox[key[0]].append(r.Pulled(key[1], [], False))
                else:
                    self._run_pull(key[0], sub, key[1], budget, standing=True)
            self._wake(self.vhost.drain())

    def _end_standing(self, worker: int, cid: int, *, answer: bool, seq: int | None = None) -> None:
        """A standing pull ends without deliveries: the consumer is no longer interested, is
        cancelled or its queue went away (``answer``: the worker waits for the empty
        ``Pulled`` that says so), or its channel closed (the worker forgot it). ``seq``: the
        consumer's last pull applied, when its subscription is gone already."""
        if self._standing.pop((worker, cid), None) is not None and answer:
            if seq is None:
                sub = self._subs.get((worker, cid))
                seq = sub.pull_seq if sub is not None else 0
            self.outbox[worker].append(r.Pulled(cid, [], False, 0, seq))

    def _run_pull(self, worker: int, sub: Subscription, cid: int, max_n: int, *,
                  standing: bool) -> None:
        chan = sub.chan
        if chan.closed:  # a standing pull of a closed channel's consumer not yet detached
            return
        entries, more = sub.queue.pull(sub.consumer, max_n)
        still_open = max_n - len(entries) if standing and not more else 0
        if still_open:
            self._standing[(worker, cid)] = still_open
            if not entries:
                return  # nothing to say: the pull stays open as it was
        deliveries = []
        store = sub.queue.store
        for entry in entries:
            if sub.consumer.acquiring:
                deliveries.append(self._channels.acquire(chan, entry))
                if store is not None and entry.message.stored is not None and not entry.redelivered:
                    store.delivered(sub.queue.name, entry.message)  # first delivery: on record
            else:
                deliveries.append(self._channels.pin(chan, entry))
        self.outbox[worker].append(r.Pulled(cid, deliveries, more, still_open, sub.pull_seq))
        if self.trace is not None:
            self.trace.pulled(worker, cid, sub.queue.name, entries)

    def _get(self, worker: int, rec: r.Get) -> None:
        q = self.vhost.queue(rec.queue, owner=(worker, rec.conn))
        entry = q.get()
        if entry is None:
            self._answer(worker, rec.conn, rec.ch, r.GetEmpty(rec.conn, rec.ch))
            return
        delivery = self._channels.acquire(self._channels.channel((worker, rec.conn, rec.ch)), entry,
                                         basic_get=True)
        if q.store is not None and not entry.redelivered:  # first delivery: on record
            q.store.delivered(q.name, entry.message)
        self._answer(worker, rec.conn, rec.ch, r.GetOk(rec.conn, rec.ch, delivery, q.message_count))

    # ----------------------------------------------------------- publishing

    def _publish(self, worker: int, rec: r.Publish) -> None:
        # Counted first: a publish that fails gives its credit back too.
        self._credit.spent((worker, rec.conn), 1, (rec.exchange, rec.routing_key)
                           if rec.headers is None else ANYWHERE)
        # Memory per queued message (S8, tracemalloc, 1 queue): the decoded names are interned,
        # so a queue's million messages share one routing-key string (459 -> 364 B); a message
        # without headers, expiration or priority is a PlainMessage and its body handle one
        # packed int (-> 232 B with QueueEntry's lazy id).
        body_ref = pack_body_ref(worker, rec.offset, rec.header_len, rec.body_len)
        exchange, routing_key = sys.intern(rec.exchange), sys.intern(rec.routing_key)
        message: Message
        journal = self.vhost.messages
        mark = journal.mark if journal is not None else 0
        pageable = self.pager.high and self.pager.registers(worker, rec.header_len + rec.body_len)
        if (rec.headers is None and rec.expiration is None and rec.priority is None
                and self.trace is None and rec.body_at is None):
            message = (PageableMessage if pageable else PlainMessage)(
                exchange, routing_key, body_ref, rec.body_len)
        else:  # the message id only matters to trace rows: the shared 0 unless tracing
            message = FullMessage(
                next(self._ids) if self.trace is not None else 0, exchange, routing_key,
                body_ref, rec.body_len, rec.headers, expiration=rec.expiration,
                priority=rec.priority,
            )
        if rec.body_at is not None and journal is not None:  # persistent: its body is on disk
            message.stored = journal.new_body(worker, *rec.body_at)
        if self.trace is not None:  # the join key of the worker's published row
            self._pub_seq[worker] += 1
            message.trace = (worker, self.worker_pids[worker], self._pub_seq[worker],
                             time.monotonic_ns())
        try:
            visited = self._router.visited if rec.exchange else 0
            outcome = self.vhost.publish(rec.exchange, message,
                                         limit=self._route_limit() if rec.exchange else None)
        except AMQPError:
            self._free(worker, rec.offset, rec.header_len + rec.body_len)
            if message.stored is not None and journal is not None:
                journal.body_dropped(message.stored)
            raise
        if outcome.routing is not None:  # to more queues than the step has left: the rest later
            self._stop_routing(worker, _Stopped(rec, None, outcome.routing, (
                message, rec.offset, rec.header_len, rec.body_len, pageable, mark, rec.expiration)),
                outcome)
            return
        self.work += outcome.routed + (self._router.visited - visited if rec.exchange else 0)
        self._published(worker, rec, message, outcome, rec.offset, rec.header_len, rec.body_len,
                        pageable, mark, rec.expiration)

    def _published(self, worker: int, rec: r.Publish | r.PublishRun, message: Message,
                   outcome: PublishOutcome, offset: int, header_len: int, body_len: int,
                   pageable: int, mark: int, expiration: str | None = None) -> None:
        """A publish was routed (``outcome``): the arena's count, paging, a basic.return or
        the free of an unroutable body, the confirm, the consumers to wake."""
        journal = self.vhost.messages
        routed = outcome.routed
        if routed:
            self.region_bytes[worker] += header_len + body_len
            if pageable:
                self.pager.register(worker, message)
        elif message.stored is not None and journal is not None:
            journal.body_dropped(message.stored)
        if routed == 0:
            if rec.mandatory:
                # Published with BCC: returned without it (re-encoded), as RabbitMQ returns it.
                reheader = (
                    (True, delivered_headers(message.headers or {}), expiration)
                    if message.reheadered else ()
                )
                self.outbox[worker].append(r.Returned(
                    rec.conn, rec.ch, NO_ROUTE, "NO_ROUTE", rec.exchange, rec.routing_key,
                    offset, header_len, body_len, *reheader,
                ))
            else:
                self._free(worker, offset, header_len + body_len)
        if rec.confirm:  # a queue refusing it (x-overflow reject-publish) is a nack
            confirm = r.Confirm(rec.conn, rec.ch, not outcome.rejected)
            # Index records written for it: the confirm waits until they are on disk.
            need = journal.mark if journal is not None and journal.mark > mark else 0
            if (not need and not self.confirms) or self.confirms.admit(
                    (worker, rec.conn, rec.ch), confirm, need):
                _send_confirm(self.outbox[worker], confirm)
        if outcome.notify:
            self._wake(outcome.notify)

    def _stop_routing(self, worker: int, stop: _Stopped, outcome: PublishOutcome) -> None:
        """A publish was offered to some of its queues only (``outcome``, one slice): the rest
        wait for the next step, and so does what follows it (``stop.start``)."""
        self.work += outcome.routing.offered * ROUTE_COPY_WORK  # type: ignore[union-attr]
        if outcome.notify:
            self._wake(outcome.notify)
        self._runs[worker] = stop

    def _publish_run(self, worker: int, rec: r.PublishRun) -> None:
        """A worker's run of publishes alike but for their bodies (``ipc.records.PublishRun``):
        each routed and queued as its own Publish would be, in order, without a record each.
        One that fails (the exchange is gone, say) ends the run as it ends the channel: its
        body and those after it are freed, their publish credit counted as the rest's."""
        bodies = rec.bodies
        if self.trace is not None:  # trace rows number each message's record: one at a time
            self._publish_each(worker, rec)
            return
        # Counted first, as _publish counts each.
        self._credit.spent((worker, rec.conn), len(bodies) // 3, (rec.exchange, rec.routing_key))
        self._run_publishes(worker, rec, 0)

    def _run_publishes(self, worker: int, rec: r.PublishRun, start: int) -> None:
        """The run's publishes from flat index ``start`` on, until the step's ``work_limit``
        (a fanout to thousands of queues makes each of them thousands of copies): then the
        rest waits in ``_runs`` for the worker's next step."""
        bodies = rec.bodies
        exchange, routing_key = sys.intern(rec.exchange), sys.intern(rec.routing_key)
        journal = self.vhost.messages
        pager = self.pager
        publish = self.vhost.publish
        limit = self.work_limit
        # The default exchange routes to one queue at most: never split (nothing to work out).
        split = limit is not None and rec.exchange != ""
        work = self.work  # kept here, written back when the run stops or ends
        router = self._router
        for i in range(start, len(bodies), 3):
            if limit is not None and work >= limit and i > start:
                self._runs[worker] = _Stopped(rec, i)
                self.work = work
                return
            offset, header_len, body_len = bodies[i], bodies[i + 1], bodies[i + 2]
            mark = journal.mark if journal is not None else 0
            pageable = pager.high and pager.registers(worker, header_len + body_len)
            message = (PageableMessage if pageable else PlainMessage)(
                exchange, routing_key, pack_body_ref(worker, offset, header_len, body_len),
                body_len)
            visited = router.visited if split else 0
            try:
                outcome = publish(rec.exchange, message,
                                  limit=self._route_limit(work) if split else None)
            except AMQPError:
                self.work = work
                self._drop_run(worker, rec, i)
                raise
            if outcome.routing is not None:
                self.work = work
                self._stop_routing(worker, _Stopped(rec, i + 3, outcome.routing, (
                    message, offset, header_len, body_len, pageable, mark, None)), outcome)
                return
            work += outcome.routed + (router.visited - visited if split else 0)
            self._published(worker, rec, message, outcome, offset, header_len, body_len,
                            pageable, mark)
        self.work = work

    def _publish_each(self, worker: int, rec: r.PublishRun) -> None:
        """The run as one Publish record after another."""
        # Each publish whole (tracing is for looking at, not for load): the step's limit is
        # not applied to the run.
        limit, self.work_limit = self.work_limit, None
        try:
            self._publish_traced(worker, rec)
        finally:
            self.work_limit = limit

    def _publish_traced(self, worker: int, rec: r.PublishRun) -> None:
        bodies = rec.bodies
        for i in range(0, len(bodies), 3):
            try:
                self._publish(worker, r.Publish(
                    rec.conn, rec.ch, rec.exchange, rec.routing_key, rec.mandatory, rec.confirm,
                    bodies[i], bodies[i + 1], bodies[i + 2], None))
            except AMQPError:  # _publish freed this one's body and counted its credit
                self._credit.spent((worker, rec.conn), (len(bodies) - i) // 3 - 1,
                                   (rec.exchange, rec.routing_key))
                self._drop_run(worker, rec, i + 3)
                raise

    def _drop_run(self, worker: int, rec: r.PublishRun, start: int) -> None:
        """Free the bodies of ``rec`` from flat index ``start`` on (its publish failed)."""
        bodies = rec.bodies
        for j in range(start, len(bodies), 3):
            self._free(worker, bodies[j], bodies[j + 1] + bodies[j + 2])

    def _settle(self, worker: int, rec: r.Settle) -> None:
        self.work += len(rec.entries)
        chan = self._channels.get((worker, rec.conn, rec.ch))
        if chan is None:
            return
        for entry_id in rec.entries:
            held = chan.acquired.pop(entry_id, None)
            if held is None:
                continue  # the worker validates delivery tags; a stale id is harmless
            self._channels.released(held)
            if self.trace is not None and not isinstance(held, Pin):
                self.trace.settled(worker, held, rec.action)
            if isinstance(held, Pin):
                self._unpin(held)
            elif rec.action == r.ACK:
                if woken := held.queue.settle(held):  # a plain queue's ack wakes nobody
                    self._wake(woken)
            elif rec.action == r.REQUEUE:
                self._wake(held.queue.release(held))
            elif rec.action == r.DROP:  # reject/nack requeue=false: dead-lettered if the queue says so
                self._wake(held.queue.discard(held))
            else:
                raise InternalError(f"unknown settle action {rec.action}")


def _send_confirm(outbox: list[r.Event], confirm: r.Confirm) -> None:
    """``confirm`` joins the outbox's last event when that is the same channel's confirm of the
    same kind (ack or nack): one record for a run of them."""
    if outbox:
        last = outbox[-1]
        if (type(last) is r.Confirm and last.ch == confirm.ch and last.conn == confirm.conn
                and last.ack == confirm.ack):
            outbox[-1] = r.Confirm(last.conn, last.ch, last.ack, last.count + confirm.count)
            return
    outbox.append(confirm)
