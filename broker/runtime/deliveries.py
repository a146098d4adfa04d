"""The dispatcher's deliveries: consumers on queues, their pulls and wake-ups, gets, settles.

A consumer is known to the domain as a :class:`QueueConsumer` keyed by ``(worker, consumer id,
slot)``: setting notify slot ``slot`` in that worker's shared memory is
``QueueConsumer#notifyWork`` (docs/design.md, notifyWork). The worker then pulls
(docs/design.md, Standing pull): what a pull takes is acquired by the consumer's channel
(:mod:`broker.runtime.open_channels`) until it is settled, or pinned when a browser took it.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from broker.constants import REPLY_TO
from broker.errors import InternalError
from broker.messages.message import drop_reference
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue import Queue
from broker.runtime.answers import Answers
from broker.runtime.arena_accounts import ArenaAccounts
from broker.runtime.credit_flow import CreditFlow
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.open_channels import Held, OpenChannels, Pin, Subscription
from broker.runtime.publishing import StepWork
from broker.topology.vhosts import VirtualHosts
from ipc import records as r


class Deliveries:
    """Consume, cancel, interest, pull, get and settle records, and the wake-ups they make."""

    def __init__(self, vhosts: VirtualHosts, step: StepWork, answers: Answers,
                 channels: OpenChannels, credit: CreditFlow, accounts: ArenaAccounts,
                 workers: int) -> None:
        self.vhosts = vhosts  # each request goes to its connection's vhost
        self.step = step
        self.answers = answers
        self.outbox = answers.outbox
        self.counts = answers.counts  # message statistics (broker.queues.message_counts)
        self.notify: list[list[int]] = [[] for _ in range(workers)]
        self._channels = channels
        self._subs = channels.subs  # (worker, consumer id) → Subscription, on the hot path
        self._credit = credit
        self._drop = accounts.drop
        # Standing pulls (r.Pull.standing): (worker, consumer id) → how many deliveries are
        # still asked for; those of them woken meanwhile are run before the flush.
        self._standing: dict[tuple[int, int], int] = {}
        self._to_serve: dict[tuple[int, int], None] = {}
        self.trace: DispatchTrace | None = None

    # ------------------------------------------------------------ consumers

    def consume(self, worker: int, rec: r.Consume) -> None:
        if rec.queue == REPLY_TO:
            q = self._reply_queue(worker, rec)
        else:
            q = self.vhosts.of(worker, rec.conn).queue(rec.queue, owner=(worker, rec.conn))
        consumer = QueueConsumer(
            (worker, rec.consumer, rec.slot), rec.tag, priority=rec.priority, acquiring=not rec.browse,
            exclusive=rec.exclusive, no_ack=rec.no_ack,
        )
        q.add_consumer(consumer)
        self._channels.subscribe(worker, rec.consumer, Subscription(consumer, q, (worker, rec.conn, rec.ch)))
        self.answers.reply(worker, rec, queue=q.name)
        if self.trace is not None:
            self.trace.consumed(q.name, worker, rec.consumer, rec.tag, rec.priority, rec.browse)
        if rec.interested:
            self.wake(q.set_notify_work_desired(consumer, True))

    def _reply_queue(self, worker: int, rec: r.Consume) -> Queue:
        """Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): the consuming channel
        gets a queue of its own, named for the requester's reply_to; it goes with
        the consumer (auto-delete) or the connection (exclusive)."""
        name = f"{REPLY_TO}.{secrets.token_urlsafe(18)}"
        return self.vhosts.of(worker, rec.conn).declare_queue(name, owner=(worker, rec.conn), exclusive=True,
                                        auto_delete=True, reserved=True)

    def cancel(self, worker: int, rec: r.Cancel) -> None:
        self.end_standing(worker, rec.consumer, answer=True)
        sub = self._channels.unsubscribe(worker, rec.consumer)
        if sub is not None:
            if self.trace is not None:
                self.trace.cancelled(sub.queue.name, worker, rec.consumer)
            self.wake(self.vhosts.remove_consumer(sub.queue, sub.consumer))
        self.answers.reply(worker, rec)

    def interest(self, worker: int, rec: r.Interest) -> None:
        if not rec.desired:
            self.end_standing(worker, rec.consumer, answer=True)
        sub = self._subs.get((worker, rec.consumer))
        if sub is not None:
            self.wake(sub.queue.set_notify_work_desired(sub.consumer, rec.desired))

    # ---------------------------------------------------------------- pulls

    def pull(self, worker: int, rec: r.Pull) -> None:
        """A pull sent before the consumer's last was answered (a backlog being worked off)
        may find that one's standing rest open (the queue ran dry meanwhile): it adds to it."""
        key = (worker, rec.consumer)
        sub = self._subs.get(key)
        if sub is None:  # cancelled while the pull was in flight
            self.outbox[worker].append(r.Pulled(rec.consumer, [], False, 0, rec.seq))
            return
        sub.pull_seq = rec.seq
        self._credit.pulled(key, rec.limited)  # credit flow: does its client limit it?
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
            self.wake(self.vhosts.drain())

    def end_standing(self, worker: int, cid: int, *, answer: bool, seq: int | None = None) -> None:
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
        queue = sub.queue
        store = queue.store
        redelivered = 0
        for entry in entries:
            if entry.redelivered:
                redelivered += 1
            if sub.consumer.acquiring:
                deliveries.append(self._channels.acquire(chan, entry))
                if store is not None and entry.message.stored is not None and not entry.redelivered:
                    store.delivered(queue.name, entry.message)  # first delivery: on record
            else:
                deliveries.append(self._channels.pin(chan, entry))
        # Message statistics: a browser's deliveries need no ack either.
        counts, q_counts, n = self.counts, queue.counts, len(entries)
        if sub.consumer.no_ack or not sub.consumer.acquiring:
            counts.deliver_no_ack += n
            q_counts.deliver_no_ack += n
        else:
            counts.deliver += n
            q_counts.deliver += n
        if redelivered:
            counts.redeliver += redelivered
            q_counts.redeliver += redelivered
        self.outbox[worker].append(r.Pulled(cid, deliveries, more, still_open, sub.pull_seq))
        if self.trace is not None:
            self.trace.pulled(worker, cid, sub.queue.name, entries)

    def get(self, worker: int, rec: r.Get) -> None:
        q = self.vhosts.of(worker, rec.conn).queue(rec.queue, owner=(worker, rec.conn))
        entry = q.get()
        counts, q_counts = self.counts, q.counts
        if entry is None:
            counts.get_empty += 1
            q_counts.get_empty += 1
            self.answers.answer(worker, rec.conn, rec.ch, r.GetEmpty(rec.conn, rec.ch))
            return
        if rec.no_ack:
            counts.get_no_ack += 1
            q_counts.get_no_ack += 1
        else:
            counts.get += 1
            q_counts.get += 1
        if entry.redelivered:
            counts.redeliver += 1
            q_counts.redeliver += 1
        delivery = self._channels.acquire(self._channels.channel((worker, rec.conn, rec.ch)), entry,
                                         basic_get=True)
        if q.store is not None and not entry.redelivered:  # first delivery: on record
            q.store.delivered(q.name, entry.message)
        self.answers.answer(worker, rec.conn, rec.ch,
                            r.GetOk(rec.conn, rec.ch, delivery, q.message_count))

    # -------------------------------------------------------------- settles

    def settle(self, worker: int, rec: r.Settle) -> None:
        self.step.work += len(rec.entries)
        chan = self._channels.get((worker, rec.conn, rec.ch))
        if chan is None:
            return
        action = rec.action
        client_ack = action == r.ACK  # a no-ack delivery's own settle is AUTO_ACK: not counted
        settles = client_ack or action == r.AUTO_ACK
        acked = 0
        for entry_id in rec.entries:
            held = chan.acquired.pop(entry_id, None)
            if held is None:
                continue  # the worker validates delivery tags; a stale id is harmless
            self._channels.released(held)
            if self.trace is not None and not isinstance(held, Pin):
                self.trace.settled(worker, held, action)
            if isinstance(held, Pin):
                self.unpin(held)
            elif settles:
                if client_ack:  # message statistics
                    held.queue.counts.ack += 1
                    acked += 1
                if woken := held.queue.settle(held):  # a plain queue's ack wakes nobody
                    self.wake(woken)
            elif action == r.REQUEUE:
                self.wake(held.queue.release(held))
            elif action == r.DROP:  # reject/nack requeue=false: dead-lettered if the queue says so
                self.wake(held.queue.discard(held))
            else:
                raise InternalError(f"unknown settle action {action}")
        if acked:
            self.counts.ack += acked

    def requeue(self, held: Held) -> None:
        """A closed channel's delivery goes back: an entry to its original position, a pin
        let go of."""
        if isinstance(held, Pin):
            self.unpin(held)
        else:
            self.wake(held.queue.release(held))

    def unpin(self, pin: Pin) -> None:
        drop_reference(pin.message, self._drop)

    # ------------------------------------------------------------ wake-ups

    def wake(self, consumers: Iterable[QueueConsumer]) -> None:
        """docs/design.md, notifyWork: the consumer's notify slot is set, or, when it has
        a standing pull, that pull runs (before the flush: ``serve_standing``)."""
        trace = self.trace
        woke = self._credit.woke
        now = self.vhosts.now
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

    def worker_died(self, worker: int) -> None:
        """Forget a dead worker's wake-ups and standing pulls."""
        self.notify[worker].clear()
        for key in [k for k in self._standing if k[0] == worker]:
            del self._standing[key]
