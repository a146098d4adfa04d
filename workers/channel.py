"""An AMQP channel (the seed's Session) on the worker side.

Theory of operation
-------------------
A channel turns client methods into request records for the supervisor and
the supervisor's events back into frames. The supervisor answers one
worker's requests in ring order, so the channel keeps a FIFO of
*expectations*: each request that gets a reply pushes the function that turns
that reply into the client's ``*-ok``. Methods answered locally (qos, flow,
confirm.select, recover) wait behind outstanding replies so the client sees
replies in the order it asked (AMQP 0-9-1 §2.2.2: a channel is serial).
The exchange and queue methods' records and -oks are ``workers.topology``'s.

Delivery tags are the channel's (``workers.delivery_tags``). Acks, nacks and
rejects become ``Settle`` records; an unknown tag is 406 PRECONDITION_FAILED,
as RabbitMQ replies.

No IO here: output goes through the handler's protocol object and the
worker's request outbox.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, ClassVar

from pamqp import commands as spec

from broker import errors
from broker.constants import REPLY_TO
from ipc import records as r
from workers import codec, topology
from workers.channel_owner import ChannelConfig, ChannelOwner, WorkerServices
from workers.confirm_gate import ConfirmGate
from workers.consumer_target import ConsumerTarget
from workers.delivery_tags import DeliveryTags
from workers.outgoing import (
    Ack,
    DeclareOk,
    Deliveries,
    Delivery,
    GetOk,
    Method,
    Nack,
    Outgoing,
    Return,
)
from workers.transaction import Transaction

_TRACE_OUTCOME = {r.ACK: "acked", r.REQUEUE: "requeued", r.DROP: "rejected"}

# A consumer target of one of these channels (ConsumerTarget is generic over its channel).
Target = ConsumerTarget["Channel"]


def _ids(method: Any) -> tuple[int, int]:
    index = getattr(method, "index", 0)
    return index >> 16, index & 0xFFFF


class Channel:
    """One AMQP channel of a client connection (the seed's Session): turns client methods into
    requests to the supervisor and its events into frames, in order; holds the channel's
    consumers, unacked deliveries, confirms and transaction."""

    def __init__(self, handler: ChannelOwner[Channel], number: int, config: ChannelConfig) -> None:
        self.handler = handler
        self.number = number
        self.conn_id = config.conn_id
        self.config = config
        self.closing = False
        self.flow_active = True
        self.confirm = False
        self.published = 0  # publish sequence numbers in confirm mode
        self.confirmed = 0  # confirms received from the supervisor
        self.acked_upto = 0  # confirms sent to the client
        self.confirm_gate: ConfirmGate | None = None  # confirms waiting for the body log
        self.prefetch = 0  # basic.qos global=false: for consumers created after it
        self.global_prefetch = 0  # basic.qos global=true: shared by the channel
        self.consumer_unacked = 0
        self.pull_reserved = 0  # credit held by this channel's pulls in flight
        self.last_queue = ""  # AMQP 0-9-1 §1.7.2.1: "" means the last declared queue
        self.reply_to = ""  # direct reply-to: this channel's reply queue, once consuming
        self.tx = False
        # A publish sent since the last request that may still produce a basic.return (mandatory)
        # or a confirm: a local reply then waits for a Sync (_local_reply).
        self.publishes_unanswered = False
        self._tx: Transaction[Target] = Transaction()
        self.tags: DeliveryTags[Target] = DeliveryTags()
        self.consumers: dict[str, Target] = {}
        # Replies owed to the client, in request order: (from_supervisor, fn).
        # A local answer (qos-ok, …) queued behind supervisor replies keeps its place.
        self._expect: deque[tuple[bool, Callable[[Any], None]]] = deque()
        # While a server-named queue.declare is unanswered, "" cannot be resolved:
        # later methods and publishes wait here, in order (RabbitMQ runs a channel's
        # methods one at a time).
        self._inbox: deque[Callable[[], None]] | None = None

    # ----------------------------------------------------------- plumbing

    @property
    def worker(self) -> WorkerServices[Channel]:
        return self.handler.worker

    @property
    def unacked(self) -> OrderedDict[int, tuple[int, Target | None]]:
        """Delivery tag → (entry, target) of what the client has not settled yet."""
        return self.tags.held

    @property
    def backpressured(self) -> bool:
        """The connection's output is backed up: consumers take nothing (ConsumerTarget.credit)."""
        return self.handler.backpressured

    def _request(self, rec: Any, on_reply: Callable[[Any], None] | None) -> None:
        self.worker.send(rec)
        if on_reply is not None:
            self.publishes_unanswered = False  # its reply comes after theirs
            self._expect.append((True, on_reply))

    def _send(self, method: Any) -> None:
        self._reply(Method(self.number, method))

    def _reply(self, event: Outgoing) -> None:
        """A reply to the client (a method, declare-ok, get-ok): after the acks owed for
        earlier publishes."""
        if self.confirmed > self.acked_upto:
            self.flush_confirms()
        self.handler.send(event)

    def _local_reply(self, method: Any) -> None:
        """Answer locally, but never ahead of a reply the supervisor still owes: a reply to
        an earlier request, or the basic.return / ack / nack of an earlier publish. For the
        latter a Sync goes through the supervisor first (it answers in ring order, after
        whatever those publishes produced)."""
        if self.publishes_unanswered:
            self.publishes_unanswered = False
            self._request(r.Sync(self.conn_id, self.number), _nothing)
        if self._expect:
            self._expect.append((False, lambda _: self._send(method)))
        else:
            self._send(method)

    def _settle(self, entries: list[int], action: int) -> None:
        if entries:
            self.worker.send(r.Settle(self.conn_id, self.number, entries, action))

    def _queue_name(self, name: str, method: Any) -> str:
        if name:
            return name
        if not self.last_queue:
            raise errors.NotFound("no previously declared queue", *_ids(method))
        return self.last_queue

    # ------------------------------------------------------ client methods

    def on_method(self, m: Any) -> None:
        if self._inbox is not None:
            self._inbox.append(lambda: self._dispatch(m))
            return
        self._dispatch(m)

    def _dispatch(self, m: Any) -> None:
        run = self._METHODS.get(type(m))
        if run is None:
            raise errors.NotImplemented_(f"{m.name} is not implemented", *_ids(m))
        run(self, m)

    def _exchange_method(self, m: Any) -> None:
        """exchange.declare, delete, bind, unbind (``workers.topology``)."""
        rec = topology.request(self.conn_id, self.number, m, "")
        self._request(rec, None if m.nowait else self._topology_ok)

    def _queue_declare(self, m: spec.Queue.Declare) -> None:
        rec = r.QueueDeclare(
            self.conn_id, self.number, m.queue, m.passive, m.durable, m.exclusive,
            m.auto_delete, dict(m.arguments or {}), m.nowait,
        )
        if m.queue:
            self.last_queue = m.queue
        self._request(rec, None if m.nowait else self._declare_ok)
        if not m.queue and not m.nowait:
            self._inbox = deque()  # "" is unknown until declare-ok names the queue

    def _queue_method(self, m: Any) -> None:
        """queue.bind, unbind (no nowait), purge, delete, on the queue named or the last
        declared one (``workers.topology``)."""
        rec = topology.request(self.conn_id, self.number, m, self._queue_name(m.queue, m))
        self._request(rec, None if getattr(m, "nowait", False) else self._topology_ok)

    def _topology_ok(self, rep: r.Reply) -> None:
        self._send(topology.ok(rep))

    def _declare_ok(self, rep: r.Reply) -> None:
        self.last_queue = rep.queue
        self._reply(DeclareOk(self.number, rep.queue, rep.message_count, rep.consumer_count))
        self._resume()

    def _resume(self) -> None:
        """Run the methods that waited (a server-named declare's name, a commit's sync)."""
        inbox, self._inbox = self._inbox, None
        while inbox and self._inbox is None and not self.closing:
            inbox.popleft()()
        if inbox and self._inbox is not None:  # another server-named declare: keep waiting
            self._inbox.extendleft(reversed(inbox))

    def _qos(self, m: spec.Basic.Qos) -> None:
        if m.prefetch_size:
            # RabbitMQ refuses a byte-based prefetch the same way.
            raise errors.NotImplemented_(f"prefetch_size!=0 ({m.prefetch_size})", *_ids(m))
        if m.global_:  # RabbitMQ: global=true is shared by the channel's consumers
            self.global_prefetch = m.prefetch_count
        else:  # ... and global=false applies to each consumer created after it
            self.prefetch = m.prefetch_count
        self.refresh_all()
        self._local_reply(spec.Basic.QosOk())

    def _consume(self, m: spec.Basic.Consume) -> None:
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self.consumers:
            raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'", *_ids(m))
        queue = self._queue_name(m.queue, m)
        if queue == REPLY_TO:  # RabbitMQ's texts
            if not m.no_ack:
                raise errors.PreconditionFailed("reply consumer cannot acknowledge", *_ids(m))
            if any(t.queue == REPLY_TO for t in self.consumers.values()):
                raise errors.PreconditionFailed("reply consumer already set", *_ids(m))
        args = m.arguments or {}
        priority = args.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise errors.PreconditionFailed("invalid arg 'x-priority' for basic.consume", *_ids(m))
        target = self.worker.new_target(
            tag, self, queue, no_ack=m.no_ack, browse=bool(args.get("x-browse", False)),
            prefetch=self.prefetch,
        )
        if target is None:
            raise errors.ResourceError("too many consumers on this worker", *_ids(m))
        self.consumers[tag] = target
        target.interested = target.credit() > 0
        rec = r.Consume(
            self.conn_id, self.number, target.id, target.slot, queue, tag, m.no_ack,
            m.exclusive, priority, target.browse, target.interested, m.nowait,
        )
        if m.nowait:
            self._request(rec, None)
            self._activate(target)
        else:
            self._request(rec, lambda rep: self._consume_ok(target, rep.queue))

    def _consume_ok(self, target: Target, queue: str = "") -> None:
        if target.queue == REPLY_TO:
            self.reply_to = queue
        self._send(spec.Basic.ConsumeOk(target.tag))
        self._activate(target)

    def _activate(self, target: Target) -> None:
        target.active = True
        self.refresh(target)

    def _cancel(self, m: spec.Basic.Cancel) -> None:
        tag = m.consumer_tag or ""
        target = self.consumers.pop(tag, None)
        if target is None:  # RabbitMQ answers cancel-ok for an unknown tag too
            if not m.nowait:
                self._local_reply(spec.Basic.CancelOk(tag))
            return
        target.active = False
        if target.queue == REPLY_TO:  # no reply consumer: reply_to is refused again
            self.reply_to = ""
        rec = r.Cancel(self.conn_id, self.number, target.id, m.nowait)
        if m.nowait:
            self._request(rec, None)
            self.worker.drop_target(target)
        else:
            self._request(rec, lambda rep: self._cancel_ok(target))

    def _cancel_ok(self, target: Target) -> None:
        self._send(spec.Basic.CancelOk(target.tag))
        self.worker.drop_target(target)

    def _get(self, m: spec.Basic.Get) -> None:
        rec = r.Get(self.conn_id, self.number, self._queue_name(m.queue, m), m.no_ack)
        self._request(rec, lambda ev: self._get_answer(ev, m.no_ack))

    def _get_answer(self, ev: r.GetOk | r.GetEmpty, no_ack: bool) -> None:
        if isinstance(ev, r.GetEmpty):
            self._send(spec.Basic.GetEmpty())
            return
        d = ev.delivery
        tag = self.tags.tag(d.entry, None, no_ack)
        header, body = self.worker.body(d)
        self._reply(GetOk(
            self.number, tag, d.redelivered, d.exchange, d.routing_key, ev.message_count,
            header, body,
        ))
        if self.worker.trace is not None:
            self.worker.trace.delivered(time.monotonic_ns(), d.entry, "", None, "", d.redelivered)
        if no_ack:
            self._settle([d.entry], r.ACK)

    def _ack(self, m: spec.Basic.Ack) -> None:
        self._settle_tags(m.delivery_tag, m.multiple, r.ACK, m)

    def _nack(self, m: spec.Basic.Nack) -> None:
        self._settle_tags(m.delivery_tag, m.multiple, r.REQUEUE if m.requeue else r.DROP, m)

    def _reject(self, m: spec.Basic.Reject) -> None:
        self._settle_tags(m.delivery_tag or 0, False, r.REQUEUE if m.requeue else r.DROP, m)

    def _recover(self, m: spec.Basic.Recover) -> None:
        self._recover_async(m)
        self._local_reply(spec.Basic.RecoverOk())

    def _recover_async(self, m: spec.Basic.Recover | spec.Basic.RecoverAsync) -> None:
        """Deprecated, no reply (aiormq sends it for basic_recover(nowait=True)): RabbitMQ
        (rabbit_channel) takes it as basic.recover without the recover-ok. Both redeliver what
        the channel holds unacked; requeue=false (redeliver to the same consumer) is not
        implemented there, and is 540 here too."""
        if not m.requeue:
            raise errors.NotImplemented_("requeue=false", *_ids(m))
        self._settle_tags(0, True, r.REQUEUE, m)

    def _confirm_select(self, m: spec.Confirm.Select) -> None:
        if self.tx:  # RabbitMQ's text
            raise errors.PreconditionFailed("cannot switch from tx to confirm mode", *_ids(m))
        self.confirm = True
        if not m.nowait:
            self._local_reply(spec.Confirm.SelectOk())

    def _tx_select(self, m: spec.Tx.Select) -> None:
        if self.confirm:
            raise errors.PreconditionFailed("cannot switch from confirm to tx mode", *_ids(m))
        self.tx = True
        self._local_reply(spec.Tx.SelectOk())

    def _check_tx(self, m: Any) -> None:
        if not self.tx:
            raise errors.PreconditionFailed("channel is not transactional", *_ids(m))

    def _tx_commit(self, m: spec.Tx.Commit) -> None:
        """Publish what the transaction held and settle its acks, in order; commit-ok
        once the supervisor has applied them all (the Sync barrier)."""
        self._check_tx(m)
        publishes, settles = self._tx.commit()
        for rec in publishes:
            self._send_publish(rec)
        for entries, action in settles:
            self._settle(entries, action)
        if any(rec.body_at is not None for rec in publishes):
            # Persistent messages: commit-ok once their bodies are on disk (then the Sync, whose
            # reply the supervisor holds until its index is); later methods wait meanwhile.
            self._inbox = deque()
            self.worker.after_body_sync(self._commit_synced)
            return
        self._commit()

    def _commit(self) -> None:
        self._request(r.Sync(self.conn_id, self.number), lambda rep: self._send(spec.Tx.CommitOk()))

    def _commit_synced(self) -> None:
        if self.closing:
            return
        self._commit()
        self._resume()

    def _tx_rollback(self, m: spec.Tx.Rollback) -> None:
        """Drop the held publishes; the held acks' messages are unacked again."""
        self._check_tx(m)
        self._discard_tx()
        settles = self._tx.take_settles()
        self.tags.give_back(settles)
        for _, _, target, _ in settles:
            if target is not None:
                target.unacked += 1
                self.consumer_unacked += 1
        self.refresh_all()
        self._local_reply(spec.Tx.RollbackOk())

    def _discard_tx(self) -> None:
        for rec in self._tx.take_publishes():
            self.worker.region.arena.free(rec.offset)

    def _flow(self, m: spec.Channel.Flow) -> None:
        self.flow_active = bool(m.active)
        self.refresh_all()
        self._local_reply(spec.Channel.FlowOk(self.flow_active))

    _METHODS: ClassVar[dict[type, Callable[[Channel, Any], None]]] = {
        spec.Exchange.Declare: _exchange_method,
        spec.Exchange.Delete: _exchange_method,
        spec.Exchange.Bind: _exchange_method,
        spec.Exchange.Unbind: _exchange_method,
        spec.Queue.Declare: _queue_declare,
        spec.Queue.Bind: _queue_method,
        spec.Queue.Unbind: _queue_method,
        spec.Queue.Purge: _queue_method,
        spec.Queue.Delete: _queue_method,
        spec.Basic.Qos: _qos,
        spec.Basic.Consume: _consume,
        spec.Basic.Cancel: _cancel,
        spec.Basic.Get: _get,
        spec.Basic.Ack: _ack,
        spec.Basic.Nack: _nack,
        spec.Basic.Reject: _reject,
        spec.Basic.Recover: _recover,
        spec.Basic.RecoverAsync: _recover_async,
        spec.Confirm.Select: _confirm_select,
        spec.Channel.Flow: _flow,
        spec.Tx.Select: _tx_select,
        spec.Tx.Commit: _tx_commit,
        spec.Tx.Rollback: _tx_rollback,
    }

    # ------------------------------------------------------ acknowledgements

    def _settle_tags(self, tag: int, multiple: bool, action: int, m: Any) -> None:
        taken = self.tags.take(tag, multiple)
        if not taken and not (multiple and tag == 0):
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}", *_ids(m))
        touched: set[Target] = set()
        for _, _, target in taken:
            if target is not None:
                target.unacked -= 1
                self.consumer_unacked -= 1
                touched.add(target)
        if self.worker.trace is not None:
            self.worker.trace.acked_many(time.monotonic_ns(), [e for _, e, _ in taken],
                                         _TRACE_OUTCOME[action])
        if self.tx:  # takes effect at tx.commit; tx.rollback gives them back
            self._tx.hold_settles(taken, action)
        else:
            self._settle([entry for _, entry, _ in taken], action)
        if self.global_prefetch:
            self.refresh_all()
        else:
            for target in touched:
                self.refresh(target)

    # ------------------------------------------------------- publishing

    def publish(self, exchange: str, routing_key: str, mandatory: bool, offset: int,
                header_len: int, body_len: int, headers: dict[str, Any] | None,
                expiration: str | None = None, priority: int | None = None) -> None:
        if self._inbox is not None:
            self._inbox.append(lambda: self.publish(
                exchange, routing_key, mandatory, offset, header_len, body_len, headers,
                expiration, priority))
            return
        if self.confirm:
            self.published += 1
        body_at = None
        log = self.worker.body_log
        if log is not None:  # --data-dir: a persistent message's body goes to disk now
            body_at = self.worker.store_body(offset, header_len, body_len)
            if body_at is not None and self.confirm:  # its ack waits for the log's sync
                if self.confirm_gate is None:
                    self.confirm_gate = ConfirmGate(self, log, self.worker.confirm_waiters)
                self.confirm_gate.expect(self.published)
        rec = r.Publish(
            self.conn_id, self.number, exchange, routing_key, mandatory, self.confirm,
            offset, header_len, body_len, headers, expiration, priority, body_at,
        )
        if self.tx:  # invisible until tx.commit
            self._tx.hold_publish(rec)
        else:
            self._send_publish(rec)

    def _send_publish(self, rec: r.Publish) -> None:
        self.handler.credit -= 1  # given back by the supervisor (Credit) once absorbed
        if rec.mandatory or rec.confirm:
            self.publishes_unanswered = True
        trace = self.worker.trace
        if trace is not None:
            trace.published(time.monotonic_ns(), rec.conn, rec.ch, rec.exchange, rec.routing_key,
                            rec.body_len)
        self.worker.send(rec)

    # ------------------------------------------------- supervisor events

    def on_reply(self, ev: Any) -> None:
        """A Reply, GetOk or GetEmpty: the answer to the oldest expectation."""
        if not self._expect:
            return
        self._expect.popleft()[1](ev)
        while self._expect and not self._expect[0][0]:
            self._expect.popleft()[1](None)

    def on_confirm(self, ev: r.Confirm) -> None:
        if self.confirm_gate is None or self.confirm_gate.admit(ev):
            self.apply_confirm(ev)

    def apply_confirm(self, ev: r.Confirm) -> None:
        """The next publish's confirm: an ack joins the batch's ack multiple, a nack goes now."""
        self.confirmed += 1
        if not ev.ack:  # a queue refused it: nack this one, after the acks before it
            self.confirmed -= 1
            self.flush_confirms()
            self.confirmed += 1
            self.handler.send(Nack(self.number, self.confirmed, False))
            self.acked_upto = self.confirmed
            return
        self.handler.confirms_pending.add(self)

    def flush_confirms(self) -> None:
        """Coalesce the confirms of one event batch into one basic.ack multiple."""
        if self.confirmed > self.acked_upto:
            multiple = self.confirmed - self.acked_upto > 1
            self.handler.send(Ack(self.number, self.confirmed, multiple))
            self.acked_upto = self.confirmed

    def on_return(self, ev: r.Returned) -> None:
        header, body = self.worker.own_body(ev.offset, ev.header_len, ev.body_len)
        if ev.reheader:  # published with BCC (sender-selected distribution): returned without
            header = memoryview(codec.reheader(header, ev.headers, ev.expiration))
        self.handler.send(Return(
            self.number, ev.code, ev.text, ev.exchange, ev.routing_key, header, body,
        ))

    def on_pulled(self, target: Target, ev: r.Pulled) -> None:
        """Deliveries from a pull: the seed's step 12, onto the IO buffer."""
        self.pull_reserved -= target.pulling
        target.pulling = 0
        if self.closing:  # ChanClose requeues whatever this pull acquired
            return
        if not target.active:  # cancelled (nowait) while the pull was in flight
            self._settle([d.entry for d in ev.deliveries], r.REQUEUE)
            self.worker.drop_target(target)
            self._refresh_after_credit(target)
            return
        settled = target.settles_on_delivery
        done: list[int] = []
        trace = self.worker.trace
        messages: list[Delivery] = []
        next_tag = self.tags.tag
        for d in ev.deliveries:
            tag = next_tag(d.entry, target, settled)
            if settled:
                done.append(d.entry)
            else:  # held until acked: counts against prefetch
                target.unacked += 1
                self.consumer_unacked += 1
            header, body = self.worker.body(d)
            messages.append((tag, d.redelivered, d.exchange, d.routing_key, header, body))
            if trace is not None:
                trace.delivered(time.monotonic_ns(), d.entry, target.queue, target.id, target.tag,
                                d.redelivered)
        if messages:
            self.handler.send(Deliveries(self.number, target.tag, messages))
        self._settle(done, r.ACK)
        target.more = ev.more
        target.notified = ev.more or target.renotified
        target.renotified = False
        self._refresh_after_credit(target)

    def _refresh_after_credit(self, target: Target) -> None:
        """A pull's reservation came back: with global qos every consumer of the
        channel may now have credit, not just the one that pulled."""
        if self.global_prefetch:
            self.refresh_all()
        else:
            self.refresh(target)

    def on_cancelled(self, target: Target) -> None:
        """The queue went away: tell the client if it understands basic.cancel."""
        self.consumers.pop(target.tag, None)
        target.active = False
        if self.config.cancel_notify:
            self._send(spec.Basic.Cancel(target.tag, nowait=True))
        self.worker.drop_target(target)

    # ------------------------------------------------------------- credit

    def notify(self, target: Target) -> None:
        """seed: QueueConsumer#notifyWork reached this target (its slot was set)."""
        target.notified = True
        if target.pulling:
            target.renotified = True
        self.refresh(target)

    def refresh(self, target: Target) -> None:
        """seed: setNotifyWorkDesired follows credit; pull while notified and able."""
        if not target.active or self.closing:
            return
        credit = target.credit()
        if (credit > 0) != target.interested:
            target.interested = credit > 0
            if not target.interested:
                target.notified = target.renotified = False  # the supervisor hands the work on
            elif target.more and not self.global_prefetch:
                # Pull at once (ConsumerTarget.more). Not under global qos: there the
                # channel's consumers share the credit, and the supervisor's notification
                # decides which of them takes it.
                target.notified = True
            self.worker.send(r.Interest(target.id, target.interested))
        if credit > 0 and target.notified and not target.pulling:
            target.pulling = credit
            self.pull_reserved += credit
            self.worker.send(r.Pull(target.id, credit))

    def refresh_all(self) -> None:
        for target in self.consumers.values():
            self.refresh(target)

    def close(self) -> None:
        """The channel is gone; the supervisor requeues what it held (ChanClose)."""
        self.closing = True
        self._discard_tx()
        for target in self.consumers.values():
            target.active = False
            self.worker.drop_target(target)
        self.consumers.clear()
        if self.confirm_gate is not None:  # held confirms are never sent
            self.confirm_gate.drop()
        self._expect.clear()
        self._inbox = None


def _nothing(_: Any) -> None:
    pass
