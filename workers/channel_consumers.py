"""A channel's consumers: their targets, the credit they share, and the seed's credit →
interest → pull steps (``setNotifyWorkDesired``, ``notifyWork``, ``deliverSingleMessage``).

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
from workers.consumer_target import Backpressure, ChannelCredit, ConsumerTarget, ConsumerTargets


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

    def owns(self, target: ConsumerTarget) -> bool:
        """Is ``target`` one of ours (not of an earlier channel with our number)?"""
        return target.pool is self.credit

    def new(self, m: spec.Basic.Consume, queue: str) -> tuple[ConsumerTarget, int]:
        """The consumer basic.consume ``m`` asks for on ``queue``, with the prefetch of the last
        basic.qos global=false, and its priority (``x-priority``); refused with RabbitMQ's
        errors and texts."""
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
        target.interested = target.credit() > 0
        return target, priority

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
        """seed: QueueConsumer#notifyWork reached this target (its slot was set)."""
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
        """seed: setNotifyWorkDesired follows credit; pull while notified and able."""
        if not target.active or self.closing:
            return
        credit = target.credit()
        shared = self.credit.global_prefetch
        pulling = target.pulling
        # A backlog waits (the last pull came back full) and only a little credit is back:
        # no Interest, no pull until half the prefetch is back or PULL_DEFER has passed.
        wait = (0 < credit < target.top_up and target.more and not target.due
                and not pulling and not shared and self._targets.defer(target))
        # Its whole prefetch out, on a backlog: it stays interested (notified) until an ack
        # comes, for PULL_DEFER at most. A consumer whose pulls keep its prefetch full would
        # otherwise say it is not interested and then interested again every few messages, and
        # the supervisor would stop seeing it wait for work on its backlog in between (credit
        # flow's "behind": an unpaced publisher went unthrottled). One that stopped acking says
        # so once PULL_DEFER has passed.
        if (credit == 0 and target.interested and target.more and not target.due and not shared
                and self._targets.defer(target)):
            return
        requests = out.requests
        if (credit > 0) != target.interested and not wait:
            target.interested = credit > 0
            if not target.interested:
                target.notified = target.renotified = False  # the supervisor hands the work on
            elif (target.more or target.renew) and not shared:
                # Pull at once (ConsumerTarget.more, .renew). Not under global qos: there the
                # channel's consumers share the credit, and the supervisor's notification
                # decides which of them takes it.
                target.notified = True
            requests.append(r.Interest(target.id, target.interested))
        if not target.notified or wait:
            return
        if not pulling:
            if credit > 0:
                # Standing (r.Pull.standing) unless the channel's consumers share a global
                # prefetch: there the credit a standing pull kept would be missing to the others.
                seq = self.credit.pull_sent(target, credit)
                requests.append(r.Pull(target.id, credit, not shared, seq))
        elif target.more and not shared and credit - pulling >= target.top_up:
            # Working off a backlog: the next pull goes as soon as half the prefetch is back,
            # not after the one in flight is answered (with a prefetch of 10 and each message
            # acked, the client would otherwise wait for that answer with half its credit
            # unused; the supervisor answers pulls in order).
            seq = self.credit.pull_sent(target, credit - pulling)
            requests.append(r.Pull(target.id, credit - pulling, True, seq))

    def pull_due(self, target: ConsumerTarget, out: ChannelOutput) -> None:
        """PULL_DEFER has passed for ``target``: it pulls with the credit it has, or, with
        none back, says it is not interested."""
        if self.owns(target):
            target.due = True
            self.refresh(target, out)
            target.due = False

    def refresh_all(self, out: ChannelOutput) -> None:
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
