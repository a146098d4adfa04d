"""The dispatcher's teardown: what closing a channel or connection, or deleting a queue, undoes.

A closed channel's consumers leave their queues and what it held goes back -- requeued to its
original position (AMQP 0-9-1 §4.7) or, a browser's pin, let go of -- and a deleted queue's
consumers are told they are cancelled. A channel may have thousands of consumers and, without
prefetch, millions of deliveries, so each of these is a job in the virtual host's sliced work
(:mod:`broker.queues.sliced_work`; docs/design.md, Bounded step): ``DETACH`` consumers a step
taken off their queues or told, ``RETURN`` deliveries a step gone back, oldest channel first.
Meanwhile the rest stay on their queues, closed (``ChannelLedger.closed``): a standing pull of
theirs is never served, and what their queue notified them of goes on to another consumer as
each is taken off.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import itertools
import sys

from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue_entry import QueueEntry
from broker.queues.sliced_work import SlicedWork
from broker.runtime.answers import Answers
from broker.runtime.deliveries import Deliveries
from broker.runtime.dispatch_trace import DispatchTrace
from broker.runtime.open_channels import ChannelKey, Detaching, OpenChannels, Returning
from broker.topology.vhosts import VirtualHosts
from ipc import records as r

# The sliced work's budgets (broker.queues.sliced_work) a step of the dispatcher's refills.
DETACH = "detach"
RETURN = "return"
# Deliveries of closed channels requeued (or unpinned) per step: a channel without prefetch can
# hold a million; what a step leaves goes back over the next timer ticks, which come at once.
RETURN_SLICE = 1000
# Consumers of closed channels taken off their queues, or of deleted queues told, per step: a
# channel may have tens of thousands (perf.bench_supervisor_slices measures the longest step).
DETACH_SLICE = 512
# Consumers cancelled at once when their queue goes (the rest share DETACH_SLICE a step).
CANCEL_AT_ONCE = 256


class _Cancelling:
    """Consumers whose queue went away, still to be told (``consumers[at:]``)."""

    __slots__ = ("at", "consumers")

    def __init__(self, consumers: list[QueueConsumer]) -> None:
        self.consumers = consumers
        self.at = 0


class Teardown:
    """Closed connections and channels, and deleted queues' consumers, undone a slice a step."""

    def __init__(self, vhosts: VirtualHosts, answers: Answers, channels: OpenChannels,
                 deliveries: Deliveries) -> None:
        self.vhosts = vhosts
        self.answers = answers
        self.outbox = answers.outbox
        self._channels = channels
        self._subs = channels.subs
        self.deliveries = deliveries
        self.sliced: SlicedWork = vhosts.sliced
        self.sliced.add_budget(DETACH, DETACH_SLICE)
        self.sliced.add_budget(RETURN, RETURN_SLICE)
        self.cancel_at_once = CANCEL_AT_ONCE
        self.trace: DispatchTrace | None = None

    def step(self) -> None:
        """A step begins: the budgets are full again."""
        self.sliced.refill(DETACH, RETURN)

    def run(self) -> None:
        """Go on with what is left, as this step's budgets allow."""
        self.sliced.run(DETACH)
        self.sliced.run(RETURN)

    # ------------------------------------------------- connections, channels

    def conn_close(self, worker: int, rec: r.ConnClose, *, worker_died: bool = False) -> None:
        owner = (worker, rec.conn)
        self.answers.confirms.forget(lambda key: key[:2] == owner)
        for ch in self._channels.close_connection(owner):
            self._release_channel((worker, rec.conn, ch))
        vhost = self.vhosts.vhost_of_conn(owner)
        if vhost is not None:  # its exclusive queues (none left in a deleted vhost)
            self.cancel_all(vhost.delete_owned_queues(owner, self.cancel_all, at_once=worker_died))

    def chan_close(self, worker: int, rec: r.ChanClose) -> None:
        key = (worker, rec.conn, rec.ch)
        self.answers.confirms.forget(lambda k: k == key)
        self._release_channel(key)
        # The barrier: whatever the worker receives for (conn, ch) before this
        # belongs to the closed channel, not to a reopened one of the same number.
        self.outbox[worker].append(r.Reply(rec.conn, rec.ch, "chclose"))

    def _release_channel(self, key: ChannelKey) -> None:
        chan = self._channels.close(key)
        if chan is None:
            return
        # Its consumers leave their queues as many as this step allows now, the rest over the
        # next steps, before what it held goes back.
        if chan.consumers:
            self.sliced.add(DETACH, _Detach(self, Detaching(key[0], chan)))
            self.sliced.run(DETACH)
        # AMQP 0-9-1 §4.7: unacknowledged messages of a closed channel are requeued (to their
        # original positions): as many as this step allows now, the rest over the next steps.
        if chan.acquired:
            ret = Returning(key[0], chan.acquired)
            self._channels.returning.append(ret)
            self.sliced.add(RETURN, _Return(self, ret))
            self.sliced.run(RETURN)

    def worker_died(self, worker: int) -> None:
        """Its closed channels' consumers all go now: its replacement numbers consumers from 1."""
        for job in self.sliced.take(DETACH, lambda j: isinstance(j, _Detach)
                                    and j.job.worker == worker):
            job(sys.maxsize)

    def _detach(self, job: Detaching, n: int) -> tuple[int, bool]:
        """Take the next ``n`` of ``job``'s consumers off their queues; how many there were."""
        worker, chan = job.worker, job.chan
        cids = job.cids[job.at:job.at + n]
        job.at += len(cids)
        for cid in cids:
            sub = self._channels.forget(worker, cid, chan)
            if sub is not None:
                self.deliveries.end_standing(worker, cid, answer=False)
                self.deliveries.wake(self.vhosts.remove_consumer(sub.queue, sub.consumer))
        return len(cids), job.at == len(job.cids)

    def _return(self, ret: Returning, n: int) -> tuple[int, bool]:
        """Requeue (or unpin) the next ``n`` of what a closed channel held, in delivery order."""
        done = 0
        trace = self.trace
        for held in itertools.islice(ret.rest, n):
            done += 1
            ret.done += 1
            if trace is not None and isinstance(held, QueueEntry):
                trace.requeued(held, ret.worker)
            self._channels.released(held)
            self.deliveries.requeue(held)
        if ret.done < len(ret.held):
            return done, False
        self._channels.returning.popleft()
        if ret.done > self.sliced.slices[RETURN]:  # a million-item dict freed at once would hold the step
            self.vhosts.discard(ret.held)  # the graveyard's, a slice per step
        return done, True

    # ------------------------------------------------------------ cancelled

    def cancel_all(self, consumers: list[QueueConsumer]) -> None:
        """The broker cancels consumers whose queue went away (consumer_cancel_notify):
        ``cancel_at_once`` now, the rest DETACH a step. Meanwhile a pull of theirs finds
        the deleted queue empty; nothing else of theirs reaches it."""
        job = _Cancelling(consumers)
        self._cancel_some(job, self.cancel_at_once)
        if job.at < len(consumers):
            self.sliced.add(DETACH, lambda n: self._cancel_some(job, n))

    def _cancel_some(self, job: _Cancelling, n: int) -> tuple[int, bool]:
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
                self.deliveries.end_standing(worker, cid, answer=False)
                continue
            self.deliveries.end_standing(worker, cid, answer=True, seq=sub.pull_seq)
            self.outbox[worker].append(r.Cancelled(cid))
        return len(consumers), job.at == len(job.consumers)


class _Detach:
    """A closed channel's consumers to take off their queues: a job of the sliced work."""

    __slots__ = ("job", "teardown")

    def __init__(self, teardown: Teardown, job: Detaching) -> None:
        self.teardown = teardown
        self.job = job

    def __call__(self, n: int) -> tuple[int, bool]:
        return self.teardown._detach(self.job, n)


class _Return:
    """What a closed channel held, to requeue: a job of the sliced work."""

    __slots__ = ("ret", "teardown")

    def __init__(self, teardown: Teardown, ret: Returning) -> None:
        self.teardown = teardown
        self.ret = ret

    def __call__(self, n: int) -> tuple[int, bool]:
        return self.teardown._return(self.ret, n)
