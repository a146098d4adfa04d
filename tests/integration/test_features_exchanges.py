"""Exchange features through pika: exchange-to-exchange bindings, alternate, internal and
auto-delete exchanges, headers matching (x-match all / any / all-with-x / any-with-x) and topic
wildcards, each checked against what RabbitMQ 3.10 does."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.harness import (
    Broker,
    Names,
    channel_close_code,
    pump,
    ready_count,
    wait_until,
)
from tests.integration.queue_helpers import _bodies, _queues


def _exchange_lookup(connection: pika.BlockingConnection, exchange: str) -> int | None:
    """None if a passive exchange.declare succeeds, else the reply code that closed the channel."""
    channel = connection.channel()
    try:
        channel.exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    channel.close()
    return None


def _close_code(action) -> int:
    """Reply code of the channel.close that a synchronous pika call provokes."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        action()
    return caught.value.reply_code


# --------------------------------------------------------------------------- exchange-to-exchange


def test_exchange_to_exchange_bindings_route_transitively(shared_broker: Broker, names: Names) -> None:
    """exchange.bind makes a destination exchange route what its source routes to it, through
    any number of hops, each hop applying its own type's matching; exchange.unbind undoes it."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    entry, middle, last = names("entry"), names("middle"), names("last")
    channel.exchange_declare(entry, "direct")
    channel.exchange_declare(middle, "topic")
    channel.exchange_declare(last, "fanout")
    via_middle, via_last = _queues(channel, names, "via-middle", "via-last")
    channel.exchange_bind(destination=middle, source=entry, routing_key="a.b")
    channel.exchange_bind(destination=last, source=middle, routing_key="a.*")
    channel.queue_bind(via_middle, middle, routing_key="#")
    channel.queue_bind(via_last, last)

    channel.basic_publish(entry, "a.b", b"two hops")
    channel.basic_publish(entry, "a.c", b"no binding on entry for a.c")
    channel.basic_publish(middle, "a.b.c", b"straight to middle, not a.*")
    assert _bodies(channel, via_middle) == [b"two hops", b"straight to middle, not a.*"]
    assert _bodies(channel, via_last) == [b"two hops"]

    channel.exchange_unbind(destination=last, source=middle, routing_key="a.*")
    channel.basic_publish(entry, "a.b", b"after unbind")
    assert _bodies(channel, via_middle) == [b"after unbind"]
    assert _bodies(channel, via_last) == []


def test_message_reaching_a_queue_by_two_paths_is_enqueued_once(shared_broker: Broker, names: Names) -> None:
    """A queue reachable from the published-to exchange both directly and through another
    exchange gets one copy of the message, as RabbitMQ de-duplicates routing destinations."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, destination = names("source"), names("destination")
    channel.exchange_declare(source, "fanout")
    channel.exchange_declare(destination, "fanout")
    (queue,) = _queues(channel, names, "q")
    channel.queue_bind(queue, source)
    channel.queue_bind(queue, destination)
    channel.exchange_bind(destination=destination, source=source)
    channel.basic_publish(source, "", b"once")
    assert _bodies(channel, queue) == [b"once"]


