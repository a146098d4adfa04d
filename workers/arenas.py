"""Every worker's body arena as one worker sees it: its own region, the others attached on
first use (a delivery may name a body another worker's publisher stored).

Channels hold this object (``workers.channel_config.ChannelResources``) to turn a delivery's
handle into the content header and body they hand the connection, zero-copy, and to free
their own worker's blocks; the worker uses it for every region's published counters.
"""

from __future__ import annotations

from ipc import records as r
from ipc.region import Region
from workers import codec


class Arenas:
    """The regions of every worker of the broker, this worker's own already mapped."""

    def __init__(self, own: Region, index: int, names: list[str]) -> None:
        self.own = own
        self._names = names
        self._regions: list[Region | None] = [None] * len(names)
        self._regions[index] = own

    def __len__(self) -> int:
        return len(self._regions)

    def region(self, index: int) -> Region:
        region = self._regions[index]
        if region is None:  # another worker's arena: attach on first use
            region = self._regions[index] = Region.attach(self._names[index])
        return region

    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview]:
        """The content header payload and body of a delivery (zero-copy unless
        the supervisor asked for new headers)."""
        view = self.region(d.region).arena.view(d.offset, d.header_len + d.body_len)
        header = view[: d.header_len]
        if d.reheader:  # dead-lettered / delivery-counted: new headers, same body
            return memoryview(codec.reheader(header, d.headers, d.expiration)), view[d.header_len :]
        return header, view[d.header_len :]

    def own_body(self, offset: int, header_len: int, body_len: int) -> tuple[memoryview, memoryview]:
        """A block of this worker's arena: a publish's header and body."""
        view = self.own.arena.view(offset, header_len + body_len)
        return view[:header_len], view[header_len:]

    def free(self, offset: int) -> None:
        """Free a block of this worker's arena (a publish that will never be sent)."""
        self.own.arena.free(offset)
