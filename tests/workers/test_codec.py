from __future__ import annotations

from typing import Any

import pytest
from pamqp import base, body, commands, encode, frame, header

from workers import codec


def _method_payload(method: base.Frame) -> bytes:
    return frame.marshal(method, 1)[7:-1]


def _header_payload(body_size: int, properties: commands.Basic.Properties) -> bytes:
    return header.ContentHeader(0, body_size, properties).marshal()


def _pamqp_content(channel: int, header_payload: bytes, data: bytes, frame_max: int) -> bytes:
    props = header.ContentHeader()
    props.unmarshal(header_payload)
    out = frame.marshal(props, channel)
    chunk = frame_max - 8
    for offset in range(0, len(data), chunk):
        out += frame.marshal(body.ContentBody(data[offset : offset + chunk]), channel)
    return out


PROPERTIES = commands.Basic.Properties(
    content_type="application/json",
    content_encoding="gzip",
    headers={"x-match": "all", "n": 7, "nested": {"a": True}},
    delivery_mode=2,
    priority=3,
    message_id="m-1",
)


@pytest.mark.parametrize(
    ("exchange", "routing_key", "mandatory", "immediate"),
    [
        ("", "q", False, False),
        ("amq.topic", "a.b.c", True, False),
        ("ex", "", False, True),
        ("amq.direct", "ü" * 120, True, True),
    ],
)
def test_decode_basic_publish_matches_pamqp(
    exchange: str, routing_key: str, mandatory: bool, immediate: bool
) -> None:
    """The fast Basic.Publish decoder agrees with pamqp's."""
    method = commands.Basic.Publish(
        exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
    )
    payload = memoryview(_method_payload(method))
    assert codec.decode_basic_publish(payload) == (exchange, routing_key, mandatory, immediate)
    pamqp_view: Any = codec.decode_method(payload)
    assert (
        pamqp_view.exchange,
        pamqp_view.routing_key,
        pamqp_view.mandatory,
        pamqp_view.immediate,
    ) == (
        exchange,
        routing_key,
        mandatory,
        immediate,
    )


def test_decode_basic_publish_truncated_is_a_decode_error() -> None:
    """A Basic.Publish payload cut short cannot be decoded (FRAME_ERROR upstream)."""
    payload = _method_payload(commands.Basic.Publish(exchange="ex", routing_key="rk"))
    for cut in range(len(payload)):
        with pytest.raises(codec.DecodeError):
            codec.decode_basic_publish(payload[:cut])


def test_parse_content_header_matches_pamqp() -> None:
    """class id, body size and flags come out without decoding properties."""
    payload = _header_payload(123456789, PROPERTIES)
    parsed = header.ContentHeader()
    parsed.unmarshal(payload)
    class_id, body_size, flags = codec.parse_content_header(memoryview(payload))
    assert (class_id, body_size) == (60, parsed.body_size)
    assert flags & codec.HEADERS_FLAG
    assert codec.decode_properties(payload) == PROPERTIES


@pytest.mark.parametrize(
    "properties",
    [
        PROPERTIES,
        commands.Basic.Properties(headers={"k": "v"}),
        commands.Basic.Properties(content_type="t", headers={"k": 1}),
        commands.Basic.Properties(content_encoding="e", headers={}),
    ],
)
def test_headers_from_content_header(properties: commands.Basic.Properties) -> None:
    """The headers table is decoded past content-type and content-encoding."""
    payload = memoryview(_header_payload(5, properties))
    assert codec.headers_from_content_header(payload) == properties.headers


def test_headers_absent_is_none() -> None:
    """Without the headers flag there is nothing to decode."""
    payload = _header_payload(5, commands.Basic.Properties(content_type="text/plain", priority=1))
    assert codec.headers_from_content_header(payload) is None


_BEFORE_DELIVERY_MODE: list[dict[str, Any]] = [
    {},
    {"content_type": "application/json"},
    {"content_encoding": "gzip"},
    {"headers": {"x-match": "all", "n": 7, "nested": {"a": True}, "s": "x" * 300}},
    {"headers": {}},
    {"content_type": "t", "content_encoding": "e", "headers": {"k": "\x02\x02", "n": 2}},
]
_AFTER_DELIVERY_MODE: dict[str, Any] = {"priority": 2, "message_id": "m", "app_id": "a"}