def test_exchange_binding_cycles_terminate_and_deliver_once(shared_broker: Broker, names: Names) -> None:
    """Exchanges bound to each other in a cycle (and to themselves) route a message to each
    reachable queue exactly once, and the broker keeps serving."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    first, second, third = names("x1"), names("x2"), names("x3")
    for exchange in (first, second, third):
        channel.exchange_declare(exchange, "fanout")
    channel.exchange_bind(destination=second, source=first)
    channel.exchange_bind(destination=third, source=second)
    channel.exchange_bind(destination=first, source=third)
    channel.exchange_bind(destination=first, source=first)
    on_first, on_third = _queues(channel, names, "on-first", "on-third")
    channel.queue_bind(on_first, first)
    channel.queue_bind(on_third, third)

    channel.basic_publish(second, "", b"round and round")
    assert _bodies(channel, on_first) == [b"round and round"]
    assert _bodies(channel, on_third) == [b"round and round"]
    assert connection.is_open


def test_mandatory_publish_follows_exchange_bindings(shared_broker: Broker, names: Names) -> None:
    """A mandatory message that reaches a queue only through an exchange-to-exchange binding is
    not returned; one that the destination exchange cannot route is (312 NO_ROUTE)."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, destination = names("source"), names("destination")
    channel.exchange_declare(source, "fanout")
    channel.exchange_declare(destination, "direct")
    channel.exchange_bind(destination=destination, source=source)
    (queue,) = _queues(channel, names, "q")
    channel.queue_bind(queue, destination, routing_key="wanted")
    channel.basic_publish(source, "wanted", b"delivered", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish(source, "unwanted", b"returned", mandatory=True)
    assert _bodies(channel, queue) == [b"delivered"]


def test_exchange_delete_removes_bindings_both_ways(shared_broker: Broker, names: Names) -> None:
    """exchange.delete removes the bindings it is source or destination of: an auto-delete
    source left without bindings goes too; if-unused refuses (406) only an exchange that is
    the source of a binding."""
    connection = shared_broker.connect()
    channel = connection.channel()
    auto_source, plain_source, destination = (
        names("auto-source"),
        names("plain-source"),
        names("destination"),
    )
    channel.exchange_declare(auto_source, "fanout", auto_delete=True)
    channel.exchange_declare(plain_source, "fanout")
    channel.exchange_declare(destination, "fanout")
    channel.exchange_bind(destination=destination, source=auto_source)
    channel.exchange_bind(destination=destination, source=plain_source)
    (queue,) = _queues(channel, names, "q")
    channel.queue_bind(queue, destination)

    assert _close_code(lambda: connection.channel().exchange_delete(plain_source, if_unused=True)) == 406
    assert _close_code(lambda: connection.channel().exchange_delete(destination, if_unused=True)) == 406
    channel.queue_unbind(queue, destination)
    channel.exchange_delete(destination, if_unused=True)  # only a destination now: unused
    wait_until(
        lambda: _exchange_lookup(connection, auto_source) == 404,
        5,
        "the auto-delete source to go",
    )
    assert _exchange_lookup(connection, plain_source) is None
    channel.exchange_delete(plain_source, if_unused=True)  # its binding went with the destination


def test_exchange_bind_to_a_missing_exchange_is_404(shared_broker: Broker, names: Names) -> None:
    """exchange.bind naming a source or destination exchange that does not exist closes the
    channel with 404 NOT_FOUND."""
    connection = shared_broker.connect()
    present = names("present")
    connection.channel().exchange_declare(present, "fanout")
    assert _close_code(lambda: connection.channel().exchange_bind(present, names("missing-src"))) == 404
    assert _close_code(lambda: connection.channel().exchange_bind(names("missing-dst"), present)) == 404
    assert connection.is_open


# --------------------------------------------------------------------------- alternate exchanges


def test_alternate_exchange_takes_what_the_exchange_cannot_route(shared_broker: Broker, names: Names) -> None:
    """An exchange declared with `alternate-exchange` hands every message it cannot route to that
    exchange; such a mandatory message is not returned, and routable ones never go there."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    exchange, alternate = names("x"), names("ae")
    channel.exchange_declare(alternate, "fanout")
    channel.exchange_declare(exchange, "direct", arguments={"alternate-exchange": alternate})
    routed, unrouted = _queues(channel, names, "routed", "unrouted")
    channel.queue_bind(routed, exchange, routing_key="known")
    channel.queue_bind(unrouted, alternate)

    channel.basic_publish(exchange, "known", b"routed")
    channel.basic_publish(exchange, "unknown", b"to the alternate", mandatory=True)  # no UnroutableError
    assert _bodies(channel, routed) == [b"routed"]
    assert _bodies(channel, unrouted) == [b"to the alternate"]


def test_alternate_exchange_that_routes_nowhere_returns_mandatory(
    shared_broker: Broker, names: Names
) -> None:
    """When the alternate exchange is missing or cannot route either, a mandatory message is
    returned (312 NO_ROUTE) and a non-mandatory one is dropped."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    to_missing, to_empty, empty_alternate = (
        names("to-missing"),
        names("to-empty"),
        names("empty-ae"),
    )
    channel.exchange_declare(empty_alternate, "direct")
    channel.exchange_declare(to_missing, "direct", arguments={"alternate-exchange": names("no-such-ae")})
    channel.exchange_declare(to_empty, "direct", arguments={"alternate-exchange": empty_alternate})
    for exchange in (to_missing, to_empty):
        with pytest.raises(pika.exceptions.UnroutableError) as caught:
            channel.basic_publish(exchange, "nowhere", b"returned", mandatory=True)
        assert [message.body for message in caught.value.messages] == [b"returned"]
        assert caught.value.messages[0].method.reply_code == 312
        assert caught.value.messages[0].method.exchange == exchange
        channel.basic_publish(exchange, "nowhere", b"dropped quietly")  # confirmed, not returned


