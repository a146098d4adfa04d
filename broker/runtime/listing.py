"""``shoal list-connections`` in progress: each worker's rows as they come back.

The control socket (``broker.runtime.control``) asks the dispatcher, which sends every live worker a
``ListConnections`` record; each answers with ``ConnectionsListed``. A worker that dies before
answering counts as answered (it has no connections to list any more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ipc import records as r


class Listing:
    """One request: the workers' answers as they come, and whom to tell when all are in."""

    __slots__ = ("done", "rows", "waiting")

    def __init__(self, workers: Iterable[int], done: Callable[[], object]) -> None:
        self.rows: list[tuple[int, r.ConnectionInfo]] = []  # (worker, row)
        self.waiting = set(workers)
        self.done = done

    def answered(self, worker: int) -> None:
        self.waiting.discard(worker)
        if not self.waiting:
            self.done()


class Listings(dict[int, Listing]):
    """Requests in progress by request number."""

    def start(self, request: int, workers: Iterable[int], done: Callable[[], object],
              outbox: list[list[r.Event]]) -> Listing:
        """Ask ``workers`` (their outboxes); ``done`` is called once all answered."""
        listing = self[request] = Listing(workers, done)
        for worker in listing.waiting:
            outbox[worker].append(r.ListConnections(request))
        if not listing.waiting:
            done()
        return listing

    def listed(self, worker: int, rec: r.ConnectionsListed) -> None:
        listing = self.get(rec.request)
        if listing is not None:
            listing.rows.extend((worker, row) for row in rec.rows)
            listing.answered(worker)

    def worker_gone(self, worker: int) -> None:
        for listing in list(self.values()):
            listing.answered(worker)  # it will not answer: list what the others have