@pytest.mark.parametrize("before", _BEFORE_DELIVERY_MODE)
@pytest.mark.parametrize("mode", [1, 2, None])
@pytest.mark.parametrize("after", [{}, _AFTER_DELIVERY_MODE])
def test_is_persistent_reads_delivery_mode_past_the_properties_before_it(
    before: dict[str, Any], mode: int | None, after: dict[str, Any]
) -> None:
    """delivery_mode 2 is persistent; 1 or absent is not, whatever properties precede or
    follow it (the persistent case agrees with pamqp's decoding)."""
    properties = commands.Basic.Properties(**before, delivery_mode=mode, **after)
    payload = _header_payload(5, properties)
    assert codec.decode_properties(payload).delivery_mode == mode
    assert codec.is_persistent(memoryview(payload)) is (mode == 2)
    assert codec.is_persistent(payload) is (mode == 2)


def test_is_persistent_follows_a_continued_flag_word() -> None:
    """A flag word with the continuation bit is followed by another before the properties."""
    payload = _header_payload(5, commands.Basic.Properties(content_type="t", delivery_mode=2))
    flags = int.from_bytes(payload[12:14], "big") | 1
    continued = payload[:12] + flags.to_bytes(2, "big") + b"\x00\x00" + payload[14:]
    assert codec.is_persistent(continued)


def test_is_persistent_truncated_is_a_decode_error() -> None:
    """A header whose flags promise more properties than it holds cannot say."""
    payload = _header_payload(5, commands.Basic.Properties(headers={"k": "v"}, delivery_mode=2))
    for cut in (0, 12, 14, 20, len(payload) - 1):
        with pytest.raises(codec.DecodeError):
            codec.is_persistent(payload[:cut])


def test_is_persistent_without_its_flag_reads_only_the_flags() -> None:
    """No delivery_mode flag: not persistent, without looking past the flag octet (a header
    cut right after it still answers)."""
    payload = _header_payload(5, commands.Basic.Properties(content_type="t", priority=2))
    assert codec.is_persistent(payload[:13]) is False


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 10000, 3 * 4088])
def test_encode_deliver_matches_pamqp(size: int) -> None:
    """Deliver + verbatim header + body split at frame_max - 8, byte for byte."""
    data = bytes(i % 251 for i in range(size))
    header_payload = _header_payload(size, PROPERTIES)
    expected = frame.marshal(commands.Basic.Deliver("ctag", 2**40, True, "ex", "rk"), 5)
    expected += _pamqp_content(5, header_payload, data, 4096)
    got = codec.encode_deliver(
        5, "ctag", 2**40, True, "ex", "rk", header_payload, memoryview(data), 4096
    )
    assert got == expected


@pytest.mark.parametrize("size", [0, 1, 128, 4088, 4089, 10000])
@pytest.mark.parametrize("redelivered", [False, True])
def test_deliver_into_matches_pamqp(size: int, redelivered: bool) -> None:
    """The parts deliver_into appends (a small body joined with its frames in one step, a big
    one as views) are pamqp's frames, byte for byte, with short strings of any UTF-8."""
    data = bytes(i % 251 for i in range(size))
    header_payload = _header_payload(size, PROPERTIES)
    for ctag, exchange, key in [("ctag", "ex", "rk"), ("amq.ctag-é", "", "ключ"), ("c" * 255, "x" * 127, "")]:
        expected = frame.marshal(commands.Basic.Deliver(ctag, 2**40, redelivered, exchange, key), 5)
        expected += _pamqp_content(5, header_payload, data, 4096)
        out: list[codec.Buffer] = []
        n = codec.deliver_into(out, 5, ctag, 2**40, redelivered, exchange, key, header_payload,
                               memoryview(data), 4096)
        assert b"".join(bytes(part) for part in out) == expected and n == len(expected)


def test_deliver_into_past_its_short_string_cache_stays_right() -> None:
    """More distinct routing keys than the cache keeps: each still encoded as its own."""
    header_payload = _header_payload(3, PROPERTIES)
    for n in range(codec._SHORTSTRS_MAX + 100):
        key = f"key.{n}"
        out: list[codec.Buffer] = []
        codec.deliver_into(out, 1, "c", n + 1, False, "", key, header_payload, b"abc", 131072)
        expected = frame.marshal(commands.Basic.Deliver("c", n + 1, False, "", key), 1)
        assert bytes(out[0]).startswith(expected)
    assert len(codec._SHORTSTRS) <= codec._SHORTSTRS_MAX
    with pytest.raises(ValueError):
        codec.deliver_into([], 1, "c" * 256, 1, False, "", "q", header_payload, b"abc", 4096)


def test_encode_deliver_empty_body_has_no_body_frame() -> None:
    """A zero-length body is a method frame and a header frame only."""
    header_payload = _header_payload(0, commands.Basic.Properties())
    got = codec.encode_deliver(1, "c", 1, False, "", "q", header_payload, b"", 131072)
    frames = []
    while got:
        used, _, value = frame.unmarshal(got)
        frames.append(type(value).__name__)
        got = got[used:]
    assert frames == ["Deliver", "ContentHeader"]


