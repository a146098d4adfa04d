"""The dispatcher's publishes: a Publish or PublishRun record routed and queued, in bounded steps.

Each message goes one way (:meth:`Publishing._publish_one`): routed to its queues, counted in its
arena, registered for paging, returned or freed when unroutable, confirmed (behind the index
log's sync when it wrote records there), and its queues' consumers woken. A step
(``broker.runtime.supervisor.STEP_WORK``) may do at most ``work_limit`` units (:class:`StepWork`):
a run of publishes that reaches it pauses between two of them, and a publish to more queues
than the step has left (a fanout to thousands) is offered to a slice of them; what is left waits
as the worker's :class:`PausedPublish` and goes on (:meth:`Publishing.resume`) before any later
request of that worker.

Publish credit (``broker.runtime.credit_flow``) is counted once per record, when it arrives: a
publish that fails gives its credit back too.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from broker.errors import AccessRefused, AMQPError
from broker.messages.body_ref import pack_body_ref
from broker.messages.message import (
    FullMessage,
    Message,
    PageableMessage,
    PlainMessage,
    delivered_headers,
)
from broker.permissions import TopicTable, refused_topic
from broker.queues.consumer_manager import QueueConsumer
from broker.runtime.answers import Answers
from broker.runtime.arena_accounts import ArenaAccounts
from broker.runtime.credit_flow import ANYWHERE, CreditFlow
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.topic_verdicts import TopicVerdicts
from broker.storage.paging import Pager
from broker.topology.vhost import NO_ROUTE, PublishOutcome, Routing, VirtualHost
from broker.topology.vhosts import VirtualHosts
from ipc import records as r

# A publish routed to more queues than a step has left to do is offered to at least this many
# of them in the step (and to the rest in later ones): a publish to fewer is never split.
ROUTE_SLICE_MIN = 256
# Work a copy of a split publish counts for (an unsplit one's count 1): the queues of a fanout
# to thousands are cold in the cache (perf.bench_supervisor_slices, fanout-single and
# fanout-wide; perf/README.md).
ROUTE_COPY_WORK = 2


class StepWork:
    """The runtime's bounded step (``broker.runtime.supervisor.STEP_WORK``): work done since it
    last set ``work`` to 0 (a settled entry, a routed copy of a message; other requests are
    bounded by the batch), and the most a step may do (``work_limit``; None: no limit)."""

    __slots__ = ("work", "work_limit")

    def __init__(self) -> None:
        self.work = 0
        self.work_limit: int | None = None


class PausedPublish(NamedTuple):
    """A worker's publishes that a step's limit paused: the record's publishes from flat index
    ``start`` on (None: none after this one), and first, when ``routing`` is set, the rest of
    one publish's queues; the other fields are that publish's, for when its last queue has been
    offered it."""

    rec: r.Publish | r.PublishRun
    start: int | None
    routing: Routing | None = None
    message: Message | None = None
    offset: int = 0
    header_len: int = 0
    body_len: int = 0
    pageable: int = 0
    mark: int = 0
    expiration: str | None = None
    vhost: VirtualHost | None = None  # where ``routing`` routes (its connection's vhost)


class Publishing:
    """Publish and PublishRun records applied to the virtual host, a step's limit at a time."""

    def __init__(self, vhosts: VirtualHosts, step: StepWork, answers: Answers, credit: CreditFlow,
                 pager: Pager, accounts: ArenaAccounts,
                 wake: Callable[[Iterable[QueueConsumer]], None], workers: int) -> None:
        self.vhosts = vhosts  # each publish goes to its connection's vhost
        self.step = step
        self.answers = answers
        self.outbox = answers.outbox
        self.counts = answers.counts  # message statistics: a few attribute increments
        self._credit = credit
        self.pager = pager
        self.region_bytes = accounts.region_bytes
        self._free = accounts.free
        self._wake = wake
        self.route_slice_min = ROUTE_SLICE_MIN
        self.paused: dict[int, PausedPublish] = {}  # per worker: what goes on at its next step
        # Tracing (shoal serve --trace): the writer's hooks, else None.
        self.trace: DispatchTrace | None = None
        self.worker_pids = [0] * workers
        self._pub_seq = [0] * workers  # Publish records seen per worker incarnation
        self._ids = itertools.count(1)
        # Topic permissions (broker.permissions), the supervisor's table itself, with the
        # verdicts given so far (``topics``), and who logged in on each connection
        # (OpenChannels.users): set by the dispatcher. Empty, the publish path pays one
        # truthiness test.
        self._verdicts = TopicVerdicts({})
        self.users: dict[tuple[int, int], str] = {}

    @property
    def topics(self) -> TopicTable:
        return self._verdicts.table

    @topics.setter
    def topics(self, table: TopicTable) -> None:
        """Set, or set again once changed in place (``broker.runtime.permissions``): the
        verdicts kept so far are dropped."""
        self._verdicts = TopicVerdicts(table)

    def hello(self, worker: int, pid: int) -> None:
        """A worker (re)started: its Publish records are counted afresh (trace join key)."""
        self.worker_pids[worker] = pid
        self._pub_seq[worker] = 0

    # ------------------------------------------------------------- records

    def publish(self, worker: int, rec: r.Publish) -> None:
        self._spent(worker, rec)
        message, pageable, mark = self._message(
            worker, rec.exchange, rec.routing_key, rec.offset, rec.header_len, rec.body_len,
            rec.headers, rec.expiration, rec.priority, rec.body_at)
        self._publish_one(worker, rec, None, message, rec.offset, rec.header_len, rec.body_len,
                          pageable, mark, rec.expiration)

    def publish_run(self, worker: int, rec: r.PublishRun) -> None:
        """A worker's run of publishes alike but for their bodies (``ipc.records.PublishRun``):
        each routed and queued as its own Publish would be, in order, without a record each.
        One that fails (the exchange is gone, say) ends the run as it ends the channel: its
        body and those after it are freed."""
        self._spent(worker, rec)
        if self.trace is None:
            self._run_from(worker, rec, 0)
            return
        # Traced, each publish whole (tracing is for looking at, not for load): the step's
        # limit is not applied to the run.
        limit, self.step.work_limit = self.step.work_limit, None
        try:
            self._run_from(worker, rec, 0)
        finally:
            self.step.work_limit = limit

    def _spent(self, worker: int, rec: r.Publish | r.PublishRun) -> None:
        """The record's publish credit is due, counted as it arrives: one that fails gives its
        credit back too."""
        counts = self.counts
        if type(rec) is r.PublishRun:
            n = len(rec.bodies) // 3
            self._credit.spent((worker, rec.conn), n, (rec.exchange, rec.routing_key))
        else:
            n = 1
            self._credit.spent((worker, rec.conn), 1, (rec.exchange, rec.routing_key)
                               if rec.headers is None else ANYWHERE)  # type: ignore[union-attr]
        counts.publish += n
        if rec.confirm:
            counts.publish_confirm += n

    def _run_from(self, worker: int, rec: r.PublishRun, start: int) -> None:
        """The run's publishes from flat index ``start`` on, until the step's ``work_limit``
        (a fanout to thousands of queues makes each of them thousands of copies): then the
        rest waits in ``paused`` for the worker's next step."""
        bodies = rec.bodies
        step = self.step
        limit = step.work_limit
        message_of = self._message
        publish_one = self._publish_one
        for i in range(start, len(bodies), 3):
            if limit is not None and step.work >= limit and i > start:
                self.paused[worker] = PausedPublish(rec, i)
                return
            offset, header_len, body_len = bodies[i], bodies[i + 1], bodies[i + 2]
            message, pageable, mark = message_of(worker, rec.exchange, rec.routing_key, offset,
                                                 header_len, body_len)
            if not publish_one(worker, rec, i + 3, message, offset, header_len, body_len,
                               pageable, mark):
                return

    # ------------------------------------------------------------ one message

    def _message(self, worker: int, exchange: str, routing_key: str, offset: int,
                 header_len: int, body_len: int, headers: dict[str, object] | None = None,
                 expiration: str | None = None, priority: int | None = None,
                 body_at: tuple[int, int, int] | None = None) -> tuple[Message, int, int]:
        """The message a publish makes, whether it may be paged out, and the journal's mark
        before it (its confirm waits for the index records written after it)."""
        # The decoded names are interned, so a queue's million messages share one routing-key
        # string; a message without headers, expiration or priority is a PlainMessage and its
        # body handle one packed int.
        body_ref = pack_body_ref(worker, offset, header_len, body_len)
        exchange, routing_key = sys.intern(exchange), sys.intern(routing_key)
        journal = self.vhosts.messages
        mark = journal.mark if journal is not None else 0
        pager = self.pager
        pageable = pager.high and pager.registers(worker, header_len + body_len)
        trace = self.trace
        message: Message
        if (headers is None and expiration is None and priority is None and trace is None
                and body_at is None):
            message = (PageableMessage if pageable else PlainMessage)(
                exchange, routing_key, body_ref, body_len)
        else:  # the message id only matters to trace rows: the shared 0 unless tracing
            message = FullMessage(
                next(self._ids) if trace is not None else 0, exchange, routing_key, body_ref,
                body_len, headers, expiration=expiration, priority=priority,
            )
        if body_at is not None and journal is not None:  # persistent: its body is on disk
            message.stored = journal.new_body(worker, *body_at)
        if trace is not None:  # the join key of the worker's published row
            self._pub_seq[worker] += 1
            message.trace = (worker, self.worker_pids[worker], self._pub_seq[worker],
                             time.monotonic_ns())
        return message, pageable, mark

    def _publish_one(self, worker: int, rec: r.Publish | r.PublishRun, next_start: int | None,
                     message: Message, offset: int, header_len: int, body_len: int,
                     pageable: int, mark: int, expiration: str | None = None) -> bool:
        """Route ``message`` (the publish of ``rec`` before flat index ``next_start``, None: its
        last) to as many queues as the step has left: whether it is done (else it and the rest
        of ``rec`` wait in ``paused``)."""
        exchange = rec.exchange
        try:
            vhost = self.vhosts.of(worker, rec.conn)
            router = vhost.router  # exchange-to-exchange walks count as a step's work
            visited = router.visited if exchange else 0
            if self._verdicts.table and exchange:
                self._check_topic(worker, rec)
            outcome = vhost.publish(exchange, message,
                                    limit=self._route_limit() if exchange else None)
        except AMQPError:
            self._free(worker, offset, header_len + body_len)
            journal = self.vhosts.messages
            if message.stored is not None and journal is not None:
                journal.body_dropped(message.stored)
            if next_start is not None:
                self._drop_run(worker, rec, next_start)  # type: ignore[arg-type]
            raise
        if outcome.routing is not None:  # to more queues than the step has left: the rest later
            self._pause_routing(worker, PausedPublish(
                rec, next_start, outcome.routing, message, offset, header_len, body_len,
                pageable, mark, expiration, vhost), outcome)
            return False
        self.step.work += outcome.routed + (router.visited - visited if exchange else 0)
        self._published(worker, rec, message, outcome, offset, header_len, body_len, pageable,
                        mark, expiration)
        return True

    def _check_topic(self, worker: int, rec: r.Publish | r.PublishRun) -> None:
        """A topic exchange's routing key against the user's topic write permission
        (rabbit_channel:check_write_permitted_on_topic, after the 404 and internal checks,
        which vhost.publish makes: an exchange missing or internal is left to it). The verdict
        per user, exchange and routing key is kept until a permission changes
        (``broker.runtime.topic_verdicts``)."""
        x = self.vhosts.of(worker, rec.conn).exchanges.get(rec.exchange)
        if x is None or x.internal or x.type != "topic":
            return
        user = self.users.get((worker, rec.conn))
        vhost = x.vhost
        if user is not None and not self._verdicts.allowed(user, vhost, rec.exchange,
                                                           rec.routing_key):
            raise AccessRefused(refused_topic(rec.routing_key, rec.exchange, vhost, user))

    def _published(self, worker: int, rec: r.Publish | r.PublishRun, message: Message,
                   outcome: PublishOutcome, offset: int, header_len: int, body_len: int,
                   pageable: int, mark: int, expiration: str | None) -> None:
        """A publish was routed (``outcome``): the arena's count, paging, a basic.return or
        the free of an unroutable body, the confirm, the consumers to wake."""
        journal = self.vhosts.messages
        routed = outcome.routed
        if routed:
            self.counts.routed += routed
            self.region_bytes[worker] += header_len + body_len
            if pageable:
                self.pager.register(worker, message)
        elif message.stored is not None and journal is not None:
            journal.body_dropped(message.stored)
        if routed == 0:
            if rec.mandatory:
                self.counts.return_unroutable += 1
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
                self.counts.drop_unroutable += 1
                self._free(worker, offset, header_len + body_len)
        if rec.confirm:  # a queue refusing it (x-overflow reject-publish) is a nack
            # Index records written for it: the confirm waits until they are on disk.
            need = journal.mark if journal is not None and journal.mark > mark else 0
            self.answers.confirm(worker, r.Confirm(rec.conn, rec.ch, not outcome.rejected), need)
        if outcome.notify:
            self._wake(outcome.notify)

    def _drop_run(self, worker: int, rec: r.PublishRun, start: int) -> None:
        """Free the bodies of ``rec`` from flat index ``start`` on (a publish before failed)."""
        bodies = rec.bodies
        for j in range(start, len(bodies), 3):
            self._free(worker, bodies[j], bodies[j + 1] + bodies[j + 2])

    # ------------------------------------------------------------ bounded steps

    def _route_limit(self) -> int | None:
        """How many queues a publish may be offered to in what is left of this step; one
        routed to more is split."""
        limit = self.step.work_limit
        if limit is None:
            return None
        return max((limit - self.step.work) // ROUTE_COPY_WORK, self.route_slice_min)

    def _pause_routing(self, worker: int, paused: PausedPublish, outcome: PublishOutcome) -> None:
        """A publish was offered to some of its queues only (``outcome``, one slice): the rest
        wait for the next step, and so does what follows it (``paused.start``)."""
        self.step.work += outcome.routing.offered * ROUTE_COPY_WORK  # type: ignore[union-attr]
        if outcome.notify:
            self._wake(outcome.notify)
        self.paused[worker] = paused

    def resume(self, worker: int) -> None:
        """Go on with ``worker``'s publishes where the last step's limit paused them."""
        paused = self.paused.pop(worker)
        try:
            if paused.routing is not None and not self._route_on(worker, paused):
                return
            if paused.start is not None:
                self._run_from(worker, paused.rec, paused.start)  # type: ignore[arg-type]
        except AMQPError as exc:
            self.answers.fail(worker, paused.rec, exc)

    def _route_on(self, worker: int, paused: PausedPublish, *, whole: bool = False) -> bool:
        """Offer ``paused``'s publish to its next queues (``whole``: all that are left): whether
        it is done (else it waits in ``paused`` for the next step again)."""
        routing = paused.routing
        assert routing is not None and paused.message is not None
        assert paused.vhost is not None  # a deleted one's queues are gone: they get nothing
        outcome = paused.vhost.route_on(routing, None if whole else self._route_limit())
        if outcome.routing is not None:
            self._pause_routing(worker, paused, outcome)
            return False
        self.step.work += routing.offered * ROUTE_COPY_WORK
        self._published(worker, paused.rec, paused.message, outcome, paused.offset,
                        paused.header_len, paused.body_len, paused.pageable, paused.mark,
                        paused.expiration)
        return True

    def worker_died(self, worker: int) -> None:
        """A publish of it being offered to its queues a slice at a time is offered to the rest
        now (its confirm and wake-ups are cleared with the rest of the worker's)."""
        paused = self.paused.get(worker)
        if paused is not None and paused.routing is not None:
            self._route_on(worker, paused, whole=True)

    def forget_worker(self, worker: int) -> None:
        """Its ring was lost before the run was done: so is the run."""
        self.paused.pop(worker, None)
