"""A supervisor's dispatch with a journal and paging marks (20 messages of SIZE octets, paged
down to nine), for the paging tests and the viewed-bodies tests built on them."""

from __future__ import annotations

from broker.messages.message_journal import MessageJournal
from broker.runtime.dispatch import Dispatcher
from ipc import records as r
from ipc.logfile import BODY_OVERHEAD

W0, W1 = 0, 1
SIZE = 116  # header 16 + body 100, as Harness.publish sends


class Harness:
    def __init__(self) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(2, lambda region, offset: self.freed.append((region, offset)))
        self.d.vhosts.messages = MessageJournal()
        self.d.pager.set_marks(high_watermark=20 * SIZE, ratio=0.5)
        self.d.handle(W0, r.QueueDeclare(1, 1, "d", False, True, False, False, {}, False))
        self.d.outbox[W0].clear()

    def publish(self, n: int, *, persistent: bool = True) -> None:
        for i in range(n):
            offset = 256 * (i + 1)
            body_at = (0, 1000 * i, SIZE + BODY_OVERHEAD) if persistent else None
            self.d.handle(W0, r.Publish(1, 1, "", "d", False, False, offset, 16, 100, None,
                                        body_at=body_at))
        self.d.end_batch()

    def get(self) -> r.Delivery:
        self.d.handle(W1, r.Get(5, 1, "d", False))
        (ok,) = self.d.outbox[W1]
        self.d.outbox[W1].clear()
        assert isinstance(ok, r.GetOk)
        return ok.delivery
