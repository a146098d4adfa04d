"""Work done a slice per bounded step (docs/design.md, Bounded step): one queue of jobs, each
drawing on a named budget that a step refills.

A job is a callable ``job(n) -> (done, finished)``: it does at most ``n`` units of its work now
and says how many it did and whether it is finished. The jobs of one budget run in the order
they were added, each as far as what is left of the budget allows; a job that adds jobs while it
runs (a deleted queue burying its messages) adds them at the end of its budget's line, which the
run under way reaches as the budget allows -- never a run inside a run, which would run the same
job twice at once. Whoever owns a budget says when a step begins (:meth:`SlicedWork.refill`) and
when its jobs run (:meth:`SlicedWork.run`).

Called from: the supervisor process (``broker.topology.step_host``, ``broker.queues.graveyard``,
``broker.runtime.teardown``, ``broker.runtime.dispatch``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

Job = Callable[[int], tuple[int, bool]]


class SlicedWork:
    """Jobs per named budget (``slices``: how much each budget allows a step)."""

    __slots__ = ("_jobs", "_left", "_running", "slices")

    def __init__(self, **slices: int) -> None:
        self.slices: dict[str, int] = {}
        self._left: dict[str, int] = {}
        self._jobs: dict[str, deque[Job]] = {}
        self._running: set[str] = set()
        for name, n in slices.items():
            self.add_budget(name, n)

    def add_budget(self, name: str, n: int) -> None:
        """A budget of ``n`` units a step, full now."""
        self.slices[name] = self._left[name] = n
        self._jobs.setdefault(name, deque())

    def __bool__(self) -> bool:
        """Work is waiting in some budget's line."""
        return any(self._jobs.values())

    def pending(self, name: str) -> bool:
        return bool(self._jobs[name])

    def jobs(self, name: str) -> Iterator[Job]:
        """Budget ``name``'s jobs still waiting, in order."""
        return iter(self._jobs[name])

    def left(self, name: str) -> int:
        """What is left of budget ``name`` in this step."""
        return self._left[name]

    def refill(self, *names: str) -> None:
        """A step begins for these budgets: each is full again."""
        for name in names:
            self._left[name] = self.slices[name]

    def add(self, name: str, job: Job) -> None:
        """``job`` waits in budget ``name``'s line (it runs at the next :meth:`run`)."""
        self._jobs[name].append(job)

    def take(self, name: str, pick: Callable[[Job], bool] | None = None) -> list[Job]:
        """Take out of budget ``name``'s line the jobs ``pick`` says (all without it), in order."""
        line = self._jobs[name]
        taken = [job for job in line if pick is None or pick(job)]
        if taken:
            ids = {id(job) for job in taken}
            kept = [job for job in line if id(job) not in ids]
            line.clear()
            line.extend(kept)
        return taken

    def run(self, name: str) -> int:
        """Run budget ``name``'s jobs, oldest first, while what is left of it this step lasts;
        returns the units done (0 when called from inside one of its own jobs)."""
        left = self._left[name]
        if left <= 0:
            return 0
        done = self.run_within(name, left)
        self._left[name] = self._left[name] - done
        return done

    def run_within(self, name: str, limit: int) -> int:
        """Run budget ``name``'s jobs up to ``limit`` units, leaving the budget as it is."""
        if name in self._running:
            return 0
        self._running.add(name)
        try:
            done = 0
            line = self._jobs[name]
            while line and done < limit:
                job = line[0]
                n, finished = job(limit - done)
                done += n
                if finished:
                    line.popleft()
                elif not n:  # nothing it can do this step
                    break
            return done
        finally:
            self._running.discard(name)
