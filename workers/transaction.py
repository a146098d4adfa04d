"""A transactional channel's held work (AMQP 0-9-1 tx class, RabbitMQ's semantics).

After tx.select a channel's publishes and acknowledgements take effect at tx.commit, in the
order the client made them; tx.rollback drops the publishes and gives the acknowledgements
back (their deliveries are unacked again). The channel owns one ``Transaction`` and asks it
what to do at commit and rollback; the transaction only holds and hands back.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from ipc import records as r

T = TypeVar("T")  # the consumer target a settled delivery came through


class Transaction(Generic[T]):
    """Publishes and settles held until tx.commit."""

    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[r.Publish] = []
        # (delivery tag, entry, target or None for basic.get, settle action)
        self.settles: list[tuple[int, int, T | None, int]] = []

    def hold_publish(self, rec: r.Publish) -> None:
        self.publishes.append(rec)

    def hold_settles(self, taken: list[tuple[int, int, T | None]], action: int) -> None:
        self.settles.extend((tag, entry, target, action) for tag, entry, target in taken)

    def commit(self) -> tuple[list[r.Publish], list[tuple[list[int], int]]]:
        """The held publishes, and the held settles as runs of one action (one Settle record
        each), in order; the transaction is empty again."""
        runs: list[tuple[list[int], int]] = []
        run: list[int] = []
        action = -1
        for _, entry, _, act in self.settles:
            if act != action and run:
                runs.append((run, action))
                run = []
            run.append(entry)
            action = act
        if run:
            runs.append((run, action))
        publishes = self.publishes
        self.publishes, self.settles = [], []
        return publishes, runs

    def take_publishes(self) -> list[r.Publish]:
        """Drop the held publishes (rollback, or the channel closed): their arena blocks are
        the caller's to free."""
        publishes, self.publishes = self.publishes, []
        return publishes

    def take_settles(self) -> list[tuple[int, int, T | None, int]]:
        """Drop the held settles (rollback): their deliveries are unacked again."""
        settles, self.settles = self.settles, []
        return settles
