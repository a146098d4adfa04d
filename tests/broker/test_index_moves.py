"""One old unacknowledged message does not keep every newer index file (broker.storage.index_moves):
the oldest file's last live messages are recorded again and the file goes once that is on
disk; a restart then finds them as they were."""

from __future__ import annotations

from pathlib import Path

from broker.messages.message_journal import MessageJournal
from broker.runtime.dispatch import Dispatcher
from broker.runtime.durability import Durability
from broker.storage.index_moves import KEEP_FILES
from ipc import records as r
from ipc.logfile import BodyLog, sync_files

W0, W1 = 0, 1
CONN, CH = 1, 1
CONSUMER_CONN = 5


class Broker:
    """The supervisor's half of a broker on ``path``: a dispatcher and its data directory, with
    bodies appended to worker 0's body log as its worker would."""

    def __init__(self, path: Path, *, file_bytes: int = 2048) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(2, lambda region, offset: self.freed.append((region, offset)))
        self.d.pager.set_marks(1 << 30)  # paging on: a restart leaves bodies on disk
        self.durability = Durability(str(path), self.d)
        self.durability.recover_definitions()
        self.durability.recover_messages([None, None], 64)
        assert self.durability.index is not None
        self.durability.index.file_bytes = file_bytes
        self.bodies = BodyLog(path, W0)
        self._offset = 0
        self.batch([r.QueueDeclare(CONN, CH, "d", False, True, False, False, {}, False)])

    def batch(self, records: list[tuple[int, r.Request]] | list[r.Request]) -> None:
        self.d.begin_batch(self.d.vhost.now)
        for rec in records:
            worker, rec = rec if isinstance(rec, tuple) else (W0, rec)
            self.d.handle(worker, rec)
        self.d.end_batch()
        self.durability.save()
        self.durability.write_index()  # the sync task's work, at once
        index = self.durability.index
        assert index is not None
        mark, fds = index.sync_plan()
        sync_files(fds)
        index.synced_to(mark, fds)
        self.d.index_synced(mark)

    def publish(self, body: bytes) -> r.Publish:
        self._offset += 256
        at = self.bodies.append(b"H" * 16, body)
        return r.Publish(CONN, CH, "", "d", False, False, self._offset, 16, len(body), None, body_at=at)

    def get(self) -> r.Delivery:
        self.batch([(W1, r.Get(CONSUMER_CONN, CH, "d", False))])
        (ok,) = [e for e in self.d.outbox[W1] if isinstance(e, r.GetOk)]
        self.d.outbox[W1].clear()
        return ok.delivery

    def index_files(self) -> list[str]:
        return sorted(p.name for p in (self.durability.path / "index").iterdir())

    def close(self) -> None:
        self.bodies.close()
        self.durability.close()


def test_an_unacked_message_is_moved_on_and_the_old_files_go(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    b.batch([b.publish(b"old")])
    held = b.get()  # delivered, never acked
    most = 0
    for i in range(400):  # messages that come and go: many index files
        b.batch([b.publish(b"m%d" % i)])
        b.batch([(W1, r.Settle(CONSUMER_CONN, CH, [b.get().entry], r.ACK))])
        most = max(most, len(b.index_files()))
    assert b.durability.index is not None and b.durability.index.number > 3 * KEEP_FILES
    assert most <= KEEP_FILES + 2  # not one file per 2 KiB written since "old"
    b.close()
    again = Broker(tmp_path)  # a restart reads what is left
    queue = again.d.vhost.queues["d"]
    (entry,) = queue.available_entries()
    assert entry.redelivered and entry.message.body_size == len(b"old")
    assert held.redelivered is False
    again.close()


def test_nothing_moves_while_the_oldest_file_holds_a_message_no_queue_shows(tmp_path: Path) -> None:
    """A message purged from its queue but not let go of yet (the graveyard drops it a slice
    at a time) still counts in its file: the file stays until a later attempt finds all."""
    b = Broker(tmp_path)
    b.batch([b.publish(b"old")])
    b.get()
    journal = b.d.vhost.messages
    assert journal is not None
    (oldest,) = [int(name[:-4]) for name in b.index_files()]
    queue = b.d.vhost.queues["d"]
    original = queue.stored_in
    queue.stored_in = lambda file, limit: [] if file == oldest else original(file, limit)  # type: ignore[method-assign]
    for i in range(200):
        b.batch([b.publish(b"m%d" % i)])
        b.batch([(W1, r.Settle(CONSUMER_CONN, CH, [b.get().entry], r.ACK))])
    assert f"{oldest:010d}.idx" in b.index_files()  # kept: its message was not found
    assert len(b.index_files()) > KEEP_FILES + 2
    b.close()


def test_a_moved_file_is_needed_until_the_log_is_synced_past_its_records() -> None:
    journal = MessageJournal()
    journal.index_file = 3
    journal.deleted("q")  # some record: mark 1
    journal.file_moved(0)
    assert journal.index_file_needed(0)  # the records moving its messages are not on disk
    journal.synced = journal.mark - 1
    assert journal.index_file_needed(0)
    journal.synced = journal.mark
    assert not journal.index_file_needed(0)
