"""Queue arguments validated at declare, and per-message expiration, with RabbitMQ 3.10's errors."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import PreconditionFailed
from broker.queues.arguments import parse_expiration, parse_queue_arguments
from broker.queues.consumer_modes import ExpiresWhenUnused, SingleActiveConsumer
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, message

SUBJECT = "queue 'q' in vhost '/'"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}"),
        ({"x-message-ttl": "10"}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got longstr\""),
        ({"x-message-ttl": 1.5}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got double\""),
        ({"x-message-ttl": 315_360_000_001}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_too_large,315360000001}"),
        ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
        ({"x-expires": True}, "invalid arg 'x-expires' for queue 'q' in vhost '/': \"expected integer, got bool\""),
        ({"x-max-length": -5}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-5}"),
        ({"x-max-length-bytes": "big"}, "invalid arg 'x-max-length-bytes' for queue 'q' in vhost '/': \"expected integer, got longstr\""),
        ({"x-max-priority": 256}, "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,256}"),
        ({"x-overflow": "drop-tail"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"),
        ({"x-overflow": 1}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': {unacceptable_type,signedint}"),
        ({"x-dead-letter-routing-key": "rk"}, "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': routing_key_but_no_dlx_defined"),
        ({"x-single-active-consumer": "true"}, "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': {unacceptable_type,longstr}"),
        ({"x-queue-mode": "eager"}, "invalid arg 'x-queue-mode' for queue 'q' in vhost '/': \"unsupported queue mode 'eager'\""),
        ({"x-queue-type": "fancy"}, "invalid arg 'x-queue-type' for queue 'q' in vhost '/': \"unsupported queue type 'fancy'\""),
        ({"x-delivery-limit": -1}, "invalid arg 'x-delivery-limit' for queue 'q' in vhost '/': {value_negative,-1}"),
        ({"x-dead-letter-exchange": 7}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"),
    ],
)
def test_invalid_queue_argument_is_precondition_failed(vhost: VirtualHost, arguments: dict[str, Any], error: str) -> None:
    """queue.declare with a bad x-argument: 406 "invalid arg '<key>' for queue ...: <term>"; no queue."""
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_queue("q", owner=ME, arguments=arguments)
    assert err.value.reply_code == 406 and err.value.reply_text == error
    assert "q" not in vhost.queues


def test_queue_arguments_are_checked_in_rabbitmq_order() -> None:
    """The first failing argument in RabbitMQ's order is reported: x-queue-type, then x-expires, then x-message-ttl."""
    bad = {"x-message-ttl": -1, "x-expires": 0, "x-queue-type": "nope"}
    with pytest.raises(PreconditionFailed, match="'x-queue-type'"):
        parse_queue_arguments(bad, SUBJECT)
    del bad["x-queue-type"]
    with pytest.raises(PreconditionFailed, match="'x-expires'"):
        parse_queue_arguments(bad, SUBJECT)


def test_valid_arguments_are_parsed() -> None:
    """Valid arguments become settings; unknown arguments are accepted and ignored."""
    settings = parse_queue_arguments(
        {
            "x-message-ttl": 1000, "x-expires": 5000, "x-max-length": 3, "x-max-length-bytes": 100,
            "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "dead", "x-max-priority": 10,
            "x-single-active-consumer": True, "x-delivery-limit": 2, "whatever": [1],
        },
        SUBJECT,
    )
    assert (settings.message_ttl, settings.expires, settings.max_length, settings.max_length_bytes) == (1000, 5000, 3, 100)
    assert settings.overflow == "reject-publish-dlx"
    assert (settings.dead_letter_exchange, settings.dead_letter_routing_key) == ("dlx", "dead")
    assert (settings.max_priority, settings.single_active_consumer, settings.delivery_limit) == (10, True, 2)


def test_qpid_group_and_hold_arguments_are_parsed() -> None:
    """qpid.group_header_key / qpid.shared_msg_group / holdOnPublishEnabled as Qpid Broker-J reads them."""
    shared = parse_queue_arguments({"qpid.shared_msg_group": 1, HOLD: "true"}, SUBJECT)
    assert shared.group_header == "JMSXGroupID" and shared.shared_groups and shared.hold_on_publish
    assert shared.default_group == "qpid.no-group"
    standard = parse_queue_arguments({"qpid.group_header_key": "g"}, SUBJECT)
    assert standard.group_header == "g" and not standard.shared_groups
    assert parse_queue_arguments({"qpid.shared_msg_group": "0"}, SUBJECT).group_header is None


HOLD = "holdOnPublishEnabled"


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({}, Queue),
        ({"x-queue-type": "classic", "x-dead-letter-exchange": "dlx"}, Queue),
        ({"x-message-ttl": 10}, FeaturedQueue),
        ({"x-max-priority": 3}, FeaturedQueue),
        ({"x-max-length": 3}, FeaturedQueue),
        ({"qpid.group_header_key": "g"}, FeaturedQueue),
        ({HOLD: True}, FeaturedQueue),
        ({"x-delivery-limit": 1}, FeaturedQueue),
    ],
)
def test_storage_is_chosen_at_declare(vhost: VirtualHost, arguments: dict[str, Any], kind: type) -> None:
    """A queue without storage-changing arguments keeps the plain FIFO (the fast path)."""
    q = vhost.declare_queue("q", owner=ME, arguments=arguments)
    assert type(q) is kind and q.plain is (kind is Queue)


def test_consumer_modes_are_mixed_into_either_storage(vhost: VirtualHost) -> None:
    """x-single-active-consumer and x-expires combine with plain and featured storage."""
    plain = vhost.declare_queue("p", owner=ME, arguments={"x-single-active-consumer": True, "x-expires": 100})
    featured = vhost.declare_queue("f", owner=ME, arguments={"x-single-active-consumer": True, "x-max-priority": 2})
    assert isinstance(plain.single_active, SingleActiveConsumer) and isinstance(plain.lease, ExpiresWhenUnused) and plain.plain
    assert isinstance(featured.single_active, SingleActiveConsumer) and isinstance(featured, FeaturedQueue)


def test_redeclare_with_other_delivery_limit_is_inequivalent(vhost: VirtualHost) -> None:
    """x-delivery-limit is compared on redeclare, as quorum queues do."""
    vhost.declare_queue("q", owner=ME, arguments={"x-delivery-limit": 2})
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'x-delivery-limit'"):
        vhost.declare_queue("q", owner=ME, arguments={"x-delivery-limit": 3})


@pytest.mark.parametrize(
    ("expiration", "error"),
    [
        ("abc", "invalid expiration 'abc': no_integer"),
        ("", "invalid expiration '': no_integer"),
        ("-5", "invalid expiration '-5': {value_negative,-5}"),
        ("10s", "invalid expiration '10s': {leftover_string,\"s\"}"),
        ("315360000001", "invalid expiration '315360000001': {value_too_large,315360000001}"),
    ],
)
def test_invalid_expiration_is_precondition_failed(vhost: VirtualHost, expiration: str, error: str) -> None:
    """basic.publish with a bad expiration property: 406 "invalid expiration '...': ..."; nothing routed."""
    q = vhost.declare_queue("q", owner=ME)
    with pytest.raises(PreconditionFailed) as err:
        vhost.publish("", message("q", expiration=expiration))
    assert err.value.reply_text == error
    assert q.message_count == 0 and q.plain


def test_valid_expirations_parse_to_milliseconds() -> None:
    """An expiration is a decimal string of milliseconds (a leading + is accepted, as Erlang does)."""
    assert parse_expiration("0") == 0 and parse_expiration("+250") == 250 and parse_expiration(b"60000") == 60000
