"""Paged-out bodies on the worker side (broker.storage.paging): a delivery naming a body log location
is read back from disk, checksum checked; one that cannot be read is dropped, never sent."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from pamqp import commands

from ipc import records as r
from ipc.logfile import BodyLog
from workers.arenas import Arenas
from workers.channel import Channel
from workers.channel_config import ChannelConfig, ChannelResources
from workers.consumer_target import Backpressure, ConsumerTargets
from workers.outgoing import Deliveries


def _arenas(data_dir: Path) -> Arenas:
    # Paged bodies never touch a region: none is mapped here.
    return Arenas(SimpleNamespace(), 0, ["w0", "w1"], data_dir)  # type: ignore[arg-type]


def test_a_paged_delivery_is_read_back_from_the_publishing_workers_body_log(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 1)
    log.append(b"first", b"other body")
    where = log.append(b"HDR", b"payload")
    log.close()
    arenas = _arenas(tmp_path)
    got = arenas.body(r.Delivery(7, False, "", "q", 1, 0, 3, 7, stored=(1, *where)))
    assert got is not None and (bytes(got[0]), bytes(got[1])) == (b"HDR", b"payload")
    arenas.close_files()


def test_a_damaged_paged_body_is_reported_and_not_returned(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    log = BodyLog(tmp_path, 0)
    segment, offset, length = log.append(b"HDR", b"payload")
    log.close()
    (path,) = (tmp_path / "bodies" / "w0").iterdir()
    data = bytearray(path.read_bytes())
    data[offset + length - 1] ^= 0xFF  # the body's last byte
    path.write_bytes(bytes(data))
    arenas = _arenas(tmp_path)
    with caplog.at_level(logging.ERROR, "shoal.worker"):
        assert arenas.body(r.Delivery(7, False, "", "q", 0, 0, 3, 7,
                                      stored=(0, segment, offset, length))) is None
    assert "cannot be read back" in caplog.text


def test_a_consumer_is_not_sent_a_body_that_cannot_be_read_and_it_is_settled(tmp_path: Path) -> None:
    targets = ConsumerTargets(4)
    ch = Channel(1, ChannelConfig(3, False, Backpressure()),
                 ChannelResources(_arenas(tmp_path), targets))
    out = ch.on_method(commands.Basic.Consume(queue="q", consumer_tag="c"))
    (consume,) = out.requests
    target = targets.get(consume.consumer)  # type: ignore[attr-defined]
    assert target is not None
    ch.on_reply(r.Reply(3, 1, "consume", queue="q"))
    ch.notify(target)
    missing = r.Delivery(9, False, "", "q", 0, 0, 3, 7, stored=(0, 0, 8, 40))  # no such file
    out = ch.on_pulled(target, r.Pulled(target.id, [missing], more=False))
    assert not any(isinstance(e, Deliveries) for e in out.events)
    assert out.requests == [r.Settle(3, 1, [9], r.AUTO_ACK)]
    assert not ch.unacked and target.unacked == 0
