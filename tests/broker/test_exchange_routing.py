"""Exchange-to-exchange bindings, alternate, internal and auto-delete exchanges (RabbitMQ's rules)."""

from __future__ import annotations

import pytest

from broker.errors import AccessRefused, NotFound, PreconditionFailed
from broker.messages.message import Message
from broker.topology.exchange import ExchangeDestination
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, message


def _queues(vhost: VirtualHost, *names: str) -> None:
    for name in names:
        vhost.declare_queue(name, owner=ME)


def _counts(vhost: VirtualHost) -> dict[str, int]:
    return {name: q.message_count for name, q in vhost.queues.items()}


# ------------------------------------------------------------------ exchange-to-exchange


def test_exchange_binding_forwards_what_the_source_routes(vhost: VirtualHost) -> None:
    """exchange.bind: a message the source routes by the binding goes on through the destination."""
    vhost.declare_exchange("src", "direct")
    vhost.declare_exchange("dst", "fanout")
    _queues(vhost, "q")
    vhost.bind_queue("q", "dst", "", owner=ME)
    vhost.bind_exchange("dst", "src", "k")
    assert vhost.publish("src", message("k"))[0] == 1
    assert vhost.publish("src", message("other"))[:2] == (0, [])
    assert _counts(vhost) == {"q": 1}


def test_exchange_bindings_are_followed_transitively(vhost: VirtualHost) -> None:
    """Routing follows exchange-to-exchange bindings through any number of exchanges."""
    for name in ("a", "b", "c"):
        vhost.declare_exchange(name, "topic")
    _queues(vhost, "q")
    vhost.bind_exchange("b", "a", "#")
    vhost.bind_exchange("c", "b", "x.*")
    vhost.bind_queue("q", "c", "x.y", owner=ME)
    assert vhost.publish("a", message("x.y"))[0] == 1
    assert vhost.publish("a", message("x.z"))[0] == 0


def test_each_queue_gets_a_message_once_over_several_paths(vhost: VirtualHost) -> None:
    """A queue reached by several bindings and exchanges receives one copy; refs count queues."""
    vhost.declare_exchange("a", "fanout")
    vhost.declare_exchange("b", "fanout")
    _queues(vhost, "q", "r")
    vhost.bind_queue("q", "a", "", owner=ME)
    vhost.bind_queue("q", "b", "", owner=ME)
    vhost.bind_queue("r", "b", "", owner=ME)
    vhost.bind_exchange("b", "a", "")
    m = message()
    assert vhost.publish("a", m)[0] == 2
    assert m.refs == 2 and _counts(vhost) == {"q": 1, "r": 1}


def test_exchange_binding_cycles_terminate(vhost: VirtualHost) -> None:
    """Exchanges bound in a cycle are each visited once: routing ends, each queue gets one copy."""
    vhost.declare_exchange("a", "fanout")
    vhost.declare_exchange("b", "fanout")
    _queues(vhost, "q")
    vhost.bind_exchange("b", "a", "")
    vhost.bind_exchange("a", "b", "")
    vhost.bind_exchange("a", "a", "")
    vhost.bind_queue("q", "b", "", owner=ME)
    assert vhost.publish("a", message())[0] == 1
    assert vhost.publish("b", message())[0] == 1
    assert _counts(vhost) == {"q": 2}


def test_exchange_bind_checks_default_exchange_then_source_then_destination(vhost: VirtualHost) -> None:
    """exchange.bind: 403 for the default exchange at either end, then 404 naming the source first."""
    vhost.declare_exchange("x", "direct")
    with pytest.raises(AccessRefused, match=r"^operation not permitted on the default exchange$"):
        vhost.bind_exchange("", "x", "k")
    with pytest.raises(AccessRefused, match="default exchange"):
        vhost.bind_exchange("x", "", "k")
    with pytest.raises(NotFound, match=r"^no exchange 'nosrc' in vhost '/'$"):
        vhost.bind_exchange("nodst", "nosrc", "k")
    with pytest.raises(NotFound, match=r"^no exchange 'nodst' in vhost '/'$"):
        vhost.bind_exchange("nodst", "x", "k")


