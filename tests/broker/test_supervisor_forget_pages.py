"""The supervisor drops the arena pages it touched (freeing blocks writes their headers) from
its page tables about once a second (ipc.region.Region.forget_arena_pages), only for an arena
it touched since: at rest the timer's tick does not walk 256 MiB of empty page tables per
worker. A real supervisor over real regions, without worker processes; the tick is called
with the time it is given, nothing is timed."""

from __future__ import annotations

from broker.runtime.supervisor import FORGET_PAGES_INTERVAL, Supervisor


def _watch_forgets(sup: Supervisor) -> list[int]:
    forgot: list[int] = []
    for w in sup.workers:
        def forget(index: int = w.index) -> None:
            forgot.append(index)
        w.region.forget_arena_pages = forget  # type: ignore[method-assign]
    return forgot


def test_at_rest_the_tick_forgets_nothing_and_a_free_brings_its_arena_back(supervisor: Supervisor) -> None:
    sup = supervisor
    forgot = _watch_forgets(sup)
    now = sup._forget_pages_at
    sup._tick(now)  # due, but nothing was touched
    sup._tick(now + FORGET_PAGES_INTERVAL)
    assert forgot == []
    offset = sup.workers[1].region.arena.alloc(100)  # as worker 1 stores a body
    assert offset is not None
    sup._free_body(1, offset)  # its last reference went: the supervisor frees the block
    sup._tick(now + 2 * FORGET_PAGES_INTERVAL)
    assert forgot == [1]  # that arena only, once
    sup._tick(now + 3 * FORGET_PAGES_INTERVAL)
    assert forgot == [1]


def test_a_touched_arena_waits_for_the_interval(supervisor: Supervisor) -> None:
    sup = supervisor
    forgot = _watch_forgets(sup)
    now = sup._forget_pages_at
    sup._tick(now)  # due: sets the next one an interval on
    offset = sup.workers[0].region.arena.alloc(100)
    assert offset is not None
    sup._free_body(0, offset)
    sup._tick(now + FORGET_PAGES_INTERVAL / 2)  # not due yet
    assert forgot == []
    sup._tick(now + FORGET_PAGES_INTERVAL)
    assert forgot == [0]