def test_alternate_exchanges_chain(shared_broker: Broker, names: Names) -> None:
    """An alternate exchange that cannot route a message passes it on to its own alternate exchange."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    first, second, third = names("x"), names("ae1"), names("ae2")
    channel.exchange_declare(third, "fanout")
    channel.exchange_declare(second, "direct", arguments={"alternate-exchange": third})
    channel.exchange_declare(first, "direct", arguments={"alternate-exchange": second})
    on_second, on_third = _queues(channel, names, "on-ae1", "on-ae2")
    channel.queue_bind(on_second, second, routing_key="second-knows")
    channel.queue_bind(on_third, third)
    channel.basic_publish(first, "second-knows", b"stops at ae1")
    channel.basic_publish(first, "nobody-knows", b"ends at ae2")
    assert _bodies(channel, on_second) == [b"stops at ae1"]
    assert _bodies(channel, on_third) == [b"ends at ae2"]


def test_alternate_exchange_of_a_bound_destination_is_used(shared_broker: Broker, names: Names) -> None:
    """An exchange reached through an exchange-to-exchange binding that cannot route a message
    hands it to its own alternate exchange, which may be internal."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, destination, alternate = names("source"), names("destination"), names("ae")
    channel.exchange_declare(alternate, "fanout", internal=True)
    channel.exchange_declare(destination, "direct", arguments={"alternate-exchange": alternate})
    channel.exchange_declare(source, "fanout")
    channel.exchange_bind(destination=destination, source=source)
    (queue,) = _queues(channel, names, "q")
    channel.queue_bind(queue, alternate)
    channel.basic_publish(source, "unknown", b"via the source")
    channel.basic_publish(destination, "unknown", b"straight to the destination")
    assert _bodies(channel, queue) == [b"via the source", b"straight to the destination"]


def test_binding_to_or_from_the_default_exchange_is_403(shared_broker: Broker, names: Names) -> None:
    """exchange.bind with the default exchange as source or destination, and queue.bind to it,
    are 403 ACCESS_REFUSED "operation not permitted on the default exchange"."""
    connection = shared_broker.connect()
    exchange = names("x")
    connection.channel().exchange_declare(exchange, "fanout")
    (queue,) = _queues(connection.channel(), names, "q")
    for action in (
        lambda channel: channel.exchange_bind(destination=exchange, source=""),
        lambda channel: channel.exchange_bind(destination="", source=exchange),
        lambda channel: channel.queue_bind(queue, "", routing_key="anything"),
    ):
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            action(channel)
        assert (caught.value.reply_code, caught.value.reply_text) == (
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange",
        )
    assert connection.is_open


# --------------------------------------------------------------------------- internal, auto-delete


