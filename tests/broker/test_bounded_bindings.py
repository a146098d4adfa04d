"""Overload: no single supervisor operation does unbounded work ("the supervisor schedules fairly"):
bindings.

A deleted exchange's bindings, and the bindings of a deleted queue, go a slice per step while the
exchange or queue itself is gone at once: nothing is routed through the old bindings meanwhile,
one declared again starts with none, and what they would have matched goes to the alternate
exchange.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from broker.errors import NotFound
from broker.topology.exchange import ExchangeDestination
from broker.topology.vhost import VirtualHost
from tests.broker.bounded_steps import K, N, _reap_all
from tests.broker.support import ME, message


def _bound_exchange(vhost: VirtualHost, name: str, queues: int, kind: str = "direct",
                    **kw: object) -> None:
    vhost.declare_exchange(name, kind, **kw)  # type: ignore[arg-type]
    for i in range(queues):
        if f"q{i}" not in vhost.queues:
            vhost.declare_queue(f"q{i}", owner=ME)
        vhost.bind_queue(f"q{i}", name, f"k{i}", owner=ME)


def _sources(vhost: VirtualHost, queue: str) -> set[str]:
    """The exchanges the reverse binding index names as bound to ``queue``."""
    return set(vhost._bindings._to_queue.get(queue, {}))


def test_a_deleted_exchanges_bindings_go_a_slice_per_step(sliced: VirtualHost) -> None:
    """exchange.delete of an exchange bound N times: the exchange is gone at once (a publish to
    it is 404), its bindings go K per step, and at the end the reverse index names it for no
    queue."""
    vhost = sliced
    _bound_exchange(vhost, "x", N)
    old = vhost.exchanges["x"]
    vhost.delete_exchange("x")
    assert "x" not in vhost.exchanges
    with pytest.raises(NotFound):
        vhost.publish("x", message("k1"))
    assert len(old.bindings()) == N - K
    assert vhost.next_deadline() == vhost.now, "the timer must come back at once"
    ticks = 0
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        before = len(old.bindings())
        vhost.tick(vhost.now)
        assert before - len(old.bindings()) <= K
        ticks += 1
    assert ticks >= N // K - 1 and not old.has_bindings
    assert all(_sources(vhost, f"q{i}") == {""} for i in range(N))  # the default exchange's


def test_an_exchange_declared_again_meanwhile_keeps_its_own_bindings(sliced: VirtualHost) -> None:
    """The exchange is declared again under its name and bound to some of the same queues while
    the old one's bindings are still going: the new bindings stay indexed and route; deleting a
    queue the old one was bound to does not auto-delete the new (auto-delete) exchange, which has
    no binding to it; deleting one the new one is bound to does."""
    vhost = sliced
    _bound_exchange(vhost, "x", N)
    vhost.delete_exchange("x")
    vhost.declare_exchange("x", "direct", auto_delete=True)
    vhost.bind_queue("q0", "x", "k0", owner=ME)
    vhost.bind_queue(f"q{N - 1}", "x", "again", owner=ME)
    vhost.delete_queue("q1", owner=ME)  # the old exchange's binding to it is still there
    assert "x" in vhost.exchanges, "auto-deleted for a binding it never had"
    _reap_all(vhost, [], vhost.now)
    assert _sources(vhost, "q0") == {"", "x"} and _sources(vhost, f"q{N - 1}") == {"", "x"}
    assert _sources(vhost, "q2") == {""}
    assert vhost.publish("x", message("again")).routed == 1
    assert vhost.publish("x", message("k2")).routed == 0
    vhost.delete_queue("q0", owner=ME)
    assert "x" in vhost.exchanges
    vhost.delete_queue(f"q{N - 1}", owner=ME)
    assert "x" not in vhost.exchanges, "its last binding went: auto-delete"


def test_a_deleted_exchanges_bindings_to_exchanges_go_too(sliced: VirtualHost) -> None:
    """A deleted exchange bound to other exchanges: those bindings go in slices as well; a
    destination exchange deleted meanwhile finds nothing to undo; nothing routes through the
    deleted one."""
    vhost = sliced
    vhost.declare_queue("sink", owner=ME)
    for i in range(N):
        vhost.declare_exchange(f"d{i}", "fanout")
        vhost.bind_queue("sink", f"d{i}", "", owner=ME)
    vhost.declare_exchange("x", "direct")
    for i in range(N):
        vhost.bind_exchange(f"d{i}", "x", f"k{i}")
    vhost.delete_exchange("x")
    vhost.delete_exchange("d3")
    _reap_all(vhost, [], vhost.now)
    assert all(not vhost._bindings._to_exchange.get(f"d{i}") for i in range(N))
    vhost.declare_exchange("x", "direct")
    assert vhost.publish("x", message("k5")).routed == 0


def _topic_bound_queue(vhost: VirtualHost, exchange: str = "t", **kw: object) -> None:
    """Queue q bound N times to the topic exchange ``exchange``."""
    vhost.declare_exchange(exchange, "topic", **kw)  # type: ignore[arg-type]
    vhost.declare_queue("q", owner=ME)
    for i in range(N):
        vhost.bind_queue("q", exchange, f"a.b{i}.#", owner=ME)


@pytest.fixture
def unbinding(sliced: VirtualHost) -> VirtualHost:
    """An exchange's bindings to a deleted queue go K per step once there are more than 10."""
    sliced.unbind_at_once = 10
    return sliced


