"""What the channel tests (tests/workers/test_channel.py, test_channel_pulls.py) share on top
of ``tests/workers/helpers.py``'s harness: the supervisor's Pulled, delivery tags written, a
consumer with a prefetch, the one channel.close written."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from ipc import records as r
from tests.workers.helpers import Harness, consumer, methods
from workers.consumer_target import ConsumerTarget


def deliver(h: Harness, target: ConsumerTarget, entries: list[int], more: bool = False,
            still_open: int = 0, seq: int = 0) -> None:
    """The supervisor's Pulled; ``seq``: the last of the target's pulls it had applied
    (0: every pull sent so far)."""
    h.supervisor(r.Pulled(target.id, [h.delivery(e) for e in entries], more, still_open, seq))


def delivery_tags(frames: list[tuple[int, Any]]) -> list[tuple[int, int | None]]:
    """(channel, delivery tag) of each basic.deliver / basic.get-ok written."""
    return [(n, f.delivery_tag) for n, f in frames
            if isinstance(f, (commands.Basic.Deliver, commands.Basic.GetOk))]


def with_prefetch(h: Harness, count: int, tag: str = "c1", *, global_: bool = False,
                  queue: str = "q") -> ConsumerTarget:
    h.client(1, commands.Basic.Qos(prefetch_count=count, global_=global_))
    return consumer(h, 1, tag, queue)


def only_channel_close(h: Harness) -> commands.Channel.Close:
    [(n, close)] = methods(h.frames())
    assert n == 1 and isinstance(close, commands.Channel.Close)
    return close
