"""AMQP names the supervisor and the workers must agree on.

A pure module (no imports) so ``workers/`` may use it as it uses ``broker.errors``:
the one copy of each name both sides route or check by.
"""

from __future__ import annotations

# RabbitMQ's direct reply-to pseudo-queue: consuming from it (no-ack) gives a channel its
# reply queue, ``amq.rabbitmq.reply-to.<token>``; a publish with reply_to set to it is
# rewritten to that name.
REPLY_TO = "amq.rabbitmq.reply-to"