def test_a_queue_bound_many_times_is_deleted_at_once_its_bindings_in_slices(
        unbinding: VirtualHost) -> None:
    """queue.delete of a queue bound N times: it is gone at once, a message matching its keys
    is routed nowhere, and its bindings go: 10 in the call, then K per step (the first slice in
    the same step, as the graveyard's work)."""
    vhost = unbinding
    _topic_bound_queue(vhost)
    exchange = vhost.exchanges["t"]
    vhost.delete_queue("q", owner=ME)
    assert "q" not in vhost.queues
    assert vhost.publish("t", message("a.b3.c")).routed == 0
    left = [exchange.bindings_to("q")]
    assert left[0] == N - 10 - K
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        vhost.tick(vhost.now)
        left.append(exchange.bindings_to("q"))
    assert left[-1] == 0 and all(a - b <= K for a, b in itertools.pairwise(left))
    assert not exchange.has_bindings


def test_a_queue_declared_again_gets_nothing_through_the_old_bindings(unbinding: VirtualHost) -> None:
    """Declared again under its name before the old bindings are gone: they go at once, so the
    new queue gets only what its own bindings route."""
    vhost = unbinding
    _topic_bound_queue(vhost)
    vhost.delete_queue("q", owner=ME)
    vhost.declare_queue("q", owner=ME)
    assert vhost.exchanges["t"].bindings_to("q") == 0
    assert vhost.publish("t", message("a.b3.c")).routed == 0
    vhost.bind_queue("q", "t", "new", owner=ME)
    assert vhost.publish("t", message("new")).routed == 1
    _reap_all(vhost, [], vhost.now)
    assert vhost.exchanges["t"].bindings_to("q") == 1, "the new binding went with the old"


def test_an_auto_delete_exchange_goes_once_the_last_old_binding_has(unbinding: VirtualHost) -> None:
    """An auto-delete exchange whose only bindings were to the deleted queue goes when the last
    of them does; exchange.delete if-unused meanwhile does not count them."""
    vhost = unbinding
    _topic_bound_queue(vhost, auto_delete=True)
    vhost.delete_queue("q", owner=ME)
    assert "t" in vhost.exchanges
    _reap_all(vhost, [], vhost.now)
    assert "t" not in vhost.exchanges

    _topic_bound_queue(vhost, "u")
    vhost.delete_queue("q", owner=ME)
    vhost.delete_exchange("u", if_unused=True)  # its only bindings lead to a deleted queue
    assert "u" not in vhost.exchanges


def test_while_a_deleted_queues_bindings_go_its_matches_go_to_the_alternate_exchange(
        unbinding: VirtualHost) -> None:
    """An exchange with an alternate exchange whose only match is a binding of the deleted
    queue still going hands the message to its alternate, as RabbitMQ (whose bindings go with
    the queue) does."""
    vhost = unbinding
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_queue("aeq", owner=ME)
    vhost.bind_queue("aeq", "ae", "", owner=ME)
    _topic_bound_queue(vhost, arguments={"alternate-exchange": "ae"})
    vhost.delete_queue("q", owner=ME)
    assert vhost.exchanges["t"].bindings_to("q") > 0, "the bindings should still be going"
    assert vhost.exchanges["t"].route(f"a.b{N - 1}.c") == {"q"}  # one of those left
    assert vhost.publish("t", message(f"a.b{N - 1}.c")).routed == 1
    assert vhost.queues["aeq"].message_count == 1


def _ticks_until_idle(vhost: VirtualHost, measure: Callable[[], int]) -> list[int]:
    """``measure()`` now and after each tick while the virtual host has work now."""
    seen = [measure()]
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        vhost.tick(vhost.now)
        seen.append(measure())
        assert len(seen) < 1000, "the work never ends"
    return seen


def test_a_queue_bound_by_many_exchanges_is_unbound_in_slices(unbinding: VirtualHost) -> None:
    """queue.delete of a queue bound once by each of N exchanges (RabbitMQ walks them all in
    the call): 10 go at once, the rest K per step; auto-delete exchanges go with their last
    binding; the reverse index names the queue for nobody at the end."""
    vhost = unbinding
    vhost.declare_queue("q", owner=ME)
    for i in range(N):
        vhost.declare_exchange(f"x{i}", "fanout", auto_delete=i % 2 == 0)
        vhost.bind_queue("q", f"x{i}", "", owner=ME)
    vhost.delete_queue("q", owner=ME)
    assert all(vhost.publish(f"x{i}", message("")).routed == 0 for i in range(1, N, 2))

    def bound() -> int:
        return sum(1 for x in vhost.exchanges.values() if x.is_bound("q"))

    left = _ticks_until_idle(vhost, bound)
    assert N - 10 - K <= left[0] <= N - 10 and left[-1] == 0  # 10 in the call, <= K in its step
    assert all(a - b <= K for a, b in itertools.pairwise(left))
    assert not any(f"x{i}" in vhost.exchanges for i in range(0, N, 2)), "auto-delete"
    assert all(f"x{i}" in vhost.exchanges for i in range(1, N, 2))
    assert not vhost._bindings._to_queue.get("q")


