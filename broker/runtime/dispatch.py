"""The supervisor's side of the ring protocol: requests in, events out.

Theory of operation
-------------------
The supervisor is the single owner of queue state (docs/design.md, Processes). Every worker's
request ring is drained in order and each record is applied to the domain
(:class:`broker.topology.vhost.VirtualHost` of the connection's vhost, one of the broker's
:class:`broker.topology.vhosts.VirtualHosts`: a connection's ``ConnOpen`` says which) here.
Nothing in this module does IO: the answers are appended to a per-worker *outbox* and the
consumers to wake are appended to a per-worker *notify* list; the runtime (``broker.runtime.supervisor``)
writes outboxes into event rings, sets notify slots and kicks eventfds.

The :class:`Dispatcher` owns the request table and its parts, one module each: what is said back
(:mod:`broker.runtime.answers`), publishing (:mod:`broker.runtime.publishing`), deliveries --
consumers, pulls, gets, settles, wake-ups (:mod:`broker.runtime.deliveries`) --, what closing a
channel or connection undoes (:mod:`broker.runtime.teardown`) and the arenas' accounts
(:mod:`broker.runtime.arena_accounts`); the topology's requests it applies itself. Acquired
entries are tracked per channel ``(worker, conn, ch)`` (:mod:`broker.runtime.open_channels`) so
that a channel, connection or whole worker going away requeues exactly what it held, to its
original position.

Bodies never pass through here: a message carries its arena handle
``(region, offset, header_len, body_len)``; when the last reference to a
message goes, ``free_body(region, offset)`` hands the block back.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

from broker.constants import REPLY_TO
from broker.errors import AccessRefused, AMQPError, InternalError
from broker.messages.body_ref import ARENA_BODY_CODEC
from broker.messages.message import Message, PlainMessage, drop_reference
from broker.permissions import READ, TopicTable, refused_topic, topic_allowed
from broker.runtime.alarms import Alarms, QueuedCount
from broker.runtime.answers import Answers
from broker.runtime.arena_accounts import ArenaAccounts
from broker.runtime.credit_flow import (
    CREDIT_CHUNK,
    FLOW_BACKLOG,
    CreditFlow,
    Destination,
    QueueKey,
)
from broker.runtime.deliveries import Deliveries
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.limits import RuntimeLimits
from broker.runtime.listing import Listing, Listings
from broker.runtime.open_channels import OpenChannels
from broker.runtime.publishing import Publishing, StepWork
from broker.runtime.teardown import DETACH, RETURN, Teardown
from broker.storage.paging import Pager
from broker.topology.vhost import VirtualHost
from broker.topology.vhosts import DEFAULT_DESCRIPTION, DEFAULT_VHOST, VirtualHosts
from ipc import records as r

log = logging.getLogger("shoal.dispatch")

# How often (seconds of the runtime's clock, at most) the messages queued in all queues are
# counted for the supervisor's memory alarm (Alarms.check_queued): O(queues) each time.
QUEUED_CHECK_INTERVAL = 0.1
# ... counting this many queues or channels a step: a count under way goes on in the next
# steps, which the timer makes come at once.
QUEUED_COUNT_SLICE = 5000
COUNT = "count"  # the count's budget in the sliced work (broker.queues.sliced_work)

__all__ = ["CREDIT_CHUNK", "FLOW_BACKLOG", "Dispatcher", "Listing"]


class Dispatcher:
    """Applies worker requests to the virtual host; collects events and wake-ups."""

    def __init__(self, workers: int, free_body: Callable[[int, int], None], *,
                 now: float = 0.0, epoch_offset: float = 0.0,
                 default_vhost: str | None = DEFAULT_VHOST) -> None:
        # Time comes in from the runtime (monotonic seconds); epoch_offset turns it
        # into wall-clock time for x-death and held-message headers.
        # Plain queues may keep waiting messages as their body handles (ARENA_BODY_CODEC).
        self.vhosts = VirtualHosts(self._drop, now=now, epoch_offset=epoch_offset,
                                   body_codec=ARENA_BODY_CODEC)
        # The vhost a broker without stored definitions starts with (RabbitMQ's default_vhost);
        # None: none yet (a data directory's are restored from its definitions).
        if default_vhost is not None:
            self.vhosts.add(default_vhost).description = DEFAULT_DESCRIPTION
        self.answers = Answers(workers)
        self.outbox = self.answers.outbox
        self.confirms = self.answers.confirms
        self._channels = OpenChannels()  # consumers and unsettled deliveries per channel
        self._subs = self._channels.subs
        # The runtime's bounded steps (broker.runtime.supervisor.STEP_WORK): see StepWork.
        self._step = StepWork()
        # Memory alarm, per worker arena: bytes of messages held in region k; its publishers
        # are blocked at high_watermark and unblocked below low_watermark (hysteresis).
        self.alarms = Alarms(workers)  # broker.runtime.alarms: memory per arena, disk
        self.region_bytes = self.alarms.region_bytes
        self._credit = CreditFlow()  # publish credit due, and whether we are behind
        self.listings = Listings()  # shoal list-connections requests in progress
        self._accounts = ArenaAccounts(self.vhosts, self._channels, self.region_bytes,
                                       self.outbox, free_body)
        # Message bodies paged out of arenas past their mark (--data-dir; broker.storage.paging).
        self.pager = Pager(self.region_bytes, self._accounts.free,
                           lambda message: drop_reference(message, self._drop),
                           self._accounts.paged_body, self._channels.viewed)
        self._deliveries = Deliveries(self.vhosts, self._step, self.answers, self._channels,
                                      self._credit, self._accounts, workers)
        self.notify = self._deliveries.notify
        self._wake = self._deliveries.wake
        self._publishing = Publishing(self.vhosts, self._step, self.answers, self._credit,
                                      self.pager, self._accounts, self._wake, workers)
        self._teardown = Teardown(self.vhosts, self.answers, self._channels, self._deliveries)
        self._sliced = self.vhosts.sliced
        self._sliced.add_budget(COUNT, QUEUED_COUNT_SLICE)
        self._queued_checked = float("-inf")  # when the last count of them began
        self._queued_count: QueuedCount | None = None  # one under way
        self._trace: DispatchTrace | None = None
        # Vhost and user limits: max-queues checked here, the workers' use of the rest relayed
        self.limits = RuntimeLimits(self.outbox, lambda: self.vhosts.by_name)
        deliveries, publishing, teardown = self._deliveries, self._publishing, self._teardown
        self._handlers: dict[type, Callable[[int, Any], None]] = {
            r.Hello: self._hello,
            r.ConnOpen: self._conn_open,
            r.ConnClose: self._conn_close,
            r.LimitUsage: self.limits.usage_reported,
            r.ChanClose: teardown.chan_close,
            r.ExchangeDeclare: self._exchange_declare,
            r.ExchangeDelete: self._exchange_delete,
            r.ExchangeBind: self._exchange_bind,
            r.ExchangeUnbind: self._exchange_unbind,
            r.QueueDeclare: self._queue_declare,
            r.QueueBind: self._queue_bind,
            r.QueueUnbind: self._queue_unbind,
            r.QueuePurge: self._queue_purge,
            r.QueueDelete: self._queue_delete,
            r.Consume: deliveries.consume,
            r.Cancel: deliveries.cancel,
            r.Interest: deliveries.interest,
            r.Pull: deliveries.pull,
            r.Get: deliveries.get,
            r.Publish: publishing.publish,
            r.PublishRun: publishing.publish_run,
            r.Settle: deliveries.settle,
            r.Sync: self._sync,
            r.ArenaWait: self._accounts.arena_wait,
            r.PagedOut: lambda worker, rec: self.pager.paged_out(worker, rec.written),
            r.ConnectionsListed: lambda worker, rec: self.listings.listed(worker, rec),
        }

    # ------------------------------------------------------------ virtual hosts

    @property
    def vhost(self) -> VirtualHost:
        """The vhost "/" (what a connection that named none is on: a test's)."""
        return self.vhosts.by_name[DEFAULT_VHOST]

    def _conn_open(self, worker: int, rec: r.ConnOpen) -> None:
        self._channels.connection_opened((worker, rec.conn), rec.user)
        self.vhosts.opened((worker, rec.conn), rec.vhost)

    def _conn_close(self, worker: int, rec: r.ConnClose) -> None:
        self._teardown.conn_close(worker, rec)
        self.vhosts.closed((worker, rec.conn))

    def add_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str | None = None) -> tuple[VirtualHost, bool]:
        """rabbitmqctl add_vhost: the vhost, and whether it is new (an existing one's
        description and tags are updated, as PUT /api/vhosts/{name} does)."""
        created = name not in self.vhosts
        vhost = self.vhosts.add(name)
        if description or created:
            vhost.description = description
        if tags is not None:
            vhost.tags = list(tags)
        if default_queue_type:
            vhost.default_queue_type = default_queue_type
        return vhost, created

    def delete_vhost(self, name: str) -> None:
        """rabbitmqctl delete_vhost: it and everything in it go (the consumers of its queues
        are cancelled); its connections' requests get 320 until their workers close them."""
        self._teardown.cancel_all(self.vhosts.remove(name))

    # ------------------------------------------------------------ the parts' settings

    @property
    def trace(self) -> DispatchTrace | None:
        """Tracing (shoal serve --trace): the writer's hooks, else None; every hook is behind
        one ``is not None`` check."""
        return self._trace

    @trace.setter
    def trace(self, trace: DispatchTrace | None) -> None:
        self._trace = self._publishing.trace = self._deliveries.trace = trace
        self._teardown.trace = trace

    @property
    def work(self) -> int:
        """Work done in this step (StepWork), which the runtime sets to 0 as a step begins."""
        return self._step.work

    @work.setter
    def work(self, value: int) -> None:
        self._step.work = value

    @property
    def work_limit(self) -> int | None:
        """The most a step may do (None: no limit)."""
        return self._step.work_limit

    @work_limit.setter
    def work_limit(self, value: int | None) -> None:
        self._step.work_limit = value

    @property
    def return_slice(self) -> int:
        return self._sliced.slices[RETURN]

    @return_slice.setter
    def return_slice(self, n: int) -> None:
        self._sliced.slices[RETURN] = n

    @property
    def detach_slice(self) -> int:
        return self._sliced.slices[DETACH]

    @detach_slice.setter
    def detach_slice(self, n: int) -> None:
        self._sliced.slices[DETACH] = n

    @property
    def cancel_at_once(self) -> int:
        return self._teardown.cancel_at_once

    @cancel_at_once.setter
    def cancel_at_once(self, n: int) -> None:
        self._teardown.cancel_at_once = n

    @property
    def route_slice_min(self) -> int:
        return self._publishing.route_slice_min

    @route_slice_min.setter
    def route_slice_min(self, n: int) -> None:
        self._publishing.route_slice_min = n

    @property
    def queued_count_slice(self) -> int:
        return self._sliced.slices[COUNT]

    @queued_count_slice.setter
    def queued_count_slice(self, n: int) -> None:
        self._sliced.slices[COUNT] = n

    @property
    def worker_pids(self) -> list[int]:
        return self._publishing.worker_pids

    # ------------------------------------------------------------------ entry

    def handle(self, worker: int, rec: r.Request) -> None:
        """Apply one request from ``worker``'s ring (in ring order)."""
        try:
            self._handlers[type(rec)](worker, rec)
        except AMQPError as exc:
            self.answers.fail(worker, rec, exc)

    def run_pending(self, worker: int) -> bool:
        """A publish or PublishRun of ``worker`` paused at the step's limit: it goes on
        (``resume_run``) before any later request of that worker."""
        return worker in self._publishing.paused

    def resume_run(self, worker: int) -> None:
        """Go on with ``worker``'s publishes where the last step's limit paused them."""
        self._publishing.resume(worker)

    def serve_standing(self) -> None:
        """Run the standing pulls of the consumers woken since the last flush (the runtime
        calls this before it flushes), and route the dead letters they make."""
        self._deliveries.serve_standing()

    def _hello(self, worker: int, rec: r.Hello) -> None:
        """A worker (re)started: its Publish records are counted afresh (trace join key);
        a replacement learns that its arena is still over the memory watermark."""
        self._publishing.hello(worker, rec.pid)
        if self.alarms.told_blocked(worker):
            self.outbox[worker].append(r.Blocked(True, self.alarms.reason()))

    def begin_batch(self, now: float) -> None:
        """Requests of one ring batch happen at ``now`` (TTL, x-expires, x-death time); the
        batch is a step (``return_slice``, ``detach_slice``)."""
        self.vhosts.advance(now)
        self._teardown.step()

    def end_batch(self) -> None:
        """Route the dead letters the batch made (pull, get, release, discard can);
        block or unblock publishers around the memory high watermark."""
        if woken := self.vhosts.drain():
            self._wake(woken)
        self.flow_tick()

    def flow_tick(self, *, all_credit: bool = False) -> None:
        """Give back publish credit unless the supervisor is behind (broker.runtime.credit_flow);
        raise or clear each worker's memory alarm. Called after every batch and by the timer
        (so credit held back while nothing else arrives is released within a tick)."""
        if self._credit.due:
            for worker, grant in self._credit.grants(self._subs, self._reaches,
                                                     all_credit=all_credit,
                                                     now=self.vhosts.now).items():
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
            if self.vhosts.now < self._queued_checked + QUEUED_CHECK_INTERVAL:
                return
            self._queued_checked = self.vhosts.now
            self._queued_count = QueuedCount(list(self.vhosts.queues()),
                                             self._channels.open_channels)
            self._sliced.take(COUNT)  # one abandoned (``_queued_count`` cleared) goes
            self._sliced.add(COUNT, self._counting)
        self._sliced.refill(COUNT)
        self._sliced.run(COUNT)

    def _counting(self, n: int) -> tuple[int, bool]:
        """The count under way, ``n`` more (a job of the sliced work); the alarm once done."""
        count = self._queued_count
        if count is None:
            return 0, True
        if not count.step(n):
            return n, False
        self._queued_count = None
        self.alarms.check_queued(count.total, self.outbox)
        return n, True

    def queued_messages(self) -> int:
        """Messages waiting in all queues, each queue's copy counted, and deliveries not
        settled yet (the supervisor's memory alarm: a consumer without prefetch that never acks
        holds them all): a whole count at once, as the alarm's goes a slice per step."""
        count = QueuedCount(list(self.vhosts.queues()), self._channels.open_channels)
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

    def _reaches(self, conn: tuple[int, int], destination: Destination) -> list[QueueKey] | None:
        """The queues, (vhost, name), a publish of connection ``conn`` to ``destination`` is
        routed to now, in the vhost that connection opened (credit flow asks only while it is
        behind on a queue); None: it may reach any."""
        if destination is None:  # ANYWHERE
            return None
        vhost = self.vhosts.vhost_of_conn(conn)
        if vhost is None:  # a connection of no vhost here: it feeds none of its queues
            return []
        exchange_name, routing_key = destination
        if not exchange_name:
            return [(vhost.name, routing_key)]
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            return []
        return [(vhost.name, q.name) for q in vhost.router.route(exchange, PlainMessage(
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
        messages, free a slice of purged and deleted queues' bodies, tear down a slice of
        closed channels -- a bounded step (broker.topology.step_host). Returns the next
        deadline (None: nothing pending; ``now`` or earlier: more to do at once)."""
        self.vhosts.advance(now)
        self._teardown.step()
        self._teardown.run()
        outcome = self.vhosts.tick(now)
        self._wake(outcome.notify)
        self._teardown.cancel_all(outcome.cancelled)
        self.flow_tick(all_credit=True)
        return self.next_deadline()

    def next_deadline(self) -> float | None:
        """When the runtime's timer should next call :meth:`tick`: ``now`` while sliced work
        is left (closed channels' consumers and deliveries, a count of what is queued, the
        graveyard), else the virtual host's next deadline."""
        return self.vhosts.next_deadline()

    def internal_error(self, worker: int, rec: r.Request) -> None:
        """A request failed unexpectedly: close its connection with 541."""
        if hasattr(rec, "conn"):
            self.answers.fail(worker, rec, InternalError("internal error"))

    def worker_died(self, worker: int) -> None:
        """Forget a dead worker: its consumers leave every queue, its channels'
        unacked messages go back to their original positions, its connections'
        exclusive queues are deleted."""
        self._publishing.worker_died(worker)
        owners = self._channels.connections_on(worker)
        for q in self.vhosts.queues():
            owner = q.exclusive_owner
            if isinstance(owner, tuple) and owner[0] == worker:
                owners.add(owner)
        for owner in sorted(owners):
            self._teardown.conn_close(worker, r.ConnClose(conn=owner[1]), worker_died=True)
        self.vhosts.worker_gone(worker)
        self._teardown.worker_died(worker)
        self.outbox[worker].clear()
        self._deliveries.worker_died(worker)
        self._credit.forget_worker(worker)
        self._publishing.forget_worker(worker)
        self.pager.worker_gone(worker)
        self.confirms.forget(lambda key: key[0] == worker)
        self._accounts.worker_gone(worker)
        self.listings.worker_gone(worker)

    def live_offsets(self, region: int) -> set[int]:
        """Arena offsets in ``region`` still referenced by a queue or a channel, or by a
        purged or deleted queue's entry whose body is not freed yet (it will be, once)."""
        return self._accounts.live_offsets(region)

    def _sync(self, worker: int, rec: r.Sync) -> None:
        """The barrier a worker waits on (tx.commit, local replies): answered once the index
        log holds what came before it, so a commit-ok means the commit is on disk."""
        journal = self.vhosts.messages
        need = journal.mark if journal is not None and journal.mark > self.confirms.synced else 0
        if need:
            self.confirms.admit((worker, rec.conn, rec.ch), r.Reply(rec.conn, rec.ch, "sync"), need)
        else:
            self.answers.reply(worker, rec)

    def index_synced(self, mark: int) -> None:
        """The index log is on disk up to journal mark ``mark``: send the confirms it held."""
        journal = self.vhosts.messages
        if journal is not None:  # old index files wait for it (broker.storage.index_moves)
            journal.synced = max(journal.synced, mark)
        self.answers.synced(mark)

    def drop_unqueued(self, message: Message) -> None:
        """A message restored at start that no queue took: free its body."""
        self._drop(message)

    def _drop(self, message: Message) -> None:
        self._accounts.drop(message)

    def list_connections(self, request: int, workers: Iterable[int],
                         done: Callable[[], object]) -> Listing:
        """Ask ``workers`` for their connections; ``done`` is called once all answered."""
        return self.listings.start(request, workers, done, self.outbox)

    # ------------------------------------------------------------ exchanges

    def _exchange_declare(self, worker: int, rec: r.ExchangeDeclare) -> None:
        self.vhosts.of(worker, rec.conn).declare_exchange(
            rec.name, rec.type, passive=rec.passive, durable=rec.durable,
            auto_delete=rec.auto_delete, internal=rec.internal, arguments=rec.arguments,
        )
        self.answers.reply(worker, rec)

    def _exchange_delete(self, worker: int, rec: r.ExchangeDelete) -> None:
        self.vhosts.of(worker, rec.conn).delete_exchange(rec.name, if_unused=rec.if_unused)
        self.answers.reply(worker, rec)

    @property
    def topic_permissions(self) -> TopicTable:
        """The topic permissions checked here (broker.permissions; the supervisor's table,
        changed in place): publishes to and bindings from topic exchanges."""
        return self._publishing.topics

    @topic_permissions.setter
    def topic_permissions(self, topics: TopicTable) -> None:
        self._publishing.topics = topics
        self._publishing.users = self._channels.users

    def _check_binding_topic(self, worker: int, conn: int, source: str, key: str) -> None:
        """A binding key from a topic exchange against the user's topic read permission
        (rabbit_channel:binding_action: only when the source exists, else its 404 follows)."""
        x = self.vhosts.of(worker, conn).exchanges.get(source)
        if x is None or x.type != "topic":
            return
        user = self._channels.user_of((worker, conn))
        vhost = x.vhost
        if user is not None and not topic_allowed(self._publishing.topics, user, vhost, source,
                                                  key, READ):
            raise AccessRefused(refused_topic(key, source, vhost, user))

    def _exchange_bind(self, worker: int, rec: r.ExchangeBind) -> None:
        if self._publishing.topics:
            self._check_binding_topic(worker, rec.conn, rec.source, rec.routing_key)
        self.vhosts.of(worker, rec.conn).bind_exchange(rec.destination, rec.source,
                                                       rec.routing_key, rec.arguments)
        self.answers.reply(worker, rec)

    def _exchange_unbind(self, worker: int, rec: r.ExchangeUnbind) -> None:
        if self._publishing.topics:
            self._check_binding_topic(worker, rec.conn, rec.source, rec.routing_key)
        self.vhosts.of(worker, rec.conn).unbind_exchange(rec.destination, rec.source,
                                                         rec.routing_key, rec.arguments)
        self.answers.reply(worker, rec)

    # --------------------------------------------------------------- queues

    def _queue_declare(self, worker: int, rec: r.QueueDeclare) -> None:
        if rec.passive and rec.name == REPLY_TO:  # RabbitMQ: the pseudo-queue always "exists"
            self.answers.reply(worker, rec, queue=REPLY_TO)
            return
        vhost = self.vhosts.of(worker, rec.conn)
        if not rec.passive:
            self.limits.check_queue(vhost.name, vhost.queues, rec.name)
        q = vhost.declare_queue(
            rec.name, owner=(worker, rec.conn), passive=rec.passive, durable=rec.durable,
            exclusive=rec.exclusive, auto_delete=rec.auto_delete, arguments=rec.arguments,
            reserved=rec.server_named,  # the worker named it amq.gen-... (workers.access)
        )
        self.answers.reply(
            worker, rec, queue=q.name, message_count=q.message_count,
            consumer_count=q.consumer_count,
        )

    def _queue_bind(self, worker: int, rec: r.QueueBind) -> None:
        if self._publishing.topics:
            self._check_binding_topic(worker, rec.conn, rec.exchange, rec.routing_key)
        self.vhosts.of(worker, rec.conn).bind_queue(
            rec.queue, rec.exchange, rec.routing_key, rec.arguments, owner=(worker, rec.conn)
        )
        self.answers.reply(worker, rec)

    def _queue_unbind(self, worker: int, rec: r.QueueUnbind) -> None:
        if self._publishing.topics:
            self._check_binding_topic(worker, rec.conn, rec.exchange, rec.routing_key)
        self.vhosts.of(worker, rec.conn).unbind_queue(
            rec.queue, rec.exchange, rec.routing_key, rec.arguments, owner=(worker, rec.conn)
        )
        self.answers.reply(worker, rec)

    def _queue_purge(self, worker: int, rec: r.QueuePurge) -> None:
        count = self.vhosts.of(worker, rec.conn).purge_queue(rec.queue, owner=(worker, rec.conn))
        self.answers.reply(worker, rec, message_count=count)

    def _queue_delete(self, worker: int, rec: r.QueueDelete) -> None:
        count, consumers = self.vhosts.of(worker, rec.conn).delete_queue(
            rec.queue, owner=(worker, rec.conn), if_unused=rec.if_unused, if_empty=rec.if_empty
        )
        self._teardown.cancel_all(consumers)
        self.answers.reply(worker, rec, message_count=count)
