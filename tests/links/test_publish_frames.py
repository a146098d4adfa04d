"""links.shovel's hand-made basic.publish frames are the bytes pamqp would marshal."""

from __future__ import annotations

import pytest
from links.shovel import encode_publish
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.frame import marshal
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