def test_encode_get_ok_matches_pamqp() -> None:
    """Get-Ok + verbatim header + body, byte for byte."""
    data = b"payload" * 1000
    header_payload = _header_payload(len(data), PROPERTIES)
    expected = frame.marshal(commands.Basic.GetOk(9, False, "ex", "rk", 41), 2)
    expected += _pamqp_content(2, header_payload, data, 4096)
    assert codec.encode_get_ok(2, 9, False, "ex", "rk", 41, header_payload, data, 4096) == expected


def test_encode_return_matches_pamqp() -> None:
    """Return + verbatim header + body, byte for byte."""
    data = b"r" * 9000
    header_payload = _header_payload(len(data), PROPERTIES)
    expected = frame.marshal(commands.Basic.Return(312, "NO_ROUTE", "ex", "rk"), 3)
    expected += _pamqp_content(3, header_payload, data, 8192)
    assert (
        codec.encode_return(3, 312, "NO_ROUTE", "ex", "rk", header_payload, data, 8192) == expected
    )


@pytest.mark.parametrize("multiple", [False, True])
def test_encode_ack_matches_pamqp(multiple: bool) -> None:
    """Basic.Ack for confirms, byte for byte."""
    assert codec.encode_ack(4, 77, multiple) == frame.marshal(commands.Basic.Ack(77, multiple), 4)


@pytest.mark.parametrize(("multiple", "requeue"), [(False, True), (True, True), (True, False)])
def test_encode_nack_matches_pamqp(multiple: bool, requeue: bool) -> None:
    """Basic.Nack for confirms, byte for byte."""
    assert codec.encode_nack(4, 77, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(77, multiple, requeue), 4
    )


def test_encode_method_is_pamqp() -> None:
    """Everything else is marshalled by pamqp."""
    method = commands.Queue.DeclareOk("q", 3, 1)
    assert codec.encode_method(6, method) == frame.marshal(method, 6)


def test_decode_method_unknown_ids() -> None:
    """A class/method pair outside the spec is reported with its ids."""
    with pytest.raises(codec.UnknownMethod) as info:
        codec.decode_method(b"\x00\x3c\x03\xe7")
    assert (info.value.class_id, info.value.method_id) == (60, 999)


def test_shortstr_over_255_octets_is_refused() -> None:
    """Short strings carry at most 255 octets."""
    with pytest.raises(ValueError):
        codec.encode_deliver(1, "c" * 256, 1, False, "", "q", b"", b"", 4096)


@pytest.mark.parametrize("multiple", [False, True])
def test_decode_basic_ack_matches_pamqp(multiple: bool) -> None:
    """The fast Basic.Ack decoder agrees with pamqp's."""
    payload = memoryview(_method_payload(commands.Basic.Ack(2**50 + 3, multiple)))
    fast, slow = codec.decode_basic_ack(payload), codec.decode_method(payload)
    assert isinstance(slow, commands.Basic.Ack)
    assert (
        (fast.delivery_tag, fast.multiple)
        == (slow.delivery_tag, slow.multiple)
        == (2**50 + 3, multiple)
    )


def test_plain_response() -> None:
    """PLAIN is [authzid] NUL user NUL password; anything else is malformed."""
    assert codec.decode_plain_response(b"\x00guest\x00pw") == ("guest", "pw")
    assert codec.decode_plain_response(b"admin\x00guest\x00pw") == ("guest", "pw")
    with pytest.raises(codec.DecodeError):
        codec.decode_plain_response(b"guest:pw")


@pytest.mark.parametrize("prefixed", [False, True])
def test_amqplain_response(prefixed: bool) -> None:
    """AMQPLAIN is a LOGIN/PASSWORD table, usually sent without its length prefix."""
    table = encode.field_table({"LOGIN": "guest", "PASSWORD": "pw"})
    assert codec.decode_amqplain_response(table if prefixed else table[4:]) == ("guest", "pw")
    with pytest.raises(codec.DecodeError):
        codec.decode_amqplain_response(encode.field_table({"LOGIN": "guest"})[4:])


def test_declare_ok_carries_any_short_string_queue_name() -> None:
    """Queue.Declare-Ok is encoded for names pamqp's pattern refuses but AMQP allows
    (any short string), and decodes to the same fields pamqp would give."""
    from pamqp import frame as pamqp_frame

    from workers.codec import encode_declare_ok

    data = encode_declare_ok(3, "café[x] q", 7, 2)
    _, channel, method = pamqp_frame.unmarshal(data)
    assert channel == 3
    assert (method.queue, method.message_count, method.consumer_count) == ("café[x] q", 7, 2)
