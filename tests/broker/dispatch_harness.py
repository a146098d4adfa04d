"""The supervisor's dispatch driven by hand (records in, events and notify slots out), for the
dispatch tests and the tests built on them (standing pulls, flow control)."""

from __future__ import annotations

from broker.runtime.dispatch import Dispatcher
from ipc import records as r

W0, W1 = 0, 1


class Harness:
    def __init__(self) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(2, lambda region, offset: self.freed.append((region, offset)))
        self._offset = 0

    def send(self, worker: int, rec: r.Request) -> None:
        self.d.handle(worker, rec)

    def events(self, worker: int) -> list[r.Event]:
        out = list(self.d.outbox[worker])
        self.d.outbox[worker].clear()
        return out

    def woken(self, worker: int) -> list[int]:
        slots = list(self.d.notify[worker])
        self.d.notify[worker].clear()
        return slots

    def declare(self, name: str, worker: int = W0, conn: int = 1, **kw: bool) -> None:
        self.send(worker, r.QueueDeclare(conn, 1, name, False, False, kw.get("exclusive", False),
                                         False, {}, False))
        self.events(worker)

    def publish(self, rk: str, worker: int = W0, *, exchange: str = "", mandatory: bool = False,
                confirm: bool = False) -> int:
        self._offset += 256
        self.send(worker, r.Publish(1, 1, exchange, rk, mandatory, confirm, self._offset, 16, 100,
                                    None))
        return self._offset

    def consume(self, queue: str, cid: int, slot: int, worker: int = W1, conn: int = 1,
                ch: int = 1, *, browse: bool = False, priority: int = 0) -> None:
        self.send(worker, r.Consume(conn, ch, cid, slot, queue, f"c{cid}", False, False,
                                    priority, browse, True, False))
        assert isinstance(self.events(worker)[0], r.Reply)

    def pull(self, cid: int, n: int, worker: int = W1) -> r.Pulled:
        self.send(worker, r.Pull(cid, n))
        (pulled,) = self.events(worker)
        assert isinstance(pulled, r.Pulled)
        return pulled
