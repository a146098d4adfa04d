"""Sender-selected distribution (RabbitMQ's CC / BCC headers): extra routing keys, BCC hidden.

RabbitMQ (docs "Sender-selected Distribution"; rabbit_basic header_routes / strip_bcc_header,
rabbit_dead_letter make_msg): the CC and BCC header values, arrays of longstr, are routing keys
used along with the publish routing key; each queue still gets one copy; BCC is removed before
delivery, CC stays; a CC / BCC header that is not an array fails basic.publish with 406.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import NotFound, PreconditionFailed
from broker.messages.deadletter import DeadLetter
from broker.messages.headers import header_routes
from broker.messages.message import BlindCopied, FullMessage, Message, delivered_headers
from broker.queues.queue import Queue
from broker.runtime.dispatch import Dispatcher
from broker.topology.exchange import Exchange
from broker.topology.vhost import VirtualHost
from ipc import records as r
from tests.broker.support import ME, message

# ------------------------------------------------------------------------------ helpers


def _declare(vhost: VirtualHost, *names: str) -> list[Queue]:
    return [vhost.declare_queue(name, owner=ME) for name in names]


def _counts(vhost: VirtualHost, *names: str) -> list[int]:
    return [vhost.queues[name].message_count for name in names]


def _direct(vhost: VirtualHost, name: str = "x", *keys: str) -> None:
    """A direct exchange with each queue in ``keys`` bound by its own name."""
    vhost.declare_exchange(name, "direct")
    for key in keys:
        vhost.bind_queue(key, name, key, owner=ME)


# ------------------------------------------------------------------- header_routes


def test_header_routes_are_cc_keys_then_bcc_keys() -> None:
    """rabbit_basic:header_routes reads CC, then BCC; headers without them add nothing."""
    assert header_routes({"BCC": ["b1"], "CC": ["c1", "c2"], "other": ["x"]}) == ["c1", "c2", "b1"]
    assert header_routes({"app": 1}) == []
    assert header_routes(None) == []
    assert header_routes({"CC": []}) == []


def test_header_routes_keep_only_string_elements() -> None:
    """Only longstr elements of the array are routing keys; other elements are skipped."""
    assert header_routes({"CC": ["a", 1, None, {"t": 1}, b"raw", ["nested"]]}) == ["a", "raw"]


@pytest.mark.parametrize(
    ("headers", "text"),
    [
        ({"CC": "single"}, '{unacceptable_type_in_header,"CC",longstr}'),
        ({"CC": ["ok"], "BCC": 5}, '{unacceptable_type_in_header,"BCC",signedint}'),
        ({"BCC": {"k": "v"}}, '{unacceptable_type_in_header,"BCC",table}'),
        ({"CC": None}, '{unacceptable_type_in_header,"CC",void}'),
        ({"CC": True, "BCC": "x"}, '{unacceptable_type_in_header,"CC",bool}'),
    ],
)
def test_header_routes_refuse_a_non_array_header_as_rabbitmq(headers: dict[str, Any], text: str) -> None:
    """A CC / BCC value that is not an array: 406 "invalid message: {unacceptable_type_in_header,...}"."""
    with pytest.raises(PreconditionFailed) as caught:
        header_routes(headers)
    assert caught.value.reply_text == f"invalid message: {text}"


def test_delivered_headers_drop_bcc_and_keep_cc() -> None:
    """BCC never reaches a consumer; CC and everything else does; no BCC: the same dict back."""
    headers = {"CC": ["a"], "BCC": ["b"], "app": 1}
    assert delivered_headers(headers) == {"CC": ["a"], "app": 1}
    assert headers["BCC"] == ["b"]  # the message's own headers are not touched
    plain = {"CC": ["a"]}
    assert delivered_headers(plain) is plain


# ------------------------------------------------------------------------ exchanges


def test_route_keys_on_direct_is_the_union_each_destination_once() -> None:
    """Every key routes; a destination matched by several keys comes back once."""
    x = Exchange("x", "direct")
    x.bind("q1", "a")
    x.bind("q2", "b")
    x.bind("q2", "c")
    x.bind("q3", "z")
    assert x.route_keys(["a", "b", "c", "a", "missing"]) == {"q1", "q2"}


def test_route_keys_on_topic_matches_every_key() -> None:
    x = Exchange("t", "topic")
    x.bind("animals", "animal.*")
    x.bind("all", "#")
    x.bind("colours", "colour.#")
    x.bind("other", "other")
    assert x.route_keys(["animal.cat", "colour.red.dark"]) == {"animals", "all", "colours"}


def test_route_keys_on_fanout_and_headers_ignore_the_keys() -> None:
    fanout = Exchange("f", "fanout")
    fanout.bind("q1", "")
    fanout.bind("q2", "whatever")
    assert fanout.route_keys(["a", "b"]) == {"q1", "q2"}
    headers = Exchange("h", "headers")
    headers.bind("q1", "", {"x-match": "all", "k": "v"})
    assert headers.route_keys(["a", "b"], {"k": "v"}) == {"q1"}
    assert headers.route_keys(["a", "b"], {"k": "other"}) == set()


# ---------------------------------------------------------------------- publishing


def test_cc_and_bcc_keys_route_to_their_queues(vhost: VirtualHost) -> None:
    """The routing key plus every CC and BCC key: main, copied and blind all get the message."""
    _declare(vhost, "main", "copied", "blind", "bystander")
    _direct(vhost, "x", "main", "copied", "blind", "bystander")
    routed, _ = vhost.publish("x", message("main", {"CC": ["copied"], "BCC": ["blind"]}, "x"))[:2]
    assert routed == 3
    assert _counts(vhost, "main", "copied", "blind", "bystander") == [1, 1, 1, 0]


def test_cc_and_bcc_keys_naming_one_queue_twice_deliver_one_copy(vhost: VirtualHost) -> None:
    """A queue matched by the routing key, a CC key and a BCC key still gets one copy."""
    (q,) = _declare(vhost, "q")
    _direct(vhost, "x", "q")
    routed, _ = vhost.publish("x", message("q", {"CC": ["q", "q"], "BCC": ["q"]}, "x"))[:2]
    assert routed == 1 and q.message_count == 1


def test_cc_on_the_default_exchange_names_queues(vhost: VirtualHost) -> None:
    """The default exchange routes each key to the queue of that name (the hot path is not used)."""
    _declare(vhost, "a", "b", "c")
    routed, _ = vhost.publish("", message("a", {"CC": ["b", "missing"]}))[:2]
    assert routed == 2 and _counts(vhost, "a", "b", "c") == [1, 1, 0]


def test_cc_keys_route_alone_when_the_routing_key_matches_nothing(vhost: VirtualHost) -> None:
    """One routing key that reaches a queue is enough: the publish is routed (no basic.return)."""
    _declare(vhost, "b")
    routed, _ = vhost.publish("", message("nowhere", {"BCC": ["b"]}))[:2]
    assert routed == 1


def test_no_key_routing_anywhere_leaves_the_message_unroutable(vhost: VirtualHost) -> None:
    _declare(vhost, "q")
    m = message("nowhere", {"CC": ["nobody"], "BCC": ["none"]})
    assert vhost.publish("", m)[:2] == (0, [])
    assert m.refs == 0  # the runtime returns (mandatory) or frees it


def test_cc_on_a_topic_exchange(vhost: VirtualHost) -> None:
    _declare(vhost, "stocks", "weather", "all")
    vhost.declare_exchange("t", "topic")
    vhost.bind_queue("stocks", "t", "stock.#", owner=ME)
    vhost.bind_queue("weather", "t", "weather.*", owner=ME)
    vhost.bind_queue("all", "t", "#", owner=ME)
    routed, _ = vhost.publish("t", message("stock.nyse.ibm", {"CC": ["weather.ny"]}, "t"))[:2]
    assert routed == 3 and _counts(vhost, "stocks", "weather", "all") == [1, 1, 1]


def test_cc_on_a_fanout_exchange_gives_each_queue_one_copy(vhost: VirtualHost) -> None:
    _declare(vhost, "q1", "q2")
    vhost.declare_exchange("f", "fanout")
    vhost.bind_queue("q1", "f", "", owner=ME)
    vhost.bind_queue("q2", "f", "", owner=ME)
    routed, _ = vhost.publish("f", message("k", {"CC": ["k2", "k3"], "BCC": ["k4"]}, "f"))[:2]
    assert routed == 2 and _counts(vhost, "q1", "q2") == [1, 1]


def test_headers_exchange_does_not_see_bcc(vhost: VirtualHost) -> None:
    """RabbitMQ strips BCC before routing: a headers binding on BCC does not match it."""
    _declare(vhost, "on-cc", "on-bcc")
    vhost.declare_exchange("h", "headers")
    vhost.bind_queue("on-cc", "h", "", {"x-match": "any", "CC": None}, owner=ME)
    vhost.bind_queue("on-bcc", "h", "", {"x-match": "any", "BCC": None}, owner=ME)
    vhost.publish("h", message("", {"CC": ["a"], "BCC": ["b"]}, "h"))
    assert _counts(vhost, "on-cc", "on-bcc") == [1, 0]


def test_cc_keys_follow_exchange_bindings_and_alternate_exchanges(vhost: VirtualHost) -> None:
    """Every hop routes with all the keys; an exchange routing none of them hands over to its AE."""
    _declare(vhost, "via-e2e", "via-ae")
    vhost.declare_exchange("entry", "direct")
    vhost.declare_exchange("next", "direct")
    vhost.bind_exchange("next", "entry", "cc-key")
    vhost.bind_queue("via-e2e", "next", "cc-key", owner=ME)
    vhost.publish("entry", message("rk", {"CC": ["cc-key"]}, "entry"))
    assert _counts(vhost, "via-e2e") == [1]

    vhost.declare_exchange("ae", "direct")
    vhost.declare_exchange("with-ae", "direct", arguments={"alternate-exchange": "ae"})
    vhost.bind_queue("via-ae", "ae", "bcc-key", owner=ME)
    vhost.publish("with-ae", message("rk", {"BCC": ["bcc-key"]}, "with-ae"))
    assert _counts(vhost, "via-ae") == [1]


def test_cc_with_an_expiration_takes_the_featured_path(vhost: VirtualHost) -> None:
    _declare(vhost, "a", "b")
    routed, _ = vhost.publish("", message("a", {"CC": ["b"]}, expiration="60000"), now=0.0)[:2]
    assert routed == 2 and _counts(vhost, "a", "b") == [1, 1]


def test_only_a_message_with_bcc_is_reheadered(vhost: VirtualHost) -> None:
    """BCC: the message becomes a BlindCopied (re-encoded on delivery, BCC left out); CC alone,
    or no CC / BCC, leaves it a plain Message delivered as published."""
    _declare(vhost, "q")
    blind = message("q", {"BCC": ["q"], "app": 1})
    copied = message("q", {"CC": ["q"]})
    plain = message("q", {"app": 1})
    for m in (blind, copied, plain):
        vhost.publish("", m)
    assert type(blind) is BlindCopied and blind.reheadered
    assert blind.headers == {"BCC": ["q"], "app": 1}  # kept for routing dead-letter copies
    assert type(copied) is FullMessage and not copied.reheadered
    assert type(plain) is FullMessage and not plain.reheadered


def test_non_array_cc_refuses_the_publish_before_routing(vhost: VirtualHost, dropped: list[Message]) -> None:
    """406 as rabbit_channel answers; nothing is enqueued and nothing references the message."""
    (q,) = _declare(vhost, "q")
    m = message("q", {"CC": "q"})
    with pytest.raises(PreconditionFailed, match='unacceptable_type_in_header,"CC",longstr'):
        vhost.publish("", m)
    assert q.message_count == 0 and m.refs == 0 and dropped == []
    with pytest.raises(PreconditionFailed, match='"BCC",signedint'):
        vhost.publish("", message("q", {"BCC": 7}, expiration="1000"), now=0.0)
    assert q.message_count == 0


def test_missing_exchange_is_404_before_the_header_check(vhost: VirtualHost) -> None:
    with pytest.raises(NotFound):
        vhost.publish("missing", message("q", {"CC": "q"}, "missing"))


# -------------------------------------------------------------------- dead letters


DLX_ARGS = {"x-dead-letter-exchange": "dlx"}


def _reject(q: Queue) -> None:
    entry = q.get()
    assert entry is not None
    q.discard(entry)


def test_x_death_routing_keys_list_the_routing_key_and_cc_not_bcc(vhost: VirtualHost) -> None:
    """rabbit_dead_letter make_msg: routing-keys is [RK | CC keys] (BCC is gone from the content)."""
    vhost.declare_exchange("dlx", "fanout")
    (dlq,) = _declare(vhost, "dlq")
    vhost.bind_queue("dlq", "dlx", "", owner=ME)
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    vhost.publish("", message("q", {"CC": ["cc1"], "BCC": ["bcc1"]}))
    _reject(q)
    vhost.drain()
    (entry,) = dlq.available_entries()
    copy = entry.message
    assert isinstance(copy, DeadLetter) and copy.reheadered
    assert copy.headers is not None and copy.headers["x-death"][0]["routing-keys"] == ["q", "cc1"]
    assert copy.headers["CC"] == ["cc1"]
    assert "BCC" not in delivered_headers(dlq.delivery_headers(entry) or {})


def _source(vhost: VirtualHost, arguments: dict[str, Any]) -> Queue:
    """Queue 'src' fed by the direct exchange 'in' with key 'k' (CC / BCC keys route nowhere there)."""
    q = vhost.declare_queue("src", owner=ME, arguments=arguments)
    vhost.declare_exchange("in", "direct")
    vhost.bind_queue("src", "in", "k", owner=ME)
    return q


def test_dead_letter_copy_is_routed_by_the_cc_and_bcc_keys(vhost: VirtualHost) -> None:
    """Without x-dead-letter-routing-key the copy is routed by the original's routing keys, BCC
    included (rabbit_dead_letter make_msg keeps routing_keys), reaching each queue once."""
    _declare(vhost, "by-rk", "by-cc", "by-bcc", "other")
    vhost.declare_exchange("dlx", "direct")
    for queue, key in (("by-rk", "k"), ("by-cc", "cc1"), ("by-bcc", "bcc1"), ("by-cc", "k")):
        vhost.bind_queue(queue, "dlx", key, owner=ME)
    q = _source(vhost, DLX_ARGS)
    routed, _ = vhost.publish("in", message("k", {"CC": ["cc1"], "BCC": ["bcc1"]}, "in"))[:2]
    assert routed == 1
    _reject(q)
    vhost.drain()
    assert _counts(vhost, "by-rk", "by-cc", "by-bcc", "other") == [1, 1, 1, 0]


def test_dead_letter_routing_key_replaces_every_key_and_drops_cc_and_bcc(vhost: VirtualHost) -> None:
    """x-dead-letter-routing-key: the copy is routed by that key alone; CC and BCC are removed;
    x-death keeps the routing key and CC keys."""
    _declare(vhost, "dead", "cc1", "bcc1")
    q = _source(vhost, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    vhost.publish("in", message("k", {"CC": ["cc1"], "BCC": ["bcc1"]}, "in"))
    _reject(q)
    vhost.drain()
    assert _counts(vhost, "dead", "cc1", "bcc1") == [1, 0, 0]
    (entry,) = vhost.queues["dead"].available_entries()
    headers = entry.message.headers
    assert headers is not None and "CC" not in headers and "BCC" not in headers
    assert headers["x-death"][0]["routing-keys"] == ["k", "cc1"]


# ------------------------------------------------------------------------- dispatch


class _Harness:
    def __init__(self) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(1, lambda region, offset: self.freed.append((region, offset)))
        self._offset = 0

    def events(self) -> list[r.Event]:
        """What the worker gets, less publish credit (credit flow is tested on its own)."""
        out = [e for e in self.d.outbox[0] if not isinstance(e, r.Credit)]
        self.d.outbox[0].clear()
        return out

    def declare(self, *names: str) -> None:
        for name in names:
            self.d.handle(0, r.QueueDeclare(1, 1, name, False, False, False, False, {}, False))
        self.events()

    def publish(self, rk: str, headers: dict[str, Any] | None, *, mandatory: bool = False,
                confirm: bool = False) -> int:
        self._offset += 256
        self.d.handle(0, r.Publish(1, 1, "", rk, mandatory, confirm, self._offset, 16, 100, headers))
        return self._offset

    def get(self, queue: str) -> r.Delivery:
        self.d.handle(0, r.Get(1, 1, queue, False))
        (ok,) = self.events()
        assert isinstance(ok, r.GetOk)
        return ok.delivery


@pytest.fixture
def h() -> _Harness:
    return _Harness()


def test_deliveries_strip_bcc_keep_cc_and_the_original_routing_key(h: _Harness) -> None:
    """basic.get (and pulls alike) of a BCC message: re-encoded headers without BCC, CC kept,
    the routing key the publisher used, the publisher's body handle."""
    h.declare("main", "copied", "blind")
    offset = h.publish("main", {"CC": ["copied"], "BCC": ["blind"], "app": "v"}, confirm=True)
    assert h.events() == [r.Confirm(1, 1, True)]
    for queue in ("main", "copied", "blind"):
        delivery = h.get(queue)
        assert delivery.reheader and delivery.headers == {"CC": ["copied"], "app": "v"}
        assert (delivery.routing_key, delivery.offset) == ("main", offset)


