"""Message statistics: plain integer counters the supervisor bumps as it goes, never reads.

RabbitMQ's management statistics (``message_stats``) and its Prometheus plugin's
``rabbitmq_global_messages_*_total`` count what happened to messages: delivered with or without
an ack, fetched with basic.get, redelivered, acknowledged, confirmed, returned or dropped as
unroutable. Shoal keeps them as attributes of one slotted object per queue
(:class:`QueueCounts`, ``Queue.counts``), one per exchange (publish in and out) and one for the
broker (:class:`MessageCounts`, the runtime's): counting is an attribute increment, by the
batch where there is one (a pull's deliveries, a settle's acks), and nothing is allocated for
it. The management process reads them through the ``snapshot`` control command
(``broker.runtime.snapshot``) at its interval and computes rates from the differences; a queue's
counters go with it, the broker's stay.
"""

from __future__ import annotations

# A queue's counters, in the order the snapshot lists them (after its depth columns).
QUEUE_FIELDS = ("deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver", "ack", "get_empty")
# The broker's: a queue's, then what only the publishing side knows.
MESSAGE_FIELDS = (*QUEUE_FIELDS, "publish", "publish_confirm", "routed", "return_unroutable",
                  "drop_unroutable", "confirm")


class QueueCounts:
    """What happened to a queue's messages (RabbitMQ's queue ``message_stats``); what entered
    it is its next position (``Queue._next_position``), counted already."""

    __slots__ = QUEUE_FIELDS

    def __init__(self) -> None:
        self.deliver = 0  # to consumers that ack
        self.deliver_no_ack = 0  # to consumers with no-ack (and browsers)
        self.get = 0  # basic.get that must be acked
        self.get_no_ack = 0
        self.redeliver = 0  # of those above, the ones with the redelivered flag
        self.ack = 0  # acked by a client (a no-ack delivery's own settle is not counted)
        self.get_empty = 0  # basic.get that found nothing

    def row(self) -> list[int]:
        return [getattr(self, name) for name in QUEUE_FIELDS]


class MessageCounts(QueueCounts):
    """The broker's counters: every queue's (kept when a queue goes), and the publishers'."""

    __slots__ = ("confirm", "drop_unroutable", "publish", "publish_confirm", "return_unroutable",
                 "routed")

    def __init__(self) -> None:
        super().__init__()
        self.publish = 0  # messages received from publishers
        self.publish_confirm = 0  # ... on channels in confirm mode
        self.routed = 0  # copies routed to queues (RabbitMQ's messages_routed: one per queue)
        self.return_unroutable = 0  # mandatory and routed nowhere: basic.return
        self.drop_unroutable = 0  # not mandatory and routed nowhere: dropped
        self.confirm = 0  # publisher confirms (acks) sent

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESSAGE_FIELDS}
