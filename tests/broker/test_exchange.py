"""Exchange routing as RabbitMQ does it: direct, fanout, topic and headers (AMQP 0-9-1 §3.1.3)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.errors import CommandInvalid, PreconditionFailed
from broker.topology.exchange import Exchange
from broker.topology.exchange_types import _HeadersMatcher, topic_words


def _topic(*patterns: str) -> Exchange:
    ex = Exchange("t", "topic")
    for i, pattern in enumerate(patterns):
        ex.bind(f"q{i}", pattern)
    return ex


# ------------------------------------------------------------------------------- direct


def test_direct_exchange_routes_on_exact_routing_key() -> None:
    """A direct exchange routes to queues bound with exactly the message's routing key."""
    ex = Exchange("d", "direct")
    ex.bind("a", "red")
    ex.bind("b", "red")
    ex.bind("c", "green")
    assert ex.route("red") == {"a", "b"}
    assert ex.route("green") == {"c"}
    assert ex.route("Red") == set()
    assert ex.route("") == set()


def test_direct_exchange_routes_once_per_queue_with_several_bindings() -> None:
    """A queue bound twice (different arguments) receives one copy; unbinding one keeps the other."""
    ex = Exchange("d", "direct")
    assert ex.bind("a", "k", {"x": 1})
    assert ex.bind("a", "k", {"x": 2})
    assert ex.route("k") == {"a"}
    assert ex.unbind("a", "k", {"x": 1})
    assert ex.route("k") == {"a"}
    assert ex.unbind("a", "k", {"x": 2})
    assert ex.route("k") == set() and not ex.has_bindings


# ------------------------------------------------------------------------------- fanout


def test_fanout_exchange_ignores_routing_key() -> None:
    """A fanout exchange routes to every bound queue whatever the routing key."""
    ex = Exchange("f", "fanout")
    ex.bind("a", "")
    ex.bind("b", "whatever")
    assert ex.route("anything") == {"a", "b"}
    ex.unbind("a", "")
    assert ex.route("") == {"b"}


# -------------------------------------------------------------------------------- topic


