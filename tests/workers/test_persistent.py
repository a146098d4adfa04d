"""The worker half of persistent messages (``shoal serve --data-dir``): a persistent publish's
header and body go from the arena to the worker's body log, and its publisher confirm waits
for that log's sync (workers.confirm_gate), in publish order."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import body, commands, frame

from ipc import logfile
from ipc import records as r
from ipc.logfile import BodyLog, BodyReader

from .helpers import CONN, Harness, methods

PERSISTENT = commands.Basic.Properties(delivery_mode=2, content_type="text/plain")
TRANSIENT = commands.Basic.Properties(delivery_mode=1, content_type="text/plain")


@pytest.fixture
def body_log(tmp_path: Path) -> Iterator[BodyLog]:
    log = BodyLog(tmp_path, 0)
    yield log
    log.close()


def _harness(body_log: BodyLog | None, *, confirm: bool = False) -> Harness:
    h = Harness(body_log=body_log)
    if confirm:
        h.client(1, commands.Confirm.Select())
        h.frames()
    return h


def _publish(h: Harness, properties: commands.Basic.Properties, data: bytes = b"m") -> r.Publish:
    h.publish(1, data, properties, exchange="", routing_key="q")
    [rec] = h.take()
    assert isinstance(rec, r.Publish)
    return rec


def _sync(h: Harness, log: BodyLog) -> None:
    """What workers.body_sync.sync_bodies does for one sync."""
    appended, fds = log.sync_plan()
    logfile.sync_files(fds)
    log.synced_to(appended, fds)
    h.worker.body_synced()


def _acks(h: Harness) -> list[tuple[str, int, bool]]:
    out = []
    for _, m in methods(h.frames()):
        assert isinstance(m, (commands.Basic.Ack, commands.Basic.Nack)), m
        out.append((type(m).__name__, m.delivery_tag, m.multiple))
    return out


# -- storing bodies ------------------------------------------------------------------------


def test_a_persistent_publish_writes_the_arena_header_and_body_to_the_log(
        body_log: BodyLog, tmp_path: Path) -> None:
    h = _harness(body_log)
    rec = _publish(h, PERSISTENT, b"persistent body")
    assert rec.body_at is not None
    arena_header, arena_body = h.worker.own_body(rec.offset, rec.header_len, rec.body_len)
    assert bytes(arena_body) == b"persistent body"
    assert (body_log.appended, h.worker.body_sync_wanted) == (1, 1)  # and the sync task told
    reader = BodyReader(tmp_path)
    try:
        assert reader.read(0, *rec.body_at) == (bytes(arena_header), bytes(arena_body))
    finally:
        reader.close()


@pytest.mark.parametrize("properties", [TRANSIENT, commands.Basic.Properties()])
def test_a_transient_publish_writes_nothing(body_log: BodyLog,
                                            properties: commands.Basic.Properties) -> None:
    h = _harness(body_log)
    rec = _publish(h, properties)
    assert rec.body_at is None
    assert (body_log.appended, h.worker.body_sync_wanted) == (0, 0)


def test_without_a_data_dir_a_persistent_publish_writes_nothing(tmp_path: Path) -> None:
    h = _harness(None)
    rec = _publish(h, PERSISTENT)
    assert rec.body_at is None
    assert h.worker.body_sync_wanted == 0
    assert not list(tmp_path.iterdir())


def test_a_transactional_persistent_publish_is_written_when_published(body_log: BodyLog) -> None:
    """Written at basic.publish, not at tx.commit; a rolled-back one leaves unused bytes."""
    h = _harness(body_log)
    h.client(1, commands.Tx.Select())
    h.frames()
    h.publish(1, b"rolled back", PERSISTENT, exchange="", routing_key="q")
    assert h.take() == [] and body_log.appended == 1
    h.client(1, commands.Tx.Rollback())
    h.publish(1, b"committed", PERSISTENT, exchange="", routing_key="q")
    assert body_log.appended == 2
    h.client(1, commands.Tx.Commit())
    [rec] = h.take()  # the commit's Sync follows the body sync (next test)
    assert isinstance(rec, r.Publish) and rec.body_at is not None
    assert rec.body_at[1] > logfile.FRAME.size  # after the rolled-back frame


def test_commit_ok_waits_for_the_body_sync_and_later_methods_wait_behind_it(body_log: BodyLog) -> None:
    """tx.commit of persistent publishes: the Sync (whose reply becomes commit-ok) goes once the
    bodies are on disk; a method the client sent after the commit is not run before it."""
    h = _harness(body_log)
    h.client(1, commands.Tx.Select())
    h.frames()
    h.publish(1, b"p", PERSISTENT, exchange="", routing_key="q")
    h.client(1, commands.Tx.Commit())
    h.client(1, commands.Queue.Declare(queue="after", passive=True))
    assert [type(rec) for rec in h.take()] == [r.Publish]
    _sync(h, body_log)
    sync_rec, declare = h.take()
    assert isinstance(sync_rec, r.Sync) and isinstance(declare, r.QueueDeclare)
    h.supervisor(r.Reply(sync_rec.conn, 1, "sync"))
    assert [type(m) for _, m in methods(h.frames())] == [commands.Tx.CommitOk]


def test_a_commit_of_transient_publishes_does_not_wait(body_log: BodyLog) -> None:
    h = _harness(body_log)
    h.client(1, commands.Tx.Select())
    h.frames()
    h.publish(1, b"t", TRANSIENT, exchange="", routing_key="q")
    h.client(1, commands.Tx.Commit())
    assert [type(rec) for rec in h.take()] == [r.Publish, r.Sync]


def test_a_content_header_too_short_to_say_is_a_frame_error(body_log: BodyLog) -> None:
    """delivery_mode flagged but missing: 501, the connection closes, its arena block is freed."""
    h = _harness(body_log)
    flags = commands.Basic.Properties.flags["delivery_mode"]
    truncated = struct.pack(">HHQH", 60, 0, 1, flags)  # no property octets follow
    h.feed(frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
           + b"\x02\x00\x01" + struct.pack(">I", len(truncated)) + truncated + b"\xce"
           + frame.marshal(body.ContentBody(b"x"), 1))
    assert not [rec for rec in h.take() if isinstance(rec, r.Publish)]
    [(channel, close)] = methods(h.frames())
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501
    assert h.worker.region.arena.freed == [0]
    assert body_log.appended == 0


def test_a_failed_body_write_closes_the_connection_and_nothing_of_it_is_confirmed(
        body_log: BodyLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies are queued as published and written in one batch before the records go out
    (here: Harness.take). A failed write (a full disk) is 541 for every connection with a body
    in the batch; their Publish records may still go (never confirmed: a restart finds the
    frames torn or missing), and no later sync confirms them: the closed channel's gate is
    gone and the supervisor's Confirm is ignored."""
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT, b"written")
    h.supervisor(r.Confirm(CONN, 1, True))  # held for the sync

    def full(fd: int, parts: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logfile.os, "writev", full)
    h.publish(1, b"lost 1", PERSISTENT, exchange="", routing_key="q")
    h.publish(1, b"lost 2", PERSISTENT, exchange="", routing_key="q")
    assert h.frames() == []  # queued: nothing written, nothing refused yet
    records = h.take()
    assert [type(rec) for rec in records] == [r.Publish, r.Publish, r.ChanClose]
    [(channel, close)] = methods(h.frames())
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 541 and "cannot store message" in close.reply_text
    assert not h.worker.confirm_waiters and not body_log.pending
    monkeypatch.undo()
    h.supervisor(r.Confirm(CONN, 2, True))
    _sync(h, body_log)  # covers the failed appends' positions: confirms nothing
    assert body_log.synced == 3
    assert h.frames() == []
    # Later appends go to a new segment.
    assert body_log.append(b"h", b"b")[:2] == (1, len(logfile.BODY_MAGIC))