def test_cc_only_deliveries_pass_the_content_header_through(h: _Harness) -> None:
    h.declare("a", "b")
    h.publish("a", {"CC": ["b"]})
    for queue in ("a", "b"):
        delivery = h.get(queue)
        assert not delivery.reheader and delivery.headers is None


def test_pulled_delivery_of_a_bcc_message_has_no_bcc(h: _Harness) -> None:
    h.declare("q")
    h.d.handle(0, r.Consume(1, 1, 7, 0, "q", "c7", False, False, 0, False, True, False))
    h.events()
    h.publish("other", {"BCC": ["q"]})
    h.d.handle(0, r.Pull(7, 1))
    (pulled,) = h.events()
    assert isinstance(pulled, r.Pulled)
    (delivery,) = pulled.deliveries
    assert delivery.reheader and delivery.headers == {} and delivery.routing_key == "other"


def test_mandatory_publish_is_returned_only_when_no_key_routes(h: _Harness) -> None:
    h.declare("b")
    h.publish("nowhere", {"CC": ["b"]}, mandatory=True)
    assert h.events() == [] and h.freed == []
    offset = h.publish("nowhere", {"CC": ["none"], "BCC": ["neither"]}, mandatory=True)
    (ret,) = h.events()
    assert isinstance(ret, r.Returned) and (ret.code, ret.offset) == (312, offset)
    # returned without BCC, as RabbitMQ returns it: the worker re-encodes the header
    assert (ret.reheader, ret.headers) == (True, {"CC": ["none"]})
    h.publish("nowhere", {"CC": ["none"]}, mandatory=True)
    (ret,) = h.events()
    assert not ret.reheader, "a message without BCC is returned as published"


