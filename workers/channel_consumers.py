"""A channel's consumers: their targets, the credit they share, and the credit →
interest → pull steps (docs/design.md: ``setNotifyWorkDesired``, ``notifyWork``,
``deliverSingleMessage``).

The channel (``workers.channel.Channel``) holds one of these and passes it the
``ChannelOutput`` of the call in progress: the ``Interest`` and ``Pull`` records go there.
Consumer targets come from, and go back to, the worker's registry
(``workers.consumer_target.ConsumerTargets``); a target cancelled while its pull is in
flight stays known until the pull answers, or until the channel closes.
"""

from __future__ import annotations

import secrets

from pamqp import commands as spec

from broker import errors
from broker.constants import REPLY_TO
from ipc import records as r
from workers.channel_config import ChannelOutput
from workers.channel_frames import method_ids
from workers.consumer_target import (
    PULL_BATCH,
    Backpressure,
    ChannelCredit,
    ConsumerTarget,
    ConsumerTargets,
)


class ChannelConsumers:
    """The consumers of one channel, by consumer tag, and their shared credit."""

    def __init__(self, conn_id: int, number: int, output: Backpressure,
                 targets: ConsumerTargets) -> None:
        self._conn_id = conn_id
        self._number = number
        self._targets = targets
        self.credit = ChannelCredit(output)
        self.by_tag: dict[str, ConsumerTarget] = {}
        self._draining: set[ConsumerTarget] = set()  # cancelled, their pull still in flight
        self.prefetch = 0  # basic.qos global=false: for consumers created after it
        self.closing = False
        self._turn = 0  # global qos: where the next shared pull's first share goes (by_tag order)
        self._due = False  # global qos: PULL_DEFER has passed, pull whatever credit there is

    def owns(self, target: ConsumerTarget) -> bool:
        """Is ``target`` one of ours (not of an earlier channel with our number)?"""
        return target.pool is self.credit

    def new(self, m: spec.Basic.Consume, queue: str) -> tuple[ConsumerTarget, r.Consume]:
        """The consumer basic.consume ``m`` asks for on ``queue``, with the prefetch of the last
        basic.qos global=false, and its request record (priority: ``x-priority``); refused
        with RabbitMQ's errors and texts."""
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in self.by_tag:
            raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'", *method_ids(m))
        if queue == REPLY_TO:
            if not m.no_ack:
                raise errors.PreconditionFailed("reply consumer cannot acknowledge",
                                                *method_ids(m))
            if any(t.queue == REPLY_TO for t in self.by_tag.values()):
                raise errors.PreconditionFailed("reply consumer already set", *method_ids(m))
        args = m.arguments or {}
        priority = args.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise errors.PreconditionFailed("invalid arg 'x-priority' for basic.consume",
                                            *method_ids(m))
        target = self._targets.new(tag, self.credit, queue, conn=self._conn_id, ch=self._number,
                                   no_ack=m.no_ack, browse=bool(args.get("x-browse", False)),
                                   prefetch=self.prefetch)
        if target is None:
            raise errors.ResourceError("too many consumers on this worker", *method_ids(m))
        self.by_tag[tag] = target
        target.interested = target.awaiting = target.credit() > 0
        return target, r.Consume(
            self._conn_id, self._number, target.id, target.slot, queue, target.tag, m.no_ack,
            m.exclusive, priority, target.browse, target.interested, m.nowait,
        )

    def activate(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """Consume-ok is on its way: deliveries may flow."""
        target.active = True
        self.refresh(target, out)

    def cancel(self, tag: str) -> ConsumerTarget | None:
        """basic.cancel: the target under ``tag`` (still to be dropped), or None."""
        target = self.by_tag.pop(tag, None)
        if target is not None:
            target.active = False
        return target

    def drop(self, target: ConsumerTarget) -> None:
        """Give the target's slot back; one with a pull in flight is kept until it answers."""
        self._targets.drop(target, closing=self.closing)
        if target.pulling and not self.closing:
            self._draining.add(target)
        else:
            self._draining.discard(target)

    # ------------------------------------------------------------- credit

    def notify(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """notifyWork (docs/design.md) reached this target (its slot was set)."""
        target.notified = True
        if target.pulling:
            target.renotified = True
        self.refresh(target, out)

    def after_pull(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """A pull's reservation came back: with global qos every consumer of the
        channel may now have credit, not just the one that pulled."""
        if self.credit.global_prefetch:
            self.refresh_all(out)
        else:
            self.refresh(target, out)

    def refresh(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """setNotifyWorkDesired (docs/design.md) follows credit; pull while notified and able. Under
        basic.qos global=true the channel's credit is pulled for its consumers together
        (:meth:`_pull_shared`)."""
        if self.credit.global_prefetch:
            self._refresh_shared(out, target)
            return
        if not target.active or self.closing:
            return
        credit = target.credit()
        pulling = target.pulling
        # A backlog waits (the last pull came back full) and only a little credit is back:
        # no Interest, no pull until half the prefetch is back or PULL_DEFER has passed.
        wait = (0 < credit < target.top_up and target.more and not target.due
                and not pulling and self._targets.defer(target))
        # Its whole prefetch out, on a backlog: it stays interested (notified) until an ack
        # comes, for PULL_DEFER at most. A consumer whose pulls keep its prefetch full would
        # otherwise say it is not interested and then interested again every few messages, and
        # the supervisor would stop seeing it wait for work on its backlog in between (credit
        # flow's "behind": an unpaced publisher went unthrottled). One that stopped acking says
        # so once PULL_DEFER has passed.
        if (credit == 0 and target.interested and target.more and not target.due
                and self._targets.defer(target)):
            return
        requests = out.requests
        if (credit > 0) != target.interested and not wait:
            target.interested = target.awaiting = credit > 0
            if not target.interested:
                target.notified = target.renotified = False  # the supervisor hands the work on
            elif target.more or target.renew:
                target.notified = True  # pull at once (ConsumerTarget.more, .renew)
            requests.append(r.Interest(target.id, target.interested))
        if not target.notified or wait:
            return
        if not pulling:
            if credit > 0:
                seq = self.credit.pull_sent(target, credit)
                # PULL_DEFER passed with less than half the prefetch back on a backlog: the
                # client limits this consumer (r.Pull.limited), not the supervisor.
                limited = target.due and target.more and credit < target.top_up
                requests.append(r.Pull(target.id, credit, True, seq, limited))
        elif target.more and credit - pulling >= target.top_up:
            # Working off a backlog: the next pull goes as soon as half the prefetch is back,
            # not after the one in flight is answered (with a prefetch of 10 and each message
            # acked, the client would otherwise wait for that answer with half its credit
            # unused; the supervisor answers pulls in order).
            seq = self.credit.pull_sent(target, credit - pulling)
            requests.append(r.Pull(target.id, credit - pulling, True, seq))

    # ------------------------------------------------- basic.qos global=true

    def _refresh_shared(self, out: ChannelOutput, target: ConsumerTarget | None = None) -> None:
        """The channel's consumers share its prefetch: ``target``'s interest (every
        consumer's with None) follows the credit, then the credit there is goes to the
        consumers that were notified, in turns."""
        if self.closing:
            return
        if target is not None:
            self._interest_shared(target, out)
        else:
            for each in self.by_tag.values():
                self._interest_shared(each, out)
        self._pull_shared(out)

    def _interest_shared(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        if not target.active:
            return
        credit = target.credit()
        if credit == 0 and target.interested and not target.due and (
                # Its pull's answer decides (after_pull), or its siblings' pulls and unacked
                # deliveries hold the channel's credit while its queue has a backlog: it stays
                # notified, for PULL_DEFER at most, so that the next ack's credit finds it waiting
                # beside the consumer that pulled last instead of a notification's round trip
                # behind it (RabbitMQ's queues share a channel's prefetch about evenly; without
                # this the consumer notified first takes nearly all of it). So does one whose
                # Interest true no pull has answered yet (``awaiting``): its notification may be
                # on its way, and an Interest false behind the true would cancel it (under CPU
                # load the supervisor reads both in one batch, ack after ack, and never
                # notifies it, while the consumer that pulled last takes every ack's credit).
                target.pulling or ((target.more or target.awaiting)
                                   and self._targets.defer(target))):
            return
        if (credit > 0) != target.interested:
            target.interested = target.awaiting = credit > 0
            if not target.interested:
                target.notified = target.renotified = False  # the supervisor hands the work on
            out.requests.append(r.Interest(target.id, target.interested))

    def _pull_shared(self, out: ChannelOutput) -> None:
        """A pull shared by the channel's consumers: the credit the channel has goes to those
        notified and not pulling, split evenly (one-pull-at-a-time each, not standing: credit
        a standing pull kept would be missing to the others), the first share to the
        consumer after the one that came first last time. A no-ack consumer is not limited
        by prefetch (AMQP 0-9-1): it pulls what it may on its own."""
        pool = self.credit
        targets = list(self.by_tag.values())
        count = len(targets)
        ready: list[ConsumerTarget] = []
        first = -1
        for i in range(count):
            at = (self._turn + i) % count
            target = targets[at]
            if not (target.active and target.notified) or target.pulling:
                continue
            credit = target.credit()
            if credit <= 0:
                continue
            if target.settles_on_delivery:
                seq = pool.pull_sent(target, credit)
                out.requests.append(r.Pull(target.id, credit, False, seq))
                continue
            if first < 0:
                first = at
            ready.append(target)
        available = pool.global_prefetch - pool.consumer_unacked - pool.pull_reserved
        if not ready or available <= 0:
            return
        # Working off backlogs with little credit back (an ack or two): wait for half the
        # prefetch, PULL_DEFER at most, as a consumer with its own prefetch does
        # (ConsumerTarget.top_up) -- a pull a message otherwise, when each is acked alone.
        short = (available < max(1, min(pool.global_prefetch, PULL_BATCH) // 2)
                 and all(target.more for target in ready))
        if short and not self._due and self._targets.defer(ready[0]):
            return
        # PULL_DEFER passed with less than half the channel's prefetch back on backlogs: the
        # client limits these consumers (r.Pull.limited), not the supervisor.
        limited = short and self._due
        self._turn = first + 1
        left = len(ready)
        for target in ready:
            # An even share of what is left (rounded up: the first ones take the remainder);
            # what a consumer's own prefetch leaves of its share goes to the ones after it.
            n = min(-(-available // left), target.credit())
            left -= 1
            if n <= 0:
                continue
            available -= n
            seq = pool.pull_sent(target, n)
            out.requests.append(r.Pull(target.id, n, False, seq, limited))

    # ------------------------------------------------------------- timers

    def pull_due(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """PULL_DEFER has passed for ``target``: it pulls with the credit it has, or, with
        none back, says it is not interested."""
        if self.owns(target):
            target.due = self._due = True
            self.refresh(target, out)
            target.due = self._due = False

    def refresh_all(self, out: ChannelOutput) -> None:
        """Every consumer's credit may have changed (qos, flow, the connection's output)."""
        if self.credit.global_prefetch:
            self._refresh_shared(out)
            return
        for target in self.by_tag.values():
            self.refresh(target, out)

    def settled_one(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """``settled`` for one delivery of ``target``."""
        self.credit.settled(target)
        if self.credit.global_prefetch:
            self.refresh_all(out)
        else:
            self.refresh(target, out)

    def settled(self, targets: list[ConsumerTarget | None], out: ChannelOutput) -> None:
        """Deliveries of these targets were acked, rejected or nacked: their credit is back."""
        settled = self.credit.settled
        touched: set[ConsumerTarget] = set()
        for target in targets:
            if target is not None:
                settled(target)
                touched.add(target)
        if self.credit.global_prefetch:
            self.refresh_all(out)
        else:
            for target in touched:
                self.refresh(target, out)

    def close(self) -> None:
        """The channel is gone: every target's slot and id go back to the worker."""
        self.closing = True
        for target in self.by_tag.values():
            target.active = False
            self._targets.drop(target, closing=True)
        for target in self._draining:
            self._targets.drop(target, closing=True)
        self.by_tag.clear()
        self._draining.clear()
