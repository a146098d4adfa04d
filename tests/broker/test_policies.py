"""Policies (broker.topology.policies): validation, which policy wins, policy against x-arguments,
and a policy set or cleared on a running virtual host changing its queues and exchanges."""

from __future__ import annotations

from typing import Any

import pytest

from broker.messages.message import Message
from broker.queues.queue import Queue
from broker.topology.policies import (
    Policy,
    PolicyError,
    effective_alternate,
    effective_queue_arguments,
    make_policy,
    merged_definition,
    winner,
)
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, message


def _p(name: str, pattern: str, definition: dict[str, Any], priority: int = 0,
       apply_to: str = "all", *, operator: bool = False) -> Policy:
    return make_policy("/", name, pattern, definition, priority, apply_to, operator=operator)


def _set(vhost: VirtualHost, policy: Policy) -> None:
    vhost.policies.table(policy.name.startswith("op-"))[policy.name] = policy
    vhost.apply_policies()


def _clear(vhost: VirtualHost, name: str) -> None:
    vhost.policies.policies.pop(name, None)
    vhost.policies.operator.pop(name, None)
    vhost.apply_policies()


# ------------------------------------------------------------------------- validation


def test_valid_policy_defaults_apply_to_all_and_priority_zero() -> None:
    p = make_policy("/", "p", "^q", {"max-length": 5}, None, None)
    assert (p.apply_to, p.priority) == ("all", 0)
    assert p.as_json() == {"vhost": "/", "name": "p", "pattern": "^q", "apply-to": "all",
                           "definition": {"max-length": 5}, "priority": 0}


@pytest.mark.parametrize(("definition", "text"), [
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"message-ttl": "x"}, '<<"x">> is not a valid message TTL'),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"overflow": "drop"}, '<<"drop">> is not a valid overflow value'),
    ({"dead-letter-exchange": 1}, "1 is not a valid dead letter exchange name"),
    ({"queue-mode": "fast"}, '<<"fast">> is not a valid queue-mode value'),
    ({"delivery-limit": True}, "true is not a valid delivery limit"),
    ({"foo": "bar"}, '[{<<"foo">>,<<"bar">>}] are not recognised policy settings'),
    ({}, "no policy provided"),
])
def test_invalid_definitions_are_refused_with_rabbitmqs_text(definition: dict[str, Any],
                                                             text: str) -> None:
    with pytest.raises(PolicyError) as refused:
        _p("p", ".*", definition)
    assert str(refused.value) == f"Validation failed\n\n{text}\n"


def test_bad_apply_to_pattern_and_priority_are_each_named() -> None:
    with pytest.raises(PolicyError) as refused:
        make_policy("/", "p", "(", {"max-length": 1}, "high", "streamz")
    lines = str(refused.value).splitlines()
    assert lines[:2] == ["Validation failed", ""]
    assert lines[2].startswith("apply-to 'streamz' unrecognised")
    assert lines[3].startswith("pattern should be regular expression but is invalid")
    assert lines[4] == 'priority should be a number, actually was <<"high">>'


def test_operator_policies_take_the_numeric_limits_only() -> None:
    _p("op", ".*", {"max-length": 1}, operator=True)
    with pytest.raises(PolicyError, match="are not recognised policy settings"):
        _p("op", ".*", {"dead-letter-exchange": "x"}, operator=True)


# ----------------------------------------------------------------------- resolution


def test_highest_priority_wins_then_the_first_name() -> None:
    low, high = _p("low", "q", {"max-length": 1}, 1), _p("high", "q", {"max-length": 2}, 5)
    assert winner([low, high], "queue", "q") is high
    b, a = _p("b", "q", {"max-length": 1}), _p("a", "q", {"max-length": 2})
    assert winner([b, a], "queue", "q") is a  # equal priorities: by name


