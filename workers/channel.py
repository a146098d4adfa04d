"""An AMQP channel (a Session, docs/design.md) on the worker side.

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
What cannot run yet (behind a server-named declare, or a commit's body sync) waits in
``workers.channel_inbox``; a pull's deliveries are ``workers.channel_deliveries``'.

Delivery tags are the channel's (``workers.delivery_tags``). Acks, nacks and rejects
become ``Settle`` records; an unknown tag is 406 PRECONDITION_FAILED, as in RabbitMQ.

No IO here, and no reference to the connection handler or the worker
(``workers.channel_config``): every call returns a ``ChannelOutput`` -- the
request records and the client's events it produced, in order -- for the
handler to carry out. Consumer credit lives in ``ChannelCredit``
(``workers.consumer_target``), shared with the channel's targets.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final

from pamqp import base
from pamqp import commands as spec

from broker import errors
from broker.constants import REPLY_TO
from ipc import records as r
from tracing import names
from workers import codec, topology
from workers.access import CHECKED_METHODS
from workers.channel_config import ChannelConfig, ChannelOutput, ChannelResources
from workers.channel_consumers import ChannelConsumers
from workers.channel_deliveries import next_pull, take_got, take_pulled
from workers.channel_frames import method_ids
from workers.channel_inbox import HeldPublish, Inbox
from workers.confirm_gate import BodySyncGate
from workers.consumer_target import ConsumerTarget
from workers.delivery_tags import DeliveryTags, unknown_tag
from workers.outgoing import DeclareOk, Deliveries, Method, Outgoing, Return
from workers.publisher_confirms import PublisherConfirms
from workers.transaction import Transaction

_TRACE_OUTCOME: Final = {r.ACK: names.ACKED, r.REQUEUE: names.REQUEUED, r.DROP: names.REJECTED}
_ACK_IDS: Final = (codec.BASIC_CLASS, codec.BASIC_ACK)
# What the ack path reads of ipc.records (not compiled): bound once, read as C statics.
_ACK: Final = r.ACK
_Settle: Final = r.Settle
_CHECKED: Final = CHECKED_METHODS  # workers.access (not compiled): bound once as well


class Channel:
    """One AMQP channel of a client connection (a Session, docs/design.md): turns client methods into
    requests to the supervisor and its events into frames, in order; holds the channel's
    consumers, unacked deliveries, confirms and transaction."""

    def __init__(self, number: int, config: ChannelConfig, resources: ChannelResources) -> None:
        self.number = number
        self.conn_id = config.conn_id
        self.config = config
        self._bodies = resources.bodies
        self._trace = resources.trace
        self.consuming = ChannelConsumers(config.conn_id, number, config.output, resources.targets)
        self.credit = self.consuming.credit
        self._out = ChannelOutput()
        self.closing = False
        self.confirms = PublisherConfirms(config.conn_id, number, resources.body_log,
                                          resources.confirm_waiters)
        self.last_queue = ""  # AMQP 0-9-1 §1.7.2.1: "" means the last declared queue
        self.reply_to = ""  # direct reply-to: this channel's reply queue, once consuming
        self.tx = False
        # A publish sent since the last request that may still produce a basic.return (mandatory)
        # or a confirm: a local reply then waits for a Sync (_local_reply).
        self.publishes_unanswered = False
        self._tx: Transaction[ConsumerTarget] = Transaction()
        self.tags: DeliveryTags[ConsumerTarget] = DeliveryTags()
        self.consumers = self.consuming.by_tag  # consumer tag → target
        # Replies owed to the client, in request order: (from_supervisor, fn).
        # A local answer (qos-ok, …) queued behind supervisor replies keeps its place.
        self._expect: deque[tuple[bool, Callable[[Any], None]]] = deque()  # Any: each its Answer
        self._inbox = Inbox()  # what waits behind a server-named declare or a commit's sync

    # ----------------------------------------------------------- plumbing

    def take_output(self) -> ChannelOutput:
        """What the channel produced since the last call returned (after an error, say)."""
        out, self._out = self._out, ChannelOutput()
        return out

    @property
    def published(self) -> int:
        return self.confirms.published

    @property
    def confirm_gate(self) -> BodySyncGate | None:
        return self.confirms.gate

    @property
    def pull_reserved(self) -> int:
        return self.credit.pull_reserved

    def owns(self, target: ConsumerTarget) -> bool:
        """Is ``target`` one of this channel's (not of an earlier channel with its number)?"""
        return self.consuming.owns(target)

    @property
    def unacked(self) -> OrderedDict[int, tuple[int, ConsumerTarget | None]]:
        """Delivery tag → (entry, target) of what the client has not settled yet."""
        return self.tags.held

    def _request(self, rec: r.Request, on_reply: Callable[[Any], None] | None) -> None:
        self._out.requests.append(rec)
        if on_reply is not None:
            self.publishes_unanswered = False  # its reply comes after theirs
            self._expect.append((True, on_reply))

    def _send(self, method: base.Frame) -> None:
        self._reply(Method(self.number, method))

    def _reply(self, event: Outgoing) -> None:
        """A reply to the client (a method, declare-ok, get-ok): after the acks owed for
        earlier publishes."""
        if self.confirms.owed:
            self.confirms.flush(self._out.events)
        self._out.events.append(event)

    def _local_reply(self, method: base.Frame) -> None:
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
            self._out.requests.append(_Settle(self.conn_id, self.number, entries, action))

    def _queue_name(self, name: str, method: base.Frame) -> str:
        if name:
            return name
        if not self.last_queue:
            raise errors.NotFound("no previously declared queue", *method_ids(method))
        return self.last_queue

    # ------------------------------------------------------ client methods

    def on_method(self, m: base.Frame) -> ChannelOutput:
        """A client method on this channel: what it produced. An ``AMQPError`` raised here
        closes the channel or the connection (the owner takes what came before it with
        :meth:`take_output`)."""
        if self._inbox.held is not None:
            self._inbox.held.append(m)
        else:
            self._dispatch(m)
        return self.take_output()

    def on_ack(self, delivery_tag: int, multiple: bool) -> ChannelOutput:
        """basic.ack read on the hot path (``AckReceived``): what ``on_method`` does with a
        ``Basic.Ack``, without making one unless it must wait in the inbox."""
        if self._inbox.held is not None:
            self._inbox.held.append(spec.Basic.Ack(delivery_tag, multiple))
        elif multiple or self.tx or self._trace is not None:
            self._settle_tags(delivery_tag, multiple, r.ACK, None)
        else:  # one delivery, the common case: _settle_tags without its lists
            held = self.tags.held.pop(delivery_tag, None)
            if held is None:
                raise unknown_tag(delivery_tag, _ACK_IDS)
            entry, target = held
            self._settle([entry], _ACK)
            if target is not None:
                self.consuming.settled_one(target, self._out)
            else:  # a basic.get's: no consumer's credit
                self.consuming.settled([None], self._out)
        return self.take_output()

    def _dispatch(self, m: base.Frame) -> None:
        run = _METHODS.get(type(m))
        if run is None:
            raise errors.NotImplemented_(f"{m.name} is not implemented", *method_ids(m))
        access = self.config.access
        if access is not None and type(m) in _CHECKED:  # before anything is asked (workers.access)
            queue = getattr(m, "queue", "")
            access.check_method(m, queue or self.last_queue)
        run(self, m)

    def _exchange_method(self, m: topology.ExchangeMethod) -> None:
        """exchange.declare, delete, bind, unbind (``workers.topology``)."""
        rec = topology.request(self.conn_id, self.number, m, "")
        self._request(rec, None if m.nowait else self._topology_ok)

    def _queue_declare(self, m: spec.Queue.Declare) -> None:
        """queue.declare (``workers.topology``); "" waits for the name declare-ok brings."""
        rec = topology.declare_request(self.conn_id, self.number, m, self.config.access)
        name = rec.name
        if name:
            self.last_queue = name
        self._request(rec, None if m.nowait else self._declare_ok)
        if not name and not m.nowait:
            self._inbox.wait()  # "" is unknown until declare-ok names the queue

    def _queue_method(self, m: topology.QueueMethod) -> None:
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
        self._inbox.release(self._dispatch, self._publish_held, self._is_closing)

    def _is_closing(self) -> bool:
        return self.closing

    def _qos(self, m: spec.Basic.Qos) -> None:
        if m.prefetch_size:
            # RabbitMQ refuses a byte-based prefetch the same way.
            raise errors.NotImplemented_(f"prefetch_size!=0 ({m.prefetch_size})", *method_ids(m))
        if m.global_:  # RabbitMQ: global=true is shared by the channel's consumers
            self.credit.global_prefetch = m.prefetch_count
        else:  # ... and global=false applies to each consumer created after it
            self.consuming.prefetch = m.prefetch_count
        self._refresh_all()
        self._local_reply(spec.Basic.QosOk())

    def _consume(self, m: spec.Basic.Consume) -> None:
        queue = self._queue_name(m.queue, m)
        target, rec = self.consuming.new(m, queue)
        if m.nowait:
            self._request(rec, None)
            self._activate(target)
        else:
            self._request(rec, lambda rep: self._consume_ok(target, rep.queue))

    def _consume_ok(self, target: ConsumerTarget, queue: str = "") -> None:
        if target.queue == REPLY_TO:
            self.reply_to = queue
        self._send(spec.Basic.ConsumeOk(target.tag))
        self._activate(target)

    def _activate(self, target: ConsumerTarget) -> None:
        self.consuming.activate(target, self._out)

    def _cancel(self, m: spec.Basic.Cancel) -> None:
        tag = m.consumer_tag or ""
        target = self.consuming.cancel(tag)
        if target is None:  # RabbitMQ answers cancel-ok for an unknown tag too
            if not m.nowait:
                self._local_reply(spec.Basic.CancelOk(tag))
            return
        if target.queue == REPLY_TO:  # no reply consumer: reply_to is refused again
            self.reply_to = ""
        rec = r.Cancel(self.conn_id, self.number, target.id, m.nowait)
        if m.nowait:
            self._request(rec, None)
            self._drop(target)
        else:
            self._request(rec, lambda rep: self._cancel_ok(target))

    def _cancel_ok(self, target: ConsumerTarget) -> None:
        self._send(spec.Basic.CancelOk(target.tag))
        self._drop(target)

    def _drop(self, target: ConsumerTarget) -> None:
        self.consuming.drop(target)

    def _get(self, m: spec.Basic.Get) -> None:
        rec = r.Get(self.conn_id, self.number, self._queue_name(m.queue, m), m.no_ack)
        self._request(rec, lambda ev: self._get_answer(ev, m.no_ack))

    def _get_answer(self, ev: r.GetOk | r.GetEmpty, no_ack: bool) -> None:
        if isinstance(ev, r.GetEmpty):
            self._send(spec.Basic.GetEmpty())
            return
        got = take_got(ev, self.number, no_ack, self.tags, self._bodies, self._trace)
        if got is None:  # paged out and unreadable (workers.arenas): gone for good
            self._settle([ev.delivery.entry], r.AUTO_ACK)
            self._send(spec.Basic.GetEmpty())
            return
        self._reply(got)
        if no_ack:  # settled here: AUTO_ACK, which message statistics do not count as an ack
            self._settle([ev.delivery.entry], r.AUTO_ACK)

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
            raise errors.NotImplemented_("requeue=false", *method_ids(m))
        self._settle_tags(0, True, r.REQUEUE, m)

    def _confirm_select(self, m: spec.Confirm.Select) -> None:
        if self.tx:  # RabbitMQ's text
            raise errors.PreconditionFailed("cannot switch from tx to confirm mode", *method_ids(m))
        self.confirms.active = True
        if not m.nowait:
            self._local_reply(spec.Confirm.SelectOk())

    def _tx_select(self, m: spec.Tx.Select) -> None:
        if self.confirms.active:
            raise errors.PreconditionFailed("cannot switch from confirm to tx mode", *method_ids(m))
        self.tx = True
        self._local_reply(spec.Tx.SelectOk())

    def _check_tx(self, m: base.Frame) -> None:
        if not self.tx:
            raise errors.PreconditionFailed("channel is not transactional", *method_ids(m))

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
            self._inbox.wait()
            self._out.wait_body_sync = True
            return
        self._commit()

    def _commit(self) -> None:
        self._request(r.Sync(self.conn_id, self.number), lambda rep: self._send(spec.Tx.CommitOk()))

    def commit_synced(self) -> ChannelOutput:
        """The body log is synced past this channel's committed publishes (``wait_body_sync``):
        the commit's barrier goes now, and the methods that waited run."""
        if not self.closing:
            self._commit()
            self._resume()
        return self.take_output()

    def _tx_rollback(self, m: spec.Tx.Rollback) -> None:
        """Drop the held publishes; the held acks' messages are unacked again."""
        self._check_tx(m)
        self._discard_tx()
        settles = self._tx.take_settles()
        self.tags.give_back(settles)
        for _, _, target, _ in settles:
            if target is not None:
                self.credit.held(target)
        self._refresh_all()
        self._local_reply(spec.Tx.RollbackOk())

    def _discard_tx(self) -> None:
        for rec in self._tx.take_publishes():
            self._bodies.free(rec.offset)

    def _flow(self, m: spec.Channel.Flow) -> None:
        self.credit.flow_active = bool(m.active)
        self._refresh_all()
        self._local_reply(spec.Channel.FlowOk(self.credit.flow_active))

    # ------------------------------------------------------ acknowledgements

    def _settle_tags(self, tag: int, multiple: bool, action: int, m: base.Frame | None) -> None:
        """basic.ack, nack or reject (``m``; None: a basic.ack read on the hot path)."""
        taken = self.tags.take(tag, multiple)
        if not taken and not (multiple and tag == 0):
            raise unknown_tag(tag, method_ids(m) if m is not None else _ACK_IDS)
        if self._trace is not None:
            self._trace.acked_many(time.monotonic_ns(), [e for _, e, _ in taken],
                                   _TRACE_OUTCOME[action])
        if self.tx:  # takes effect at tx.commit; tx.rollback gives them back
            self._tx.hold_settles(taken, action)
        else:
            self._settle([entry for _, entry, _ in taken], action)
        self.consuming.settled([target for _, _, target in taken], self._out)

    # ------------------------------------------------------- publishing

    def publish(self, exchange: str, routing_key: str, mandatory: bool, offset: int,
                header_len: int, body_len: int, headers: dict[str, Any] | None,
                expiration: str | None = None, priority: int | None = None,
                body_at: tuple[int, int, int] | None = None) -> ChannelOutput:
        """A basic.publish whose header and body are in the worker's arena at ``offset``;
        ``body_at``: where its body went in the body log (a persistent message, --data-dir)."""
        if self._inbox.held is not None:
            self._inbox.held.append(HeldPublish(exchange, routing_key, mandatory, offset,
                                                header_len, body_len, headers, expiration,
                                                priority, body_at))
        else:
            self._publish(exchange, routing_key, mandatory, offset, header_len, body_len, headers,
                          expiration, priority, body_at)
        return self.take_output()

    def _publish(self, exchange: str, routing_key: str, mandatory: bool, offset: int,
                 header_len: int, body_len: int, headers: dict[str, Any] | None,
                 expiration: str | None, priority: int | None,
                 body_at: tuple[int, int, int] | None) -> None:
        if self.confirms.active:
            self.confirms.publish(persistent=body_at is not None)
        rec = r.Publish(
            self.conn_id, self.number, exchange, routing_key, mandatory, self.confirms.active,
            offset, header_len, body_len, headers, expiration, priority, body_at,
        )
        if self.tx:  # invisible until tx.commit
            self._tx.hold_publish(rec)
        else:
            self._send_publish(rec)

    def _publish_held(self, p: HeldPublish) -> None:
        self._publish(p.exchange, p.routing_key, p.mandatory, p.offset, p.header_len, p.body_len,
                      p.headers, p.expiration, p.priority, p.body_at)

    def _send_publish(self, rec: r.Publish) -> None:
        out = self._out
        out.publishes += 1  # the connection's credit, given back by the supervisor (Credit)
        if rec.mandatory or rec.confirm:
            self.publishes_unanswered = True
        trace = self._trace
        if trace is not None:
            trace.published(time.monotonic_ns(), rec.conn, rec.ch, rec.exchange, rec.routing_key,
                            rec.body_len)
        out.requests.append(rec)

    # ------------------------------------------------- supervisor events

    def on_reply(self, ev: r.Reply | r.GetOk | r.GetEmpty) -> ChannelOutput:
        """A Reply, GetOk or GetEmpty: the answer to the oldest expectation."""
        if self._expect:
            self._expect.popleft()[1](ev)
            while self._expect and not self._expect[0][0]:
                self._expect.popleft()[1](None)
        return self.take_output()

    def on_confirm(self, ev: r.Confirm) -> ChannelOutput:
        if self.confirms.on_confirm(ev, self._out.events):
            self._out.confirms_due = True
        return self.take_output()

    def release_confirms(self) -> ChannelOutput:
        """The body log was synced: the confirms held for it that are now due, and their ack."""
        self.confirms.release(self._out.events)
        return self.take_output()

    def flush_confirms(self) -> ChannelOutput:
        """The end of an event batch: its confirms as one basic.ack multiple."""
        self.confirms.flush(self._out.events)
        return self.take_output()

    def on_return(self, ev: r.Returned) -> ChannelOutput:
        header, body = self._bodies.own_body(ev.offset, ev.header_len, ev.body_len)
        if ev.reheader:  # published with BCC (sender-selected distribution): returned without
            header = memoryview(codec.reheader(header, ev.headers, ev.expiration))
        self._out.events.append(Return(
            self.number, ev.code, ev.text, ev.exchange, ev.routing_key, header, body,
        ))
        return self.take_output()

    def on_pulled(self, target: ConsumerTarget, ev: r.Pulled) -> ChannelOutput:
        """Deliveries from a pull (deliverSingleMessage, docs/design.md), onto the IO buffer.
        The target's credit is looked at again in :meth:`after_pull`, once the owner has handed the deliveries
        to the connection (whose back-pressure they may turn on)."""
        asked = self.credit.pull_answered(target, ev.open, ev.seq)
        if self.closing:  # ChanClose requeues whatever this pull acquired
            return self.take_output()
        if not target.active:  # cancelled (nowait) while the pull was in flight
            self._settle([d.entry for d in ev.deliveries], r.REQUEUE)
            self._drop(target)
            return self.take_output()
        messages, done = take_pulled(ev.deliveries, target, self.tags, self.credit,
                                     self._bodies, self._trace)
        if messages:
            self._out.events.append(Deliveries(self.number, target.tag, messages))
        self._settle(done, r.AUTO_ACK)  # no-ack and browsers' deliveries: no client acked them
        next_pull(target, ev, asked, self.credit.global_prefetch)
        return self.take_output()

    def after_pull(self, target: ConsumerTarget) -> ChannelOutput:
        """A pull's reservation came back: with global qos every consumer of the
        channel may now have credit, not just the one that pulled."""
        self.consuming.after_pull(target, self._out)
        return self.take_output()

    def on_cancelled(self, target: ConsumerTarget) -> ChannelOutput:
        """The queue went away: tell the client if it understands basic.cancel."""
        self.consuming.cancel(target.tag)
        target.active = False
        if self.config.cancel_notify:
            self._send(spec.Basic.Cancel(target.tag, nowait=True))
        self._drop(target)
        return self.take_output()

    # ------------------------------------------------------------- credit

    def notify(self, target: ConsumerTarget) -> ChannelOutput:
        """notifyWork (docs/design.md) reached this target (its slot was set)."""
        self.consuming.notify(target, self._out)
        return self.take_output()

    def pull_due(self, target: ConsumerTarget) -> ChannelOutput:
        """The worker's timer: a consumer that waited for credit pulls with what it has."""
        self.consuming.pull_due(target, self._out)
        return self.take_output()

    def refresh_all(self) -> ChannelOutput:
        """Credit may have come back for every consumer (the connection's output drained)."""
        self._refresh_all()
        return self.take_output()

    def _refresh_all(self) -> None:
        self.consuming.refresh_all(self._out)

    def close(self) -> None:
        """The channel is gone; the supervisor requeues what it held (ChanClose). What it
        still held of its worker's -- consumer slots, publishes waiting in its inbox or its
        transaction, confirms held for the body log -- is let go here."""
        self.closing = True
        self._discard_tx()
        self.consuming.close()
        self.confirms.drop()  # held confirms are never sent
        self._expect.clear()
        self._inbox.drop(self._bodies.free)
        self._out = ChannelOutput()