# -- confirms wait for the sync ------------------------------------------------------------


def test_the_ack_of_a_persistent_publish_waits_for_the_sync(body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    h.supervisor(r.Confirm(CONN, 1, True))
    assert h.frames() == []
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 1, False)]
    assert not h.worker.confirm_waiters


def test_a_transient_publish_confirmed_after_a_held_one_waits_behind_it(
        body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    _publish(h, TRANSIENT)
    h.supervisor(r.Confirm(CONN, 1, True))
    h.supervisor(r.Confirm(CONN, 1, True))
    assert h.frames() == []
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 2, True)]


def test_a_transient_publish_confirmed_before_a_persistent_one_is_acked_at_once(
        body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, TRANSIENT)
    _publish(h, PERSISTENT)
    h.supervisor(r.Confirm(CONN, 1, True), r.Confirm(CONN, 1, True))
    assert _acks(h) == [("Ack", 1, False)]
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 2, False)]


def test_a_nack_behind_a_held_ack_keeps_its_order(body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    _publish(h, TRANSIENT)
    h.supervisor(r.Confirm(CONN, 1, True), r.Confirm(CONN, 1, False))
    assert h.frames() == []
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 1, False), ("Nack", 2, False)]


def test_one_record_for_several_publishes_is_let_through_in_part(body_log: BodyLog) -> None:
    """Confirm(count=3) for transient, persistent, transient: the first is acked at once, the
    other two wait for the sync of the persistent body (the third behind the second)."""
    h = _harness(body_log, confirm=True)
    _publish(h, TRANSIENT)
    _publish(h, PERSISTENT)
    _publish(h, TRANSIENT)
    h.supervisor(r.Confirm(CONN, 1, True, 3))
    assert _acks(h) == [("Ack", 1, False)]
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 3, True)]
    assert not h.worker.confirm_waiters