def test_pattern_is_searched_not_anchored() -> None:
    p = _p("p", "orders", {"max-length": 1})
    assert p.applies_to("queue", "eu.orders.v1") and not p.applies_to("queue", "order")
    assert not _p("p", "^orders$", {"max-length": 1}).applies_to("queue", "orders2")


def test_apply_to_limits_the_kind() -> None:
    q, x = _p("q", ".*", {"max-length": 1}, apply_to="queues"), _p("x", ".*", {"max-length": 1},
                                                                    apply_to="exchanges")
    assert q.applies_to("queue", "a") and not q.applies_to("exchange", "a")
    assert x.applies_to("exchange", "a") and not x.applies_to("queue", "a")
    assert winner([q, x], "exchange", "a") is x


def test_smaller_of_argument_and_policy_for_limits_the_argument_for_the_rest() -> None:
    definition = {"max-length": 5, "message-ttl": 1000, "expires": 60000, "max-length-bytes": 10,
                  "delivery-limit": 3, "overflow": "reject-publish",
                  "dead-letter-exchange": "pol-dlx", "dead-letter-routing-key": "pol-rk"}
    own = {"x-max-length": 10, "x-message-ttl": 500, "x-expires": 1000, "x-max-length-bytes": 100,
           "x-delivery-limit": 1, "x-overflow": "drop-head", "x-dead-letter-exchange": "own-dlx"}
    assert effective_queue_arguments(own, definition) == {
        "x-max-length": 5, "x-message-ttl": 500, "x-expires": 1000, "x-max-length-bytes": 10,
        "x-delivery-limit": 1, "x-overflow": "drop-head", "x-dead-letter-exchange": "own-dlx",
        "x-dead-letter-routing-key": "pol-rk"}


def test_operator_policy_caps_the_user_policy() -> None:
    user = _p("p", ".*", {"max-length": 100, "dead-letter-exchange": "d"})
    op = _p("op", ".*", {"max-length": 10, "message-ttl": 5}, operator=True)
    assert merged_definition(user, op) == {"max-length": 10, "dead-letter-exchange": "d",
                                           "message-ttl": 5}
    assert merged_definition(None, None) is None


def test_alternate_exchange_argument_wins_over_the_policy() -> None:
    assert effective_alternate({"alternate-exchange": "own"}, {"alternate-exchange": "pol"}) == "own"
    assert effective_alternate({}, {"alternate-exchange": "pol"}) == "pol"
    assert effective_alternate(None, None) is None


# ------------------------------------------------------------- on a virtual host


def _fill(vhost: VirtualHost, q: Queue, n: int) -> list[Message]:
    sent = [message(q.name) for _ in range(n)]
    for m in sent:
        vhost.publish("", m)
    return sent


def test_max_length_policy_drops_the_head_of_an_existing_plain_queue(
        vhost: VirtualHost, dlq: Queue) -> None:
    q = vhost.declare_queue("q", owner=ME)
    sent = _fill(vhost, q, 10)
    _set(vhost, _p("cap", "^q$", {"max-length": 4, "dead-letter-exchange": "dlx"}))
    vhost.drain()
    assert q.message_count == 4 and not q.plain
    assert [e.message for e in q.available_entries()] == sent[6:]
    assert dlq.message_count == 6
    assert vhost.policy_of("queue", "q") == ("cap", {"max-length": 4, "dead-letter-exchange": "dlx"})
    assert vhost.policy_of("queue", "dlq") == (None, None)


def test_policy_applies_to_queues_declared_later_and_clearing_restores_own_arguments(
        vhost: VirtualHost) -> None:
    _set(vhost, _p("cap", "^q", {"max-length": 2}))
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 5})
    assert q.settings.max_length == 2 and q.arguments == {"x-max-length": 5}
    _fill(vhost, q, 4)
    assert q.message_count == 2
    _clear(vhost, "cap")
    assert q.settings.max_length == 5
    _fill(vhost, q, 4)
    assert q.message_count == 5
    # redeclaring with the queue's own arguments is still equivalent
    assert vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 5}) is q


