"""What the bounded-step tests share (test_bounded_queue_contents.py, test_bounded_deliveries.py,
test_bounded_bindings.py, test_bounded_teardown.py): the slice size, the message counts and the
helpers that publish, tick until idle and check each body is freed once. The `sliced` fixture
(a virtual host letting go of K entries a step) is in conftest.py."""

from __future__ import annotations

from broker.messages.message import Message
from broker.topology.vhost import VirtualHost
from tests.broker.support import message

K = 7  # entries let go of per step
OTHER = ("w1", 2)  # another connection
N = 50  # messages per queue: several steps' worth


def _publish(vhost: VirtualHost, queue: str, n: int, **kw: object) -> list[Message]:
    messages = [message(queue, **kw) for _ in range(n)]  # type: ignore[arg-type]
    for m in messages:
        vhost.publish("", m)
    return messages


def _reap_all(vhost: VirtualHost, dropped: list[Message], now: float = 0.0) -> list[int]:
    """Tick while the virtual host says there is work now; how many bodies each tick freed."""
    per_tick = []
    while (deadline := vhost.next_deadline()) is not None and deadline <= now:
        before = len(dropped)
        vhost.tick(now)
        per_tick.append(len(dropped) - before)
        assert len(per_tick) < 1000, "the graveyard never empties"
    return per_tick


def _exactly_once(dropped: list[Message], messages: list[Message]) -> None:
    assert len({id(m) for m in dropped}) == len(dropped), "a body freed twice"
    assert {id(m) for m in dropped} == {id(m) for m in messages}, "a body never freed"