def _exchange_bound_exchange(vhost: VirtualHost, sources: int, keys: int, **kw: object) -> None:
    """Exchange "d" (fanout to queue "sink") bound ``keys`` times by each of ``sources``
    direct exchanges s0, s1, ... (keys k0, k1, ...)."""
    vhost.declare_queue("sink", owner=ME)
    vhost.declare_exchange("d", "fanout")
    vhost.bind_queue("sink", "d", "", owner=ME)
    for i in range(sources):
        vhost.declare_exchange(f"s{i}", "direct", **kw)  # type: ignore[arg-type]
        for j in range(keys):
            vhost.bind_exchange("d", f"s{i}", f"k{j}")


@pytest.mark.parametrize(("sources", "keys"), [(1, N), (N, 1), (5, 10)])
def test_a_deleted_exchanges_bindings_from_other_exchanges_go_a_slice_per_step(
        unbinding: VirtualHost, sources: int, keys: int) -> None:
    """exchange.delete of an exchange that N exchange-to-exchange bindings lead to (from one
    exchange, from N, or a mix): it is gone at once and nothing reaches its queue through them;
    10 go in the call, then K per step, until no exchange is bound to it."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, sources, keys)
    vhost.delete_exchange("d")
    assert all(vhost.publish(f"s{i}", message(f"k{keys - 1}")).routed == 0 for i in range(sources))
    destination = ExchangeDestination("d")

    def bindings() -> int:
        return sum(x.bindings_to(destination) for x in vhost.exchanges.values())

    left = _ticks_until_idle(vhost, bindings)
    assert N - 10 - K <= left[0] <= N - 10 and left[-1] == 0  # 10 in the call, <= K in its step
    assert all(a - b <= K for a, b in itertools.pairwise(left))
    assert not vhost._bindings._to_exchange.get("d")
    assert all(not vhost.exchanges[f"s{i}"].has_bindings for i in range(sources))
    assert vhost.queues["sink"].message_count == 0


def test_an_exchange_declared_again_gets_nothing_through_the_old_bindings(unbinding: VirtualHost) -> None:
    """Declared again under its name before the old bindings to it are gone: they go at once,
    so the new exchange gets only what its own bindings route."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, 1, N)
    vhost.delete_exchange("d")
    vhost.declare_exchange("d", "fanout")
    vhost.bind_queue("sink", "d", "", owner=ME)
    assert vhost.exchanges["s0"].bindings_to(ExchangeDestination("d")) == 0
    assert vhost.publish("s0", message(f"k{N - 1}")).routed == 0
    vhost.bind_exchange("d", "s0", "new")
    assert vhost.publish("s0", message("new")).routed == 1
    _reap_all(vhost, [], vhost.now)
    assert vhost.exchanges["s0"].bindings_to(ExchangeDestination("d")) == 1, "the new binding went"


def test_auto_delete_sources_go_once_their_last_binding_to_a_deleted_exchange_has(
        unbinding: VirtualHost) -> None:
    """An auto-delete exchange whose only bindings led to the deleted exchange goes when the
    last of them does; exchange.delete if-unused meanwhile does not count them."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, 2, N, auto_delete=True)
    vhost.delete_exchange("d")
    assert "s0" in vhost.exchanges and "s1" in vhost.exchanges
    vhost.delete_exchange("s1", if_unused=True)  # its only bindings lead to a deleted exchange
    assert "s1" not in vhost.exchanges
    _reap_all(vhost, [], vhost.now)
    assert "s0" not in vhost.exchanges


def test_while_a_deleted_exchanges_bindings_go_matches_go_to_the_alternate_exchange(
        unbinding: VirtualHost) -> None:
    """A source with an alternate exchange whose only match is a binding to the deleted
    exchange still going hands the message to its alternate (RabbitMQ removed the binding with
    the exchange)."""
    vhost = unbinding
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_queue("aeq", owner=ME)
    vhost.bind_queue("aeq", "ae", "", owner=ME)
    _exchange_bound_exchange(vhost, 1, N, arguments={"alternate-exchange": "ae"})
    vhost.delete_exchange("d")
    assert vhost.exchanges["s0"].route(f"k{N - 1}") == {ExchangeDestination("d")}, "still going"
    assert vhost.publish("s0", message(f"k{N - 1}")).routed == 1
    assert vhost.queues["aeq"].message_count == 1 and vhost.queues["sink"].message_count == 0
