"""ContentAssembler: one channel's basic.publish, content header and body frames into one event."""

from __future__ import annotations

import pytest
from pamqp import commands, frame, header

from broker import errors
from workers.content_assembler import ContentAssembler


def payload(value: object, channel: int = 1) -> memoryview:
    """A frame's payload (no frame header, no frame-end octet)."""
    return memoryview(frame.marshal(value, channel))[7:-1]  # type: ignore[arg-type]


def content_header(size: int) -> memoryview:
    return payload(header.ContentHeader(0, size, commands.Basic.Properties()))


def test_body_frames_complete_the_publish() -> None:
    """A publish is complete once its body frames add up to the header's body size."""
    assembler = ContentAssembler(max_body_size=1 << 20)
    assembler.begin(payload(commands.Basic.Publish(exchange="x", routing_key="k", mandatory=True)))
    assert assembler.header(1, content_header(5)) is None
    assert assembler.body(1, memoryview(b"ab")) is None
    publish = assembler.body(1, memoryview(b"cde"))
    assert publish is not None
    assert (publish.channel, publish.exchange, publish.routing_key, publish.mandatory) == (
        1, "x", "k", True)
    assert b"".join(bytes(c) for c in publish.body) == b"abcde" and publish.body_size == 5
    assert assembler.chunks == [] and assembler.remaining == 0  # ready for the next publish


def test_an_empty_body_completes_at_the_header() -> None:
    """A zero-size body has no body frames: the header completes the publish."""
    assembler = ContentAssembler(max_body_size=1 << 20)
    assembler.begin(payload(commands.Basic.Publish(routing_key="k")))
    publish = assembler.header(1, content_header(0))
    assert publish is not None and publish.body == [] and publish.body_size == 0


def test_a_body_over_the_cap_is_refused_at_the_header() -> None:
    """rabbit_channel:check_msg_size: 406 before any body is buffered."""
    assembler = ContentAssembler(max_body_size=10)
    assembler.begin(payload(commands.Basic.Publish(routing_key="k")))
    with pytest.raises(errors.PreconditionFailed) as info:
        assembler.header(1, content_header(11))
    assert info.value.reply_text == "message size 11 is larger than configured max size 10"
    assert assembler.chunks == [] and assembler.body_size == 0


def test_a_body_frame_past_the_body_size_is_a_frame_error() -> None:
    """rabbit_command_assembler: more body than the header announced is 501."""
    assembler = ContentAssembler(max_body_size=1 << 20)
    assembler.begin(payload(commands.Basic.Publish(routing_key="k")))
    assembler.header(1, content_header(2))
    with pytest.raises(errors.FrameError):
        assembler.body(1, memoryview(b"abc"))


def test_whole_declines_what_the_frame_path_must_answer() -> None:
    """The three-frame fast path takes a plain publish and declines immediate=true."""
    assembler = ContentAssembler(max_body_size=1 << 20)
    method = payload(commands.Basic.Publish(routing_key="k"))
    publish = assembler.whole(1, method, content_header(1), memoryview(b"a"))
    assert publish is not None and publish.routing_key == "k" and publish.body_size == 1
    immediate = payload(commands.Basic.Publish(routing_key="k", immediate=True))
    assert assembler.whole(1, immediate, content_header(1), memoryview(b"a")) is None