def test_internal_exchange_refuses_direct_publishing_with_403(shared_broker: Broker, names: Names) -> None:
    """An internal exchange routes what other exchanges pass it, but a client publishing to it
    directly gets channel.close 403 ACCESS_REFUSED."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    public, internal = names("public"), names("internal")
    channel.exchange_declare(internal, "fanout", internal=True)
    channel.exchange_declare(public, "fanout")
    channel.exchange_bind(destination=internal, source=public)
    (queue,) = _queues(channel, names, "q")
    channel.queue_bind(queue, internal)
    channel.basic_publish(public, "", b"through the front door")
    assert _bodies(channel, queue) == [b"through the front door"]

    direct = connection.channel()
    assert (
        channel_close_code(connection, direct, lambda: direct.basic_publish(internal, "", b"sneaky")) == 403
    )
    assert connection.is_open
    assert ready_count(channel, queue) == 0


def test_auto_delete_exchange_goes_with_its_last_binding(shared_broker: Broker, names: Names) -> None:
    """An auto-delete exchange survives while it never had a binding, and is deleted when its last
    binding as a source goes (queue.unbind, the bound queue's deletion, or exchange.unbind)."""
    connection = shared_broker.connect()
    channel = connection.channel()
    unbound, by_unbind, by_delete, by_e2e = (
        names("unbound"),
        names("unbind"),
        names("delete"),
        names("e2e"),
    )
    for exchange in (unbound, by_unbind, by_delete, by_e2e):
        channel.exchange_declare(exchange, "fanout", auto_delete=True)
    first, second, doomed = _queues(channel, names, "first", "second", "doomed")
    target = names("target")
    channel.exchange_declare(target, "fanout")

    channel.queue_bind(first, by_unbind)
    channel.queue_bind(second, by_unbind)
    channel.queue_bind(doomed, by_delete)
    channel.exchange_bind(destination=target, source=by_e2e)

    channel.queue_unbind(first, by_unbind)
    pump([connection], 0.2)
    assert _exchange_lookup(connection, by_unbind) is None, "deleted while it still had a binding"
    channel.queue_unbind(second, by_unbind)
    channel.queue_delete(doomed)
    channel.exchange_unbind(destination=target, source=by_e2e)
    for exchange in (by_unbind, by_delete, by_e2e):
        wait_until(
            lambda x=exchange: _exchange_lookup(connection, x) == 404,
            5,
            f"{exchange} to be auto-deleted",
        )
    assert _exchange_lookup(connection, unbound) is None
    assert _exchange_lookup(connection, target) is None  # not auto-delete: stays


# --------------------------------------------------------------------------- headers exchange


def test_headers_exchange_x_match_modes(shared_broker: Broker, names: Names) -> None:
    """amq.match: `all` needs every bound header equal, `any` one of them, both ignoring x-
    arguments; `all-with-x` / `any-with-x` also match x- headers; no x-match means `all`;
    a void binding value matches on presence."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    # Header names unique to this test, so other users of amq.match cannot interfere.
    a, b, x = names("a"), names("b"), "x-" + names("tag")
    bindings = {
        "all": {"x-match": "all", a: "1", b: "2"},
        "any": {"x-match": "any", a: "1", b: "2"},
        "all-with-x": {"x-match": "all-with-x", a: "1", x: "t"},
        "any-with-x": {"x-match": "any-with-x", a: "1", x: "t"},
        "default": {a: "1"},
        "all-ignoring-x": {"x-match": "all", a: "1", x: "t"},
        "presence": {"x-match": "all", b: None},
    }
    queues = {}
    for label, arguments in bindings.items():
        (queues[label],) = _queues(channel, names, label)
        channel.queue_bind(queues[label], "amq.match", arguments=arguments)

    messages = {
        "a1 b2": {a: "1", b: "2"},
        "a1": {a: "1"},
        "a1 b3": {a: "1", b: "3"},
        "a2 b2 extra": {a: "2", b: "2", names("extra"): "e"},
        "x": {x: "t"},
        "a1 x": {a: "1", x: "t"},
        "a1 x-wrong": {a: "1", x: "u"},
        "none": None,
    }
    for label, headers in messages.items():
        channel.basic_publish("amq.match", "", label.encode(), pika.BasicProperties(headers=headers))

    expected = {
        "all": ["a1 b2"],
        "any": ["a1 b2", "a1", "a1 b3", "a2 b2 extra", "a1 x", "a1 x-wrong"],
        "all-with-x": ["a1 x"],
        "any-with-x": ["a1 b2", "a1", "a1 b3", "x", "a1 x", "a1 x-wrong"],
        "default": ["a1 b2", "a1", "a1 b3", "a1 x", "a1 x-wrong"],
        "all-ignoring-x": ["a1 b2", "a1", "a1 b3", "a1 x", "a1 x-wrong"],
        "presence": ["a1 b2", "a1 b3", "a2 b2 extra"],
    }
    got = {label: [body.decode() for body in _bodies(channel, queue)] for label, queue in queues.items()}
    assert got == expected


def test_headers_values_match_across_types_as_rabbitmq_matches_them(shared_broker: Broker,
                                                                     names: Names) -> None:
    """Typed header values through pika (which sends no floats), against bindings indexed by
    value: an integer binding matches the number, not a boolean; a boolean binding only a
    boolean, not 1; a string binding the same octets as a byte array; an `any` binding each of
    its fields; 300 bindings of one header with different values each match their own."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("typed")
    channel.exchange_declare(exchange, "headers")
    n, flag, s = names("n"), names("flag"), names("s")
    bindings = {
        "int": {n: 1},
        "bool": {flag: True},
        "str": {s: "abc"},
        "any": {"x-match": "any", n: 2, s: "zzz"},
    }
    queues = {}
    for label, arguments in bindings.items():
        (queues[label],) = _queues(channel, names, label)
        channel.queue_bind(queues[label], exchange, arguments=arguments)
    (many,) = _queues(channel, names, "many")
    for i in range(300):
        channel.queue_bind(many, exchange, arguments={n: 1000 + i})

    messages = {
        "n1": {n: 1},
        "n-true": {n: True},
        "flag-true": {flag: True},
        "flag-1": {flag: 1},
        "s-bytes": {s: b"abc"},
        "n2": {n: 2},
        "n1150": {n: 1150},
        "n1300": {n: 1300},
    }
    for label, headers in messages.items():
        channel.basic_publish(exchange, "", label.encode(), pika.BasicProperties(headers=headers))

    expected = {
        "int": ["n1"],
        "bool": ["flag-true"],
        "str": ["s-bytes"],
        "any": ["n2"],
    }
    got = {label: [body.decode() for body in _bodies(channel, queue)] for label, queue in queues.items()}
    assert got == expected
    assert [body.decode() for body in _bodies(channel, many)] == ["n1150"]


def test_invalid_x_match_is_406(shared_broker: Broker, names: Names) -> None:
    """Binding to a headers exchange with an x-match other than all / any / all-with-x /
    any-with-x is 406 PRECONDITION_FAILED."""
    connection = shared_broker.connect()
    (queue,) = _queues(connection.channel(), names, "q")
    refused = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        refused.queue_bind(queue, "amq.match", arguments={"x-match": "some", names("a"): "1"})
    assert caught.value.reply_code == 406
    assert "Invalid x-match field value" in caught.value.reply_text


# --------------------------------------------------------------------------- topic exchange

# (binding key, routing keys that match it, routing keys that do not), as RabbitMQ 3.10 matches:
# words are split on "." (so "a." has an empty second word and "" has no words at all),
# "*" is exactly one word (possibly empty), "#" is zero or more words.
TOPIC_CASES = [
    ("#", ["", "a", "a.b.c", ".", "a."], []),
    ("*", ["a", "b"], ["", "a.b", "."]),
    ("a.*", ["a.b", "a."], ["a", "a.b.c", "b.a"]),
    ("a.#", ["a", "a.b", "a.b.c", "a."], ["b", "b.a", "ab"]),
    ("#.a", ["a", "x.a", "x.y.a"], ["a.x", "xa"]),
    ("a.#.b", ["a.b", "a.x.b", "a.x.y.b"], ["a.b.c", "b", "a"]),
    ("*.#", ["a", "a.b", "."], [""]),
    ("#.*", ["a", "a.b"], [""]),
    ("a.*.#", ["a.b", "a.b.c"], ["a", "b.c"]),
    ("#.#", ["", "a", "a.b"], []),
    ("*.*", ["a.b", ".", "a."], ["a", "a.b.c", ""]),
    ("", [""], ["a", "."]),
    ("a.b", ["a.b"], ["A.B", "a.b.c", "a", "ab"]),
    ("#.a.#", ["a", "x.a", "a.y", "x.a.y", "a.a"], ["x", "ax", "x.y"]),
    ("*.a.*", ["x.a.y", ".a."], ["a", "x.a", "a.y", "x.a.y.z"]),
    ("a.#.#.b", ["a.b", "a.x.b", "a.x.y.b"], ["a", "b", "a.b.c"]),
]


def test_topic_wildcards_match_as_rabbitmq_does(shared_broker: Broker, names: Names) -> None:
    """Topic bindings: `*` matches exactly one (possibly empty) word, `#` zero or more words,
    the empty routing key has no words, and matching is case-sensitive."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("topic")
    channel.exchange_declare(exchange, "topic")
    queues = {}
    for index, (binding, _, _) in enumerate(TOPIC_CASES):
        (queues[binding],) = _queues(channel, names, f"case{index}")
        channel.queue_bind(queues[binding], exchange, routing_key=binding)
    routing_keys = sorted({key for _, good, bad in TOPIC_CASES for key in good + bad})
    for key in routing_keys:
        channel.basic_publish(exchange, key, key.encode())

    wrong = {}
    for binding, good, bad in TOPIC_CASES:
        got = {body.decode() for body in _bodies(channel, queues[binding])}
        if not set(good) <= got or got & set(bad):
            wrong[binding] = {
                "missing": sorted(set(good) - got),
                "unexpected": sorted(got & set(bad)),
            }
    assert not wrong, f"topic matching differs from RabbitMQ's: {wrong}"