@pytest.mark.parametrize(
    ("pattern", "routing_key", "matches"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("*", "a", True),
        ("*", "", False),
        ("*", "a.b", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.b.*", "a.b.c", True),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("#.a", "a", True),
        ("#.a", "x.y.a", True),
        ("#.a", "a.x", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("#.#", "", True),
        ("#.*", "", False),
        ("#.*", "a.b", True),
        ("*.#", "a", True),
        ("#.#.#.#.x", "a.b.c.d.e.f.g.h.x", True),
        ("", "", True),
        ("", "a", False),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("*.*", ".", True),
        ("stock.usd.*", "stock.usd.nyse", True),
        ("*.usd.#", "stock.eur.nyse", False),
    ],
)
def test_topic_exchange_matches_like_rabbitmq(pattern: str, routing_key: str, matches: bool) -> None:
    """Topic: '*' is exactly one word, '#' zero or more words, words are separated by '.'."""
    expected = {"q0"} if matches else set()
    assert _topic(pattern).route(routing_key) == expected


def test_topic_words_split_like_rabbitmq() -> None:
    """RabbitMQ split_topic_key: the empty key has no words; empty words are words."""
    assert topic_words("") == []
    assert topic_words(".") == ["", ""]
    assert topic_words("a..b") == ["a", "", "b"]


def test_topic_exchange_routes_to_each_matching_queue_once() -> None:
    """A message matching several bindings of one queue is routed to it once."""
    ex = Exchange("t", "topic")
    ex.bind("q", "a.#")
    ex.bind("q", "#.b")
    ex.bind("r", "a.*")
    assert ex.route("a.b") == {"q", "r"}


def test_topic_exchange_reroutes_after_bindings_change() -> None:
    """Cached routes follow binding changes: a new binding is seen, a removed one is forgotten."""
    ex = Exchange("t", "topic")
    ex.bind("q", "a.*")
    assert ex.route("a.b") == {"q"}
    ex.bind("r", "#")
    assert ex.route("a.b") == {"q", "r"}
    ex.unbind("q", "a.*")
    assert ex.route("a.b") == {"r"}
    ex.unbind("r", "#")
    assert ex.route("a.b") == set()


def test_topic_unbind_prunes_only_its_own_branch() -> None:
    """Removing 'a.b.c' keeps 'a.b' routing."""
    ex = Exchange("t", "topic")
    ex.bind("short", "a.b")
    ex.bind("long", "a.b.c")
    ex.unbind("long", "a.b.c")
    assert ex.route("a.b") == {"short"}
    assert ex.route("a.b.c") == set()


# ------------------------------------------------------------------------------ headers


def _headers(arguments: dict[str, Any]) -> Exchange:
    ex = Exchange("h", "headers")
    ex.bind("q", "", arguments)
    return ex


@pytest.mark.parametrize(
    ("arguments", "headers", "matches"),
    [
        # x-match all (the default): every binding key present with an equal value
        ({"format": "pdf", "type": "report"}, {"format": "pdf", "type": "report", "x": 1}, True),
        ({"format": "pdf", "type": "report"}, {"format": "pdf"}, False),
        ({"x-match": "all", "format": "pdf"}, {"format": "zip"}, False),
        ({"x-match": "all"}, {}, True),
        ({"x-match": "all"}, None, True),
        ({"format": "pdf"}, None, False),
        # x-match any: one equal value is enough
        ({"x-match": "any", "format": "pdf", "type": "log"}, {"type": "log"}, True),
        ({"x-match": "any", "format": "pdf", "type": "log"}, {"type": "report"}, False),
        ({"x-match": "any"}, {"a": 1}, False),
        # plain all/any ignore binding keys starting with x-
        ({"x-match": "all", "x-tenant": "t1"}, {"x-tenant": "t2"}, True),
        ({"x-match": "any", "x-tenant": "t1"}, {"x-tenant": "t1"}, False),
        # *-with-x compare x- keys too (x-match itself never)
        ({"x-match": "all-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
        ({"x-match": "all-with-x", "x-tenant": "t1"}, {"x-tenant": "t1"}, True),
        ({"x-match": "any-with-x", "x-tenant": "t1", "k": 1}, {"x-tenant": "t1"}, True),
        ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
        # a binding value with no value (void) matches on presence
        ({"flag": None}, {"flag": "anything"}, True),
        ({"flag": None}, {"other": 1}, False),
        ({"x-match": "any", "flag": None, "k": 1}, {"flag": 0}, True),
        # values compare as Erlang ==: 1 == 1.0, booleans are not numbers, str == bytes
        ({"n": 1}, {"n": 1.0}, True),
        ({"n": 1}, {"n": True}, False),
        ({"s": "abc"}, {"s": b"abc"}, True),
    ],
)
def test_headers_exchange_matches_like_rabbitmq(
    arguments: dict[str, Any], headers: dict[str, Any] | None, matches: bool
) -> None:
    """Headers: x-match all (default) / any / all-with-x / any-with-x; void binding values test presence."""
    assert _headers(arguments).route("ignored", headers) == ({"q"} if matches else set())


_VALUES: list[Any] = [1, 1.0, 2, True, False, "s", b"s", "t", None, [1, 2], {"n": 1}]
_MODES = ["all", "any", "all-with-x", "any-with-x"]


def test_headers_routes_with_its_index_as_matching_every_binding_would() -> None:
    """The headers exchange looks only at the bindings a message's headers lead to: over random
    bindings (every x-match mode, void fields, values alike across types, arrays and tables)
    bound and unbound in turn, each route equals matching the message against every binding."""
    rng = random.Random(1909)
    ex = Exchange("h", "headers")
    bound: list[tuple[str, dict[str, Any]]] = []
    for trial in range(3000):
        if bound and rng.random() < 0.3:
            dest, args = bound.pop(rng.randrange(len(bound)))
            assert ex.unbind(dest, "", args)
        else:
            fields = rng.sample(["a", "b", "c", "x-t"], rng.randint(0, 3))
            args = {k: rng.choice(_VALUES) for k in fields}
            if rng.random() < 0.8:
                args["x-match"] = rng.choice(_MODES)
            dest = f"q{trial % 40}"
            if ex.bind(dest, "", args):
                bound.append((dest, args))
        fields = rng.sample(["a", "b", "c", "x-t", "d"], rng.randint(0, 4))
        headers = {k: rng.choice(_VALUES) for k in fields} if rng.random() < 0.9 else None
        every = {dest for dest, matches in ex._router._matchers.values()  # type: ignore[union-attr]
                 if matches(headers or {})}
        assert ex.route("", headers) == every, (headers, bound)


def test_a_headers_route_matches_only_the_bindings_its_headers_lead_to(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 bindings, one value each of the same header: a message is matched against the
    one binding with its value (RabbitMQ matches all 10,000: ~4.5 ms a message here)."""
    ex = Exchange("h", "headers")
    for i in range(10_000):
        ex.bind(f"q{i}", "", {"x-match": "all", "k": f"v{i}", "kind": "job"})
    ex.bind("everything", "", {"x-match": "all"})
    ex.bind("jobs", "", {"x-match": "any", "kind": "job", "other": 1})
    calls = 0
    matcher_call = _HeadersMatcher.__call__

    def counted(self: _HeadersMatcher, headers: Any) -> bool:
        nonlocal calls
        calls += 1
        return matcher_call(self, headers)

    monkeypatch.setattr(_HeadersMatcher, "__call__", counted)
    assert ex.route("", {"k": "v5", "kind": "job"}) == {"q5", "everything", "jobs"}
    assert calls <= 4


def test_headers_binding_with_invalid_x_match_is_refused() -> None:
    """RabbitMQ validate_binding: an x-match other than all/any/all-with-x/any-with-x is 406."""
    ex = Exchange("h", "headers")
    with pytest.raises(PreconditionFailed) as err:
        ex.bind("q", "", {"x-match": "some"})
    assert err.value.reply_code == 406
    assert "expected all, any, all-with-x, or any-with-x" in err.value.reply_text
    with pytest.raises(PreconditionFailed, match="expected longstr"):
        ex.bind("q", "", {"x-match": 1})
    assert not ex.has_bindings


# ----------------------------------------------------------------------------- bindings


def test_bind_is_idempotent_and_unbind_reports_absence() -> None:
    """Binding twice identically is one binding (argument order ignored); unbinding nothing is False."""
    ex = Exchange("d", "direct")
    assert ex.bind("q", "k", {"a": 1, "b": 2}) is True
    assert ex.bind("q", "k", {"b": 2, "a": 1}) is False
    assert len(ex.bindings()) == 1
    assert ex.unbind("q", "other") is False
    assert ex.unbind("q", "k", {"a": 1, "b": 2}) is True
    assert ex.bindings() == []


def test_unbind_destination_removes_every_binding_of_a_queue() -> None:
    """Deleting a queue removes all its bindings from the exchange."""
    ex = Exchange("t", "topic")
    ex.bind("q", "a.*")
    ex.bind("q", "#")
    ex.bind("r", "a.b")
    assert ex.unbind_destination("q") == 2
    assert ex.route("a.b") == {"r"}
    assert not ex.is_bound("q") and ex.destinations() == ["r"]


def test_unknown_exchange_type_is_command_invalid() -> None:
    """RabbitMQ replies 503 COMMAND_INVALID (a connection error) to an unknown exchange type."""
    with pytest.raises(CommandInvalid) as err:
        Exchange("x", "foo")
    assert err.value.reply_code == 503 and err.value.hard
    assert err.value.reply_text == "invalid exchange type 'foo'"


def test_exchange_equivalence_compares_properties_and_alternate_exchange() -> None:
    """Redeclare checks type, durable, auto_delete, internal and alternate-exchange, like RabbitMQ."""
    ex = Exchange("x", "direct", durable=True, arguments={"alternate-exchange": "ae"})
    assert ex.equivalent("direct", durable=True, arguments={"alternate-exchange": "ae", "other": 1})
    assert not ex.equivalent("fanout", durable=True, arguments={"alternate-exchange": "ae"})
    assert not ex.equivalent("direct", durable=False, arguments={"alternate-exchange": "ae"})
    assert not ex.equivalent("direct", durable=True, internal=True, arguments={"alternate-exchange": "ae"})
    assert not ex.equivalent("direct", durable=True, arguments={"alternate-exchange": "other"})
    assert not ex.equivalent("direct", durable=True)
    diff = ex.inequivalent_arg("direct", durable=True, auto_delete=True, arguments={"alternate-exchange": "ae"})
    assert diff is not None and (diff.field, diff.received, diff.current) == ("auto_delete", "'true'", "'false'")