def test_message_ttl_policy_applies_to_messages_enqueued_after(
        vhost: VirtualHost, dropped: list[Message]) -> None:
    q = vhost.declare_queue("q", owner=ME)
    (before,) = _fill(vhost, q, 1)
    _set(vhost, _p("ttl", "^q$", {"message-ttl": 1000}))
    (after,) = [message("q")]
    vhost.publish("", after, now=0.0)
    vhost.tick(2.0)
    assert dropped == []  # the head never expires: it was enqueued before the policy
    assert q.get(now=2.0).message is before  # type: ignore[union-attr]
    # rabbit_amqqueue_process fetch: the expired messages the fetch left at the head go at once
    assert q.message_count == 0 and dropped == [after]
    assert q.get(now=2.0) is None


def test_higher_priority_policy_set_later_takes_over(vhost: VirtualHost) -> None:
    q = vhost.declare_queue("q", owner=ME)
    _set(vhost, _p("a", "q", {"max-length": 7}))
    _set(vhost, _p("b", "q", {"max-length": 3}, priority=1))
    assert q.settings.max_length == 3 and vhost.policy_of("queue", "q")[0] == "b"
    _clear(vhost, "b")
    assert q.settings.max_length == 7


def test_expires_policy_gives_a_queue_a_lease(vhost: VirtualHost) -> None:
    vhost.declare_queue("q", owner=ME)
    _set(vhost, _p("exp", "^q$", {"expires": 1000}))
    vhost.tick(vhost.now + 2.0)
    assert "q" not in vhost.queues


def test_dead_letter_policy_changes_where_dead_letters_go(vhost: VirtualHost, dlq: Queue) -> None:
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 1})
    _set(vhost, _p("dl", "^q$", {"dead-letter-exchange": "dlx"}))
    _fill(vhost, q, 3)
    vhost.drain()
    assert dlq.message_count == 2


def test_alternate_exchange_policy(vhost: VirtualHost) -> None:
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_queue("unrouted", owner=ME)
    vhost.bind_queue("unrouted", "ae", "", owner=ME)
    vhost.declare_exchange("x", "direct")
    _set(vhost, _p("alt", "^x$", {"alternate-exchange": "ae"}, apply_to="exchanges"))
    assert vhost.publish("x", message("nope"))[0] == 1
    assert vhost.queues["unrouted"].message_count == 1
    _clear(vhost, "alt")
    assert vhost.publish("x", message("nope"))[0] == 0


def test_operator_policy_caps_an_argument_on_the_vhost(vhost: VirtualHost) -> None:
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 50})
    _set(vhost, _p("op-cap", ".*", {"max-length": 3}, operator=True))
    assert q.settings.max_length == 3


# ------------------------------------------------------------------------- storage


def test_policies_are_stored_and_the_digest_stays_right(tmp_path: Any) -> None:
    from broker.runtime.policies import load_policies
    from broker.storage.definition_store import DefinitionStore, inspect

    path = tmp_path / "definitions.db"
    store = DefinitionStore(path)
    store.put_policy(_p("cap", "^q", {"max-length": 3}, 2).as_json())
    store.put_policy(_p("op-ttl", ".*", {"message-ttl": 9}).as_json(), operator=True)
    store.put_policy(_p("gone", "x", {"max-length": 1}).as_json())
    assert store.delete_policy("/", "gone") and not store.delete_policy("/", "gone")
    store.close()
    assert inspect(path).problem is None
    store = DefinitionStore(path)
    vhost = VirtualHost("/")
    assert load_policies(vhost, store.policies()) == []
    assert vhost.policies.policies["cap"].definition == {"max-length": 3}
    assert vhost.policies.operator["op-ttl"].definition == {"message-ttl": 9}
    assert vhost.declare_queue("q", owner=ME).settings.max_length == 3
    store.close()
