"""The links process's own frame code: links.shovel's hand-made basic.publish frames are the bytes
pamqp marshals, and links.frames reads frames as pamqp unmarshals them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiormq.connection import FrameReceiver
from aiormq.exceptions import AMQPConnectionError
from links.frames import get_frame
from links.shovel import encode_publish
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.frame import marshal, unmarshal
from pamqp.header import ContentHeader


@pytest.mark.parametrize(("body", "max_size"), [(b"", 10), (b"abc", 10), (b"x" * 25, 10),
                                                (b"y" * 20, 10)])
def test_publish_frames_match_pamqp(body: bytes, max_size: int) -> None:
    """Method frame, content header, then body frames of at most max_size bytes each."""
    props = spec.Basic.Properties(headers={"x-received-from": [{"hops": 1}]}, delivery_mode=2,
                                  user_id="u")
    expected = marshal(spec.Basic.Publish(exchange="fed.x", routing_key="k.é"), 3)
    expected += marshal(ContentHeader(properties=props, body_size=len(body)), 3)
    for start in range(0, len(body), max_size):
        expected += marshal(ContentBody(body[start:start + max_size]), 3)
    assert encode_publish(3, "fed.x", "k.é", props, body, max_size) == expected


def test_frames_read_as_pamqp_reads_them() -> None:
    """links.frames.get_frame gives what pamqp.frame.unmarshal gives, frame by frame, and
    aiormq's AMQPConnectionError when the stream ends inside a frame."""
    props = spec.Basic.Properties(headers={"a": 1})
    frames = [marshal(spec.Basic.Deliver("ctag", 7, False, "fed.x", "k"), 2),
              marshal(ContentHeader(properties=props, body_size=4), 2),
              marshal(ContentBody(b"body"), 2)]

    async def read_all() -> list[Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(frames) + frames[0][:5])
        reader.feed_eof()
        receiver = FrameReceiver(reader)
        got = [await get_frame(receiver) for _ in frames]
        with pytest.raises(AMQPConnectionError):
            await get_frame(receiver)
        return got

    got = asyncio.run(read_all())
    for (size, channel, frame), raw in zip(got, frames, strict=True):
        assert (size, channel) == unmarshal(raw)[:2]
        assert type(frame) is type(unmarshal(raw)[2])
        assert marshal(frame, channel) == raw
    assert got[2][2].value == b"body"
