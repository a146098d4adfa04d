"""The ``snapshot`` control command: the supervisor's state, compact, for the management process.

Theory of operation
-------------------
The management process (``management/``) polls the control socket every
collect_statistics_interval (5 s) with ``{"command": "snapshot"}`` and computes everything it
serves from the answer: object lists, totals, and rates from the deltas of the counters
between two answers. The supervisor only copies what it keeps anyway: depths, and the
message counters (below), which cost the message path an attribute increment each.

The answer is built in slices of ``SLICE`` objects with a checkpoint between them, so 10,000
queues cost the supervisor's loop a few short turns rather than one long one; an object
deleted between two slices is left out. Rows are arrays, not objects (10,000 queues are
~1 MB of JSON, not ~3):

* ``queues``: ``[name, durable, auto_delete, owner, arguments, ready, unacked, consumers,
  enqueued, deliver, deliver_no_ack, get, get_no_ack, redeliver, ack, get_empty, vhost]`` --
  ``owner`` is ``[worker, conn]`` of an exclusive queue's connection, else null;
  ``enqueued`` counts the messages that ever entered the queue (its next position); the
  rest are its message counters (``broker.queues.message_counts.QUEUE_FIELDS``).
* ``exchanges``: ``[name, type, durable, auto_delete, internal, arguments, publish_in,
  publish_out, vhost]``.
* ``bindings``: ``[source, destination, destination_type, routing_key, arguments, vhost]``, without
  the default exchange's (one per queue, which the reader makes up again, as RabbitMQ lists
  them).
* ``consumers``: ``[queue, tag, worker, conn, ch, exclusive, ack_required, priority, active,
  vhost]``.
* ``vhosts``: ``[{name, description, tags, default_queue_type, metadata, messages...}]`` by
  name (``broker.runtime.vhost_admin.vhost_row``); every row above names its vhost last.
* ``vhost_policies``: per vhost with policies, ``broker.runtime.policies.policy_snapshot``
  (``policies``: "/"'s alone, as before there were other vhosts).
* ``channels``: ``[worker, conn, ch, consumers, unacked]`` for the channels the supervisor
  keeps books for (those with a consumer or an unsettled delivery).
* ``alarms``: ``{"memory": [worker, ...], "disk": bool, "queued": bool}``.
* ``messages``: the broker's message counters (``MessageCounts.as_dict``), which outlive the
  queues they were counted on.

The message counters are integers the dispatcher bumps as it goes (an attribute increment,
``broker.queues.message_counts``); this copies them, and the management process makes rates.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from broker.runtime.dispatch import Dispatcher
from broker.runtime.policies import policy_snapshot
from broker.runtime.vhost_admin import vhost_row
from broker.topology.exchange import ExchangeDestination
from broker.topology.vhosts import DEFAULT_VHOST

SLICE = 1000  # objects per slice; a checkpoint between slices


async def build_snapshot(dispatcher: Dispatcher, checkpoint: Callable[[], Awaitable[None]],
                         slice_size: int = SLICE) -> dict[str, Any]:
    """The supervisor's state as the management process reads it (see the module's text)."""
    vhosts = sorted(dispatcher.vhosts, key=lambda v: v.name)
    queues: list[list[Any]] = []
    for i, q in enumerate([q for v in vhosts for q in v.queues.values()]):
        if i and i % slice_size == 0:
            await checkpoint()
        if q.deleted:
            continue
        owner = q.exclusive_owner
        counts = q.counts
        queues.append([
            q.name, q.durable, q.auto_delete,
            list(owner) if isinstance(owner, tuple) else (None if owner is None else [0, 0]),
            q.arguments, q.message_count, q.acquired_count, q.consumer_count,
            max(0, getattr(q, "_next_position", 1) - 1),
            counts.deliver, counts.deliver_no_ack, counts.get, counts.get_no_ack,
            counts.redeliver, counts.ack, counts.get_empty, q.vhost,
        ])
    await checkpoint()
    exchanges: list[list[Any]] = []
    bindings: list[list[Any]] = []
    count = 0
    for x in [x for v in vhosts for x in v.exchanges.values()]:
        exchanges.append([x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments,
                          x.publish_in, x.publish_out, x.vhost])
        if x.name == "":
            continue
        for b in x.bindings():
            count += 1
            if count % slice_size == 0:
                await checkpoint()
            destination = b.destination
            if isinstance(destination, ExchangeDestination):
                bindings.append([x.name, destination.name, "exchange", b.routing_key, b.arguments,
                                 x.vhost])
            else:
                bindings.append([x.name, str(destination), "queue", b.routing_key, b.arguments,
                                 x.vhost])
    await checkpoint()
    consumers: list[list[Any]] = []
    channels: dict[tuple[int, int, int], list[int]] = {}
    books = dispatcher._channels  # read only: the dispatcher's channel books
    for i, sub in enumerate(list(books.subs.values())):
        if i and i % slice_size == 0:
            await checkpoint()
        c = sub.consumer
        worker, conn, ch = sub.channel
        active = sub.queue.active_consumer
        consumers.append([sub.queue.name, c.tag, worker, conn, ch, c.exclusive, not c.no_ack,
                          c.priority, active is None or active is c, sub.queue.vhost])
        row = channels.setdefault(sub.channel, [0, len(sub.chan.acquired)])
        row[0] += 1
    alarms = dispatcher.alarms
    policies = {v.name: policy_snapshot(v) for v in vhosts if v.policies or v.applied}
    return {
        "time": time.time(),
        "vhost": DEFAULT_VHOST,
        "vhosts": [vhost_row(v) for v in vhosts],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
        "consumers": consumers,
        "channels": [[*key, n, unacked] for key, (n, unacked) in channels.items()],
        "alarms": {"memory": [k for k, on in enumerate(alarms.blocked) if on],
                   "disk": alarms.disk, "queued": alarms.queued_full},
        "messages": dispatcher.answers.counts.as_dict(),
        "policies": policies.get(DEFAULT_VHOST),
        "vhost_policies": policies,
    }