def _nothing(_: object) -> None:
    pass


# Channel._dispatch's table, by the method's class. A module global rather than a class attribute:
# a class body compiled with mypyc cannot name its own methods.
_METHODS: dict[type, Callable[[Channel, Any], None]] = {
    spec.Exchange.Declare: Channel._exchange_method,
    spec.Exchange.Delete: Channel._exchange_method,
    spec.Exchange.Bind: Channel._exchange_method,
    spec.Exchange.Unbind: Channel._exchange_method,
    spec.Queue.Declare: Channel._queue_declare,
    spec.Queue.Bind: Channel._queue_method,
    spec.Queue.Unbind: Channel._queue_method,
    spec.Queue.Purge: Channel._queue_method,
    spec.Queue.Delete: Channel._queue_method,
    spec.Basic.Qos: Channel._qos,
    spec.Basic.Consume: Channel._consume,
    spec.Basic.Cancel: Channel._cancel,
    spec.Basic.Get: Channel._get,
    spec.Basic.Ack: Channel._ack,
    spec.Basic.Nack: Channel._nack,
    spec.Basic.Reject: Channel._reject,
    spec.Basic.Recover: Channel._recover,
    spec.Basic.RecoverAsync: Channel._recover_async,
    spec.Confirm.Select: Channel._confirm_select,
    spec.Channel.Flow: Channel._flow,
    spec.Tx.Select: Channel._tx_select,
    spec.Tx.Commit: Channel._tx_commit,
    spec.Tx.Rollback: Channel._tx_rollback,
}
