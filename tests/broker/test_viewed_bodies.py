"""A delivery of a big body (ipc.records.VIEWED_BODY_MIN octets or more) may be sent from views
of its arena block that wait for the client's socket: while a channel holds such a delivery the
pager leaves its block where it is (broker.runtime.open_channels.viewed, broker.storage.paging), before a
page-out and when one comes back; settled, the message is freed or paged as any other."""

from __future__ import annotations

from ipc import records as r
from ipc.logfile import BODY_OVERHEAD
from tests.broker import paging_harness as paging

W0, W1 = paging.W0, paging.W1
BIG = r.VIEWED_BODY_MIN
SIZE = 16 + BIG


class Harness(paging.Harness):
    """test_paging's harness, its queue holding bodies of ``body`` octets, the mark at two."""

    def __init__(self, body: int = BIG) -> None:
        super().__init__()
        self.body = body
        self.d.pager.set_marks(high_watermark=4 * (16 + body), ratio=0.5)  # down to 1.8
        self.published = 0

    def publish(self, n: int, *, persistent: bool = True) -> list[int]:  # type: ignore[override]
        offsets = []
        for _ in range(n):
            self.published += 1
            offset = self.published << 16
            body_at = (0, 1000 * self.published, 16 + self.body + BODY_OVERHEAD) if persistent else None
            self.d.handle(W0, r.Publish(1, 1, "", "d", False, False, offset, 16, self.body, None,
                                        body_at=body_at))
            offsets.append(offset)
        self.d.end_batch()
        return offsets

    def page_outs(self) -> list[list[tuple[int, int, int]]]:
        outs = [e.bodies for e in self.d.outbox[W0] if isinstance(e, r.PageOut)]
        self.d.outbox[W0].clear()
        return outs


def test_the_pager_passes_over_bodies_a_channel_holds_a_delivery_of() -> None:
    h = Harness()
    first = h.publish(2)
    held = [h.get(), h.get()]  # acquired: their worker may still view the blocks
    assert h.freed == [] and [d.offset for d in held] == first
    newest = h.publish(1)  # three in the arena, the mark is two: page the newest down
    assert h.freed == [(W0, newest[0])]  # paged; the two held ones stay
    assert h.d.region_bytes[W0] == 2 * SIZE
    h.freed.clear()
    h.d.handle(W1, r.Settle(5, 1, [d.entry for d in held], r.ACK))
    assert sorted(h.freed) == [(W0, o) for o in first]  # settled: freed as ever


def test_a_small_body_is_paged_while_delivered_as_before() -> None:
    """Below VIEWED_BODY_MIN a delivery's body is copied into its frames when it is queued:
    nothing views the block after the step, and the pager does not look."""
    h = Harness(body=100)
    first = h.publish(2)
    h.get()
    h.get()
    h.publish(1)
    assert (W0, first[1]) in h.freed  # newest first, the held ones too


def test_a_body_delivered_while_being_written_out_stays_in_its_block() -> None:
    h = Harness()
    offsets = h.publish(3, persistent=False)  # transient: the worker writes them out first
    (bodies,) = h.page_outs()
    assert [b[0] for b in bodies] == [offsets[2], offsets[1]]  # newest first, down to 1.8
    held = [h.get() for _ in range(3)]  # those being written out are delivered meanwhile
    assert [d.offset for d in held] == offsets and held[2].stored is None
    h.d.handle(W0, r.PagedOut([(offsets[2], 3, 8), (offsets[1], 3, 8 + SIZE + BODY_OVERHEAD)]))
    h.d.end_batch()
    assert h.freed == []  # written, but a channel holds a delivery of it: not released
    assert h.d.vhost.messages is not None and h.d.vhost.messages.live_segments() == set()
    h.d.handle(W1, r.Settle(5, 1, [d.entry for d in held], r.ACK))
    assert sorted(h.freed) == sorted((W0, o) for o in offsets)
    assert h.d.region_bytes[W0] == 0


def test_a_closed_channel_lets_go_of_what_it_held() -> None:
    h = Harness()
    first = h.publish(2)
    h.get()
    h.get()
    h.d.handle(W1, r.ChanClose(5, 1))  # both requeued: no delivery of them is held now
    h.d.outbox[W1].clear()
    h.freed.clear()
    newest = h.publish(1)
    # Three in the arena: paged down below 1.8 messages' worth, newest first, the two that
    # were held among them now.
    assert h.freed == [(W0, newest[0]), (W0, first[1])]
