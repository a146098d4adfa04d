"""How the supervisor applies a worker's request ring: in steps of bounded work (STEP_WORK),
with a flush and a turn for its trio tasks (the ring loop's guest) between them, in ring order; what a step left over
is applied before anything else of that worker, also when the worker dies.

A real supervisor over real regions (shared memory), without worker processes: the records are
written to a request ring as a worker writes them. They are Settles of channels nobody opened
(the dispatcher passes over them), so only the stepping is looked at; nothing is timed."""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.runtime.supervisor import STEP_WORK, Supervisor
from broker.runtime.worker_lifecycle import WorkerSlot
from ipc import records as r

ENTRIES = 1000  # per Settle: the work of a thousand acks
RECORDS = 10  # several steps' worth


def _settles() -> list[r.Settle]:
    return [r.Settle(1, ch, list(range(ch * ENTRIES, (ch + 1) * ENTRIES)), r.ACK)
            for ch in range(1, RECORDS + 1)]


def _write(sup: Supervisor, records: list[r.Settle]) -> None:
    ring = sup.workers[0].region.request_ring
    assert ring.put_many_nowait([sup.codec.encode(rec) for rec in records]) == len(records)


def _watch(sup: Supervisor) -> list[object]:
    """What the supervisor does, in order: each request applied (its channel), each flush."""
    seen: list[object] = []
    apply_one, flush = sup._apply_one, sup.flush

    def watched_apply_one(w: WorkerSlot, rec: r.Request | None) -> None:
        if rec is not None:  # None: a stopped publish run goes on, no request
            seen.append(rec.ch if isinstance(rec, r.Settle) else type(rec).__name__)
        apply_one(w, rec)

    def watched_flush() -> None:
        seen.append("flush")
        flush()

    sup._apply_one = watched_apply_one  # type: ignore[method-assign]
    sup.flush = watched_flush  # type: ignore[method-assign]
    return seen


def _drain_until(sup: Supervisor, seen: list[object], done: Callable[[], bool]) -> None:
    """Run the supervisor's ring loop with, as its trio guest, a task that notes each of its
    turns ("turn"), until ``done()``."""

    async def other_task() -> None:
        while True:
            seen.append("turn")
            await trio.sleep(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            while not done():
                await trio.sleep(0)
            nursery.cancel_scope.cancel()

    sup.serve(main)


def _steps(seen: list[object]) -> list[list[object]]:
    """The requests applied between flushes (and other tasks' turns, marked "turn")."""
    steps: list[list[object]] = [[]]
    for item in seen:
        if item in ("flush", "turn"):
            if steps[-1]:
                steps.append([])
        else:
            steps[-1].append(item)
    return [s for s in steps if s]


def test_a_ring_batch_is_applied_in_steps_with_turns_for_the_other_tasks(
        supervisor: Supervisor) -> None:
    """Ten Settles of a thousand entries sit in the ring (five steps' work): they are applied
    in ring order, at most STEP_WORK entries and one record past it per step, each step
    followed by a flush, and another task runs between the steps."""
    sup = supervisor
    seen = _watch(sup)
    _write(sup, _settles())
    _drain_until(sup, seen, lambda: sum(isinstance(item, int) for item in seen) == RECORDS)

    applied = [item for item in seen if isinstance(item, int)]
    assert applied == list(range(1, RECORDS + 1)), "every record once, in ring order"
    steps = _steps(seen)
    assert len(steps) >= RECORDS * ENTRIES // STEP_WORK
    assert all((len(step) - 1) * ENTRIES < STEP_WORK for step in steps)
    # Each step ends with a flush; the ring loop runs trio's ready tasks once between two
    # steps, so the other task has a turn in each round the steps take.
    ends = [seen.index(step[-1]) for step in steps]
    assert all(seen[end + 1] == "flush" for end in ends)
    turns = seen[seen.index(steps[0][0]):ends[-1]].count("turn")
    assert turns >= len(steps) - 2 and turns >= 1
    assert sup.workers[0].unapplied == []


def test_what_a_step_left_is_applied_before_a_dead_worker_is_forgotten(
        supervisor: Supervisor) -> None:
    """A worker dies while records taken from its ring wait for the next step: they are applied,
    in order and before what is still in the ring, before its channels are closed."""
    sup = supervisor
    w = sup.workers[0]
    seen = _watch(sup)
    records = _settles()
    _write(sup, records[:6])
    sup._apply(w, w.region.request_ring.get_all_nowait(), STEP_WORK)
    assert w.unapplied, "the step left records over"
    _write(sup, records[6:])
    # the dispatcher forgets the dead worker (worker_died, then its limits' forget_worker;
    # the latter is watched: the dispatcher's methods cannot be replaced where it is compiled)
    died = sup.dispatcher.limits.forget_worker

    def watched_died(worker: int) -> None:
        seen.append("died")
        died(worker)

    sup.dispatcher.limits.forget_worker = watched_died  # type: ignore[method-assign]
    sup._forget(w)
    assert [item for item in seen if item != "flush"] == [*range(1, RECORDS + 1), "died"]
    assert w.unapplied == []


def test_a_dead_workers_deliveries_going_back_in_steps_wake_the_timer(supervisor: Supervisor) -> None:
    """A worker dies holding more unacknowledged deliveries than a step requeues: one slice goes
    back at once, and the timer, asleep until a later deadline, is woken for the rest."""
    sup = supervisor
    d = sup.dispatcher
    d.return_slice = 10
    d.begin_batch(1.0)
    d.handle(0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, False))
    for i in range(50):
        d.handle(0, r.Publish(1, 1, "", "q", False, False, 256 * (i + 1), 16, 100, None))
    d.handle(1, r.Consume(7, 1, 1, 1, "q", "c1", False, False, 0, False, True, False))
    d.handle(1, r.Pull(1, 50))
    queue = d.vhost.queues["q"]
    assert queue.message_count == 0
    sup._deadline = 1e9  # the timer sleeps until then
    d.begin_batch(2.0)
    sup._forget(sup.workers[1])
    assert queue.message_count == 10
    now = d.vhost.now  # the supervisor's clock (its steps read time.monotonic())
    assert sup._deadline <= now, "the timer ticks at once"
    while (deadline := d.tick(now)) is not None and deadline <= now:
        pass
    assert queue.message_count == 50