def test_non_array_cc_closes_the_channel_406_and_frees_the_body(h: _Harness) -> None:
    h.declare("q")
    offset = h.publish("q", {"CC": "q"}, confirm=True)
    (err,) = h.events()
    assert isinstance(err, r.Error)
    assert (err.code, err.class_id, err.method_id) == (406, 60, 40)
    assert err.text == 'invalid message: {unacceptable_type_in_header,"CC",longstr}'
    assert h.freed == [(0, offset)]
    assert h.d.vhost.queues["q"].message_count == 0


def test_dead_lettered_copy_of_a_bcc_message_is_delivered_without_bcc(h: _Harness) -> None:
    """The copy keeps BCC for routing (it reaches the BCC key's queue through the default
    exchange); its delivery, always re-encoded, leaves BCC out."""
    h.declare("bcc1")
    h.d.handle(0, r.QueueDeclare(1, 1, "src", False, False, False, False,
                                 {"x-dead-letter-exchange": ""}, False))
    h.events()
    h.publish("src", {"CC": ["cc1"], "BCC": ["bcc1"]})
    h.get("bcc1")  # the published message itself
    delivery = h.get("src")
    h.d.handle(0, r.Settle(1, 1, [delivery.entry], r.DROP))
    h.d.end_batch()
    copy = h.get("bcc1")
    assert copy.reheader and copy.headers is not None
    assert "BCC" not in copy.headers and copy.headers["CC"] == ["cc1"]
    assert copy.headers["x-death"][0]["routing-keys"] == ["src", "cc1"]
