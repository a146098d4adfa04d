"""A pull's answer on the worker side (deliverSingleMessage, docs/design.md): the deliveries a
channel hands its client -- each with its delivery tag, its body read from the arenas, its
trace row, and prefetch credit held until it is acked -- and what the answer says of the
consumer's next pull; and a basic.get's answer, the same way.

Pure functions of the channel's parts (``workers.channel.Channel.on_pulled`` and
``_get_answer`` call them): no IO, and nothing of the connection.
"""

from __future__ import annotations

import time

from ipc import records as r
from tracing import TraceWriter
from workers.channel_config import Bodies
from workers.consumer_target import ChannelCredit, ConsumerTarget
from workers.delivery_tags import DeliveryTags
from workers.outgoing import BasicGetOk, Delivery


def take_pulled(deliveries: list[r.Delivery], target: ConsumerTarget,
                tags: DeliveryTags[ConsumerTarget], credit: ChannelCredit, bodies: Bodies,
                trace: TraceWriter | None) -> tuple[list[Delivery], list[int]]:
    """The client's deliveries of ``deliveries``, and the entries settled at once (delivered
    with no ack, or paged out and unreadable: gone for good, ``workers.arenas``)."""
    settled = target.settles_on_delivery
    done: list[int] = []
    body = bodies.body
    held = credit.held
    messages: list[Delivery] = []
    next_tag = tags.tag
    for d in deliveries:
        content = body(d)
        if content is None:
            done.append(d.entry)
            continue
        tag = next_tag(d.entry, target, settled)
        if settled:
            done.append(d.entry)
        else:  # held until acked: counts against prefetch
            held(target)
        messages.append((tag, d.redelivered, d.exchange, d.routing_key, *content))
        if trace is not None:
            trace.delivered(time.monotonic_ns(), d.entry, target.queue, target.id, target.tag,
                            d.redelivered)
    return messages, done


def next_pull(target: ConsumerTarget, ev: r.Pulled, asked: int, global_prefetch: int) -> None:
    """What ``target`` does next after a pull that asked for ``asked`` got ``ev``.

    A standing pull that stays open covers every later notification: the supervisor runs it
    instead of setting our slot, and one set before it ran is answered here. One that
    deliveries used up is asked for again as soon as there is credit (ConsumerTarget.renew),
    not after a notification and another pull."""
    target.more = ev.more
    target.awaiting = False
    target.renew = 0 < asked == len(ev.deliveries) and not ev.open and not global_prefetch
    target.notified = ev.more or target.renew or (target.renotified and not ev.open)
    target.renotified = False


def take_got(ev: r.GetOk, channel: int, no_ack: bool, tags: DeliveryTags[ConsumerTarget],
             bodies: Bodies, trace: TraceWriter | None) -> BasicGetOk | None:
    """basic.get-ok for ``ev``, its delivery tagged (settled at once with ``no_ack``: the
    caller settles it as AUTO_ACK); None when its body was paged out and is unreadable."""
    d = ev.delivery
    content = bodies.body(d)
    if content is None:
        return None
    header, body = content
    tag = tags.tag(d.entry, None, no_ack)
    if trace is not None:
        trace.delivered(time.monotonic_ns(), d.entry, "", None, "", d.redelivered)
    return BasicGetOk(channel, tag, d.redelivered, d.exchange, d.routing_key, ev.message_count,
                      header, body)