def test_a_run_of_nacks_is_a_nack_each_after_the_acks_before_it(body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    for _ in range(4):
        _publish(h, TRANSIENT)
    h.supervisor(r.Confirm(CONN, 1, True, 2), r.Confirm(CONN, 1, False, 2))
    assert _acks(h) == [("Ack", 2, True), ("Nack", 3, False), ("Nack", 4, False)]


def test_a_sync_releases_only_the_publishes_it_covers(body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    appended, fds = body_log.sync_plan()  # a sync starts: it covers the first publish only
    _publish(h, PERSISTENT)
    _publish(h, TRANSIENT)
    h.supervisor(*[r.Confirm(CONN, 1, True)] * 3)
    logfile.sync_files(fds)
    body_log.synced_to(appended, fds)
    h.worker.body_synced()
    assert _acks(h) == [("Ack", 1, False)]
    assert h.worker.confirm_waiters  # the rest wait for the next sync
    _sync(h, body_log)
    assert _acks(h) == [("Ack", 3, True)]


def test_a_confirm_after_the_sync_is_sent_at_once(body_log: BodyLog) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    _sync(h, body_log)
    assert h.frames() == []
    h.supervisor(r.Confirm(CONN, 1, True))
    assert _acks(h) == [("Ack", 1, False)]
    assert not h.worker.confirm_waiters


def test_confirms_are_held_per_channel(body_log: BodyLog) -> None:
    h = Harness(channels=(1, 2), body_log=body_log)
    for n in (1, 2):
        h.client(n, commands.Confirm.Select())
    h.frames()
    h.publish(1, b"m", PERSISTENT, exchange="", routing_key="q")
    h.publish(2, b"m", TRANSIENT, exchange="", routing_key="q")
    h.supervisor(r.Confirm(CONN, 1, True), r.Confirm(CONN, 2, True))
    assert [(n, type(m)) for n, m in methods(h.frames())] == [(2, commands.Basic.Ack)]
    _sync(h, body_log)
    assert [(n, type(m)) for n, m in methods(h.frames())] == [(1, commands.Basic.Ack)]


def test_without_a_data_dir_confirms_are_not_held(tmp_path: Path) -> None:
    h = _harness(None, confirm=True)
    _publish(h, PERSISTENT)
    h.supervisor(r.Confirm(CONN, 1, True))
    assert _acks(h) == [("Ack", 1, False)]
    assert h.channel().confirm_gate is None


def test_outside_confirm_mode_nothing_is_held(body_log: BodyLog) -> None:
    h = _harness(body_log)
    rec = _publish(h, PERSISTENT)
    assert rec.body_at is not None and not rec.confirm
    assert h.channel().confirm_gate is None


@pytest.mark.parametrize("close", ["channel", "connection"])
def test_held_confirms_of_a_closed_channel_are_dropped(body_log: BodyLog, close: str) -> None:
    h = _harness(body_log, confirm=True)
    _publish(h, PERSISTENT)
    h.supervisor(r.Confirm(CONN, 1, True))
    if close == "channel":
        h.client(1, commands.Channel.Close(200, "bye", 0, 0))
    else:
        h.client(0, commands.Connection.Close(200, "bye", 0, 0))
    h.frames()
    assert not h.worker.confirm_waiters
    _sync(h, body_log)
    assert h.frames() == []
