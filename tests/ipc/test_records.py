"""The record schema: every record round-trips, and each direction's decoder
accepts only its own records."""

from __future__ import annotations

import msgspec
import pytest

from ipc import records as r
from ipc.worker_config import WorkerConfig

REQUESTS = [
    r.Hello(pid=42),
    r.ConnOpen(conn=1),
    r.ConnClose(conn=1),
    r.ChanClose(conn=1, ch=2),
    r.ExchangeDeclare(1, 1, "x", "topic", False, True, False, False, {"alternate-exchange": "ae"}, False),
    r.ExchangeDelete(1, 1, "x", True, False),
    r.QueueDeclare(1, 1, "q", False, False, True, False, {"x-max-length": 10}, False),
    r.QueueBind(1, 1, "q", "amq.topic", "a.*", {}, True),
    r.QueueUnbind(1, 1, "q", "amq.topic", "a.*", {}),
    r.QueuePurge(1, 1, "q", False),
    r.QueueDelete(1, 1, "q", True, True, False),
    r.Consume(1, 1, 7, 3, "q", "ctag", False, False, 5, False, True, False),
    r.Cancel(1, 1, 7, False),
    r.Interest(7, True),
    r.Pull(7, 100),
    r.Get(1, 1, "q", True),
    r.Publish(1, 1, "", "q", True, True, 4096, 20, 128, {"k": "v"}),
    r.Publish(1, 1, "", "q", False, False, 0, 14, 0, None),
    r.Publish(1, 1, "", "q", False, False, 0, 14, 0, None, expiration="60000", priority=5),
    r.ExchangeBind(1, 1, "dest", "src", "a.#", {}, False),
    r.ExchangeUnbind(1, 1, "dest", "src", "a.#", {}, True),
    r.Settle(1, 1, [1, 2, 3], r.REQUEUE),
]

DELIVERY = r.Delivery(9, True, "amq.direct", "rk", 1, 8192, 20, 100)
REHEADERED = r.Delivery(9, True, "dlx", "rk", 1, 8192, 20, 100, True, {"x-death": [{"count": 1}]}, None)
EVENTS = [
    r.Reply(1, 1, "qdecl", queue="amq.gen-x", message_count=3, consumer_count=1),
    r.Reply(1, 1, "xdecl"),
    r.Error(1, 1, 404, "no queue 'q' in vhost '/'", 50, 10),
    r.Pulled(7, [DELIVERY, DELIVERY], True),
    r.Pulled(7, [], False),
    r.GetOk(1, 1, DELIVERY, 5),
    r.Pulled(7, [REHEADERED], False),
    r.GetEmpty(1, 1),
    r.Returned(1, 1, 312, "NO_ROUTE", "", "nowhere", 64, 20, 5),
    r.Confirm(1, 1, True),
    r.Cancelled(7),
]


@pytest.mark.parametrize("rec", REQUESTS, ids=lambda rec: type(rec).__name__)
def test_request_round_trips(rec: r.Request) -> None:
    """A request decodes to an equal record of the same type."""
    codec = r.Codec()
    assert codec.decode_request(codec.encode(rec)) == rec


@pytest.mark.parametrize("rec", EVENTS, ids=lambda rec: type(rec).__name__)
def test_event_round_trips(rec: r.Event) -> None:
    """An event decodes to an equal record of the same type."""
    codec = r.Codec()
    assert codec.decode_event(codec.encode(rec)) == rec


def test_tags_are_unique_and_stable() -> None:
    """Every record has its own tag, so a decoder can never confuse two kinds."""
    tags = [t.__struct_config__.tag for t in (*map(type, REQUESTS), *map(type, EVENTS))]
    assert len(set(tags)) == len({*map(type, REQUESTS), *map(type, EVENTS)})
    assert r.Publish.__struct_config__.tag == "pub"


def test_request_decoder_refuses_events() -> None:
    """The request ring carries requests only: an event there is a decode error."""
    codec = r.Codec()
    with pytest.raises(msgspec.ValidationError):
        codec.decode_request(codec.encode(r.Confirm(1, 1, True)))


def test_records_are_frozen() -> None:
    """Records crossing a process boundary are immutable values."""
    with pytest.raises(AttributeError):
        r.Pull(1, 2).max = 3  # type: ignore[misc]


def test_worker_config_round_trips_as_json() -> None:
    """The worker's start-up config travels as JSON on its command line."""
    cfg = WorkerConfig(index=1, instance="1-ab", regions=["/a", "/b"], listen_fd=3,
                       request_fd=4, event_fd=5, alive_fd=6)
    assert msgspec.json.decode(msgspec.json.encode(cfg), type=WorkerConfig) == cfg