def test_exchange_unbind_stops_forwarding_and_missing_binding_is_ok(vhost: VirtualHost) -> None:
    """exchange.unbind removes the binding; a missing binding or exchange is unbind-ok (RabbitMQ 3.10)."""
    vhost.declare_exchange("a", "direct")
    vhost.declare_exchange("b", "fanout")
    _queues(vhost, "q")
    vhost.bind_queue("q", "b", "", owner=ME)
    vhost.bind_exchange("b", "a", "k")
    vhost.unbind_exchange("b", "a", "never")
    vhost.unbind_exchange("nodst", "nosrc", "k")
    with pytest.raises(AccessRefused):
        vhost.unbind_exchange("b", "", "k")
    vhost.unbind_exchange("b", "a", "k")
    assert vhost.publish("a", message("k"))[:2] == (0, [])
    assert not vhost.exchanges["a"].has_bindings


def test_deleting_an_exchange_removes_bindings_to_it(vhost: VirtualHost) -> None:
    """Deleting a destination exchange removes the bindings leading to it (remove_for_destination)."""
    vhost.declare_exchange("a", "fanout")
    vhost.declare_exchange("b", "fanout")
    vhost.bind_exchange("b", "a", "")
    vhost.delete_exchange("b")
    assert not vhost.exchanges["a"].has_bindings
    vhost.declare_exchange("b", "fanout")
    _queues(vhost, "q")
    vhost.bind_queue("q", "b", "", owner=ME)
    assert vhost.publish("a", message())[:2] == (0, [])


def test_exchange_delete_if_unused_counts_exchange_bindings(vhost: VirtualHost) -> None:
    """exchange.delete if-unused: an exchange bound to another exchange is in use (406)."""
    vhost.declare_exchange("a", "fanout")
    vhost.declare_exchange("b", "fanout")
    vhost.bind_exchange("b", "a", "")
    with pytest.raises(PreconditionFailed, match=r"^exchange 'a' in vhost '/' in use$"):
        vhost.delete_exchange("a", if_unused=True)
    vhost.delete_exchange("b", if_unused=True)  # only bindings as the source count
    assert "b" not in vhost.exchanges


# ----------------------------------------------------------------- alternate exchanges


def test_unroutable_message_goes_to_the_alternate_exchange(vhost: VirtualHost) -> None:
    """alternate-exchange: a message the exchange cannot route goes to its alternate exchange."""
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    _queues(vhost, "q", "unrouted")
    vhost.bind_queue("q", "x", "k", owner=ME)
    vhost.bind_queue("unrouted", "ae", "", owner=ME)
    assert vhost.publish("x", message("k"))[0] == 1
    assert vhost.publish("x", message("nope"))[0] == 1
    assert _counts(vhost) == {"q": 1, "unrouted": 1}


def test_alternate_exchanges_chain_and_cycles_terminate(vhost: VirtualHost) -> None:
    """Alternate exchanges are followed transitively; an alternate cycle ends unrouted."""
    vhost.declare_exchange("a", "direct", arguments={"alternate-exchange": "b"})
    vhost.declare_exchange("b", "direct", arguments={"alternate-exchange": "c"})
    vhost.declare_exchange("c", "direct", arguments={"alternate-exchange": "a"})
    assert vhost.publish("a", message("k"))[:2] == (0, [])
    _queues(vhost, "q")
    vhost.bind_queue("q", "c", "k", owner=ME)
    assert vhost.publish("a", message("k"))[0] == 1


def test_alternate_exchange_applies_per_exchange_on_the_path(vhost: VirtualHost) -> None:
    """An exchange reached by an exchange binding that routes nowhere uses its own alternate."""
    vhost.declare_exchange("ae-a", "fanout")
    vhost.declare_exchange("ae-b", "fanout")
    vhost.declare_exchange("a", "fanout", arguments={"alternate-exchange": "ae-a"})
    vhost.declare_exchange("b", "direct", arguments={"alternate-exchange": "ae-b"})
    _queues(vhost, "qa", "qb")
    vhost.bind_queue("qa", "ae-a", "", owner=ME)
    vhost.bind_queue("qb", "ae-b", "", owner=ME)
    vhost.bind_exchange("b", "a", "")
    assert vhost.publish("a", message("k"))[0] == 1
    assert _counts(vhost) == {"qa": 0, "qb": 1}


def test_missing_alternate_exchange_leaves_message_unrouted(vhost: VirtualHost, dropped: list[Message]) -> None:
    """An alternate exchange that does not exist is skipped: the message is unroutable (returned)."""
    vhost.declare_exchange("x", "direct", arguments={"alternate-exchange": "gone"})
    m = message("k")
    assert vhost.publish("x", m)[:2] == (0, [])
    assert m.refs == 0 and dropped == []