def test_a_run_to_a_wide_fanout_goes_over_several_steps_before_the_next_request(
        supervisor: Supervisor) -> None:
    """A PublishRun of 64 messages to a fanout of 100 queues is 6,400 copies, three steps'
    work: it goes on over several steps, the other task has turns in between, and the
    request after it in the ring is applied only once the run is done."""
    sup = supervisor
    d = sup.dispatcher
    d.begin_batch(1.0)
    d.handle(0, r.ExchangeDeclare(1, 1, "fx", "fanout", False, False, False, False, {}, False))
    for i in range(100):
        d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False, {}, False))
        d.handle(0, r.QueueBind(1, 1, f"q{i}", "fx", "", {}, False))
    seen = _watch(sup)
    apply_one = sup._apply_one

    def watched_resume(w: WorkerSlot, rec: r.Request | None) -> None:
        if rec is None:  # the stopped run goes on (Dispatcher.resume_run)
            seen.append(("resumed", d.vhost.queues["q99"].message_count))
        apply_one(w, rec)

    sup._apply_one = watched_resume  # type: ignore[method-assign]
    bodies = [x for i in range(64) for x in (256 * (i + 1), 16, 100)]
    _write(sup, [r.PublishRun(1, 1, "fx", "", False, False, bodies), r.Settle(1, 5, [1], r.ACK)])
    _drain_until(sup, seen, lambda: 5 in seen)

    resumed = [item for item in seen if isinstance(item, tuple)]
    assert len(resumed) >= 6400 // STEP_WORK
    assert all(0 < count < 64 for _, count in resumed), "each step ended within the run"
    assert all(d.vhost.queues[f"q{i}"].message_count == 64 for i in range(100))
    first, last, settle = seen.index(resumed[0]), seen.index(resumed[-1]), seen.index(5)
    assert "turn" in seen[first:last], "the other task ran while the run went on"
    assert last < settle, "the request after the run waited for it"