def test_alternate_exchange_argument_must_be_a_string(vhost: VirtualHost) -> None:
    """exchange.declare: a non-string alternate-exchange is 406 "invalid type ... for arg ..."."""
    with pytest.raises(PreconditionFailed) as err:
        vhost.declare_exchange("x", "direct", arguments={"alternate-exchange": 5})
    assert err.value.reply_text == (
        "invalid type 'signedint' for arg 'alternate-exchange' in exchange 'x' in vhost '/'"
    )
    assert "x" not in vhost.exchanges


# ----------------------------------------------------------------- internal, auto-delete


def test_publishing_to_an_internal_exchange_is_access_refused(vhost: VirtualHost) -> None:
    """basic.publish to an internal exchange: 403 "cannot publish to internal exchange 'x' in vhost '/'"."""
    vhost.declare_exchange("x", "fanout", internal=True)
    with pytest.raises(AccessRefused) as err:
        vhost.publish("x", message())
    assert err.value.reply_code == 403
    assert err.value.reply_text == "cannot publish to internal exchange 'x' in vhost '/'"


def test_internal_exchange_receives_through_exchange_bindings(vhost: VirtualHost) -> None:
    """An internal exchange cannot be published to, but exchanges bound to it route through it."""
    vhost.declare_exchange("front", "fanout")
    vhost.declare_exchange("inner", "fanout", internal=True)
    _queues(vhost, "q")
    vhost.bind_queue("q", "inner", "", owner=ME)
    vhost.bind_exchange("inner", "front", "")
    assert vhost.publish("front", message())[0] == 1


def test_auto_delete_exchange_goes_with_its_last_queue_binding(vhost: VirtualHost) -> None:
    """An auto-delete exchange is deleted when its last binding is removed."""
    vhost.declare_exchange("x", "direct", auto_delete=True)
    _queues(vhost, "q")
    vhost.bind_queue("q", "x", "a", owner=ME)
    vhost.bind_queue("q", "x", "b", owner=ME)
    vhost.unbind_queue("q", "x", "a", owner=ME)
    assert "x" in vhost.exchanges
    vhost.unbind_queue("q", "x", "b", owner=ME)
    assert "x" not in vhost.exchanges


def test_auto_delete_exchange_goes_with_its_last_exchange_binding(vhost: VirtualHost) -> None:
    """Bindings to exchanges count too: unbinding the last one deletes an auto-delete source."""
    vhost.declare_exchange("x", "fanout", auto_delete=True)
    vhost.declare_exchange("y", "fanout")
    vhost.bind_exchange("y", "x", "")
    vhost.unbind_exchange("y", "x", "")
    assert "x" not in vhost.exchanges


def test_auto_delete_cascades_when_a_destination_exchange_is_deleted(vhost: VirtualHost) -> None:
    """Deleting an exchange removes bindings to it, which deletes auto-delete sources left unbound."""
    vhost.declare_exchange("top", "fanout", auto_delete=True)
    vhost.declare_exchange("mid", "fanout", auto_delete=True)
    vhost.declare_exchange("leaf", "fanout")
    vhost.bind_exchange("mid", "top", "")
    vhost.bind_exchange("leaf", "mid", "")
    vhost.delete_exchange("leaf")
    assert "mid" not in vhost.exchanges and "top" not in vhost.exchanges


def test_auto_delete_exchange_without_bindings_stays(vhost: VirtualHost) -> None:
    """An auto-delete exchange that never had a binding is not deleted."""
    vhost.declare_exchange("x", "fanout", auto_delete=True)
    assert vhost.publish("x", message())[:2] == (0, [])
    assert "x" in vhost.exchanges


def test_exchange_destinations_are_not_queue_names(vhost: VirtualHost) -> None:
    """An exchange and a queue of the same name are different destinations."""
    vhost.declare_exchange("x", "fanout")
    vhost.declare_exchange("same", "fanout")
    _queues(vhost, "same")
    vhost.bind_exchange("same", "x", "")
    assert vhost.exchanges["x"].destinations() == [ExchangeDestination("same")]
    assert vhost.publish("x", message())[0] == 0
    vhost.bind_queue("same", "same", "", owner=ME)
    q = vhost.queues["same"]
    c = consumer("c")
    attach(q, c)
    routed, notify = vhost.publish("x", message())[:2]
    assert routed == 1 and notify == [c]
