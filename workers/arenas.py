"""Every worker's body arena as one worker sees it: its own region, the others attached on
first use (a delivery may name a body another worker's publisher stored).

Channels hold this object (``workers.channel_config.ChannelResources``) to turn a delivery's
handle into the content header and body they hand the connection, zero-copy, and to free
their own worker's blocks; the worker uses it for every region's published counters.

A message the supervisor paged out of its arena (``broker.storage.paging``) is read back from the body
log it is in (``Delivery.stored``: any worker's segment files under the
data directory), checksum checked. The files opened for a batch of deliveries are closed after
it (``close_files``), so a segment the supervisor removes is not held open.
"""

from __future__ import annotations

import logging
import os

from ipc import records as r
from ipc.logfile import BodyReader
from ipc.region import Region
from workers import codec

log = logging.getLogger("shoal.worker")


class Arenas:
    """The regions of every worker of the broker, this worker's own already mapped."""

    def __init__(self, own: Region, index: int, names: list[str],
                 data_dir: str | os.PathLike[str] | None = None) -> None:
        self.own = own
        self._names = names
        self._regions: list[Region | None] = [None] * len(names)
        self._regions[index] = own
        self._reader = BodyReader(data_dir) if data_dir else None  # paged-out bodies

    def __len__(self) -> int:
        return len(self._regions)

    def region(self, index: int) -> Region:
        region = self._regions[index]
        if region is None:  # another worker's arena: attach on first use
            region = self._regions[index] = Region.attach(self._names[index])
        return region

    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview] | None:
        """The content header payload and body of a delivery (zero-copy unless the supervisor
        asked for new headers or paged the body out); None: a paged-out body that cannot be
        read back (missing or damaged on disk; logged)."""
        if d.stored is not None:
            read = self._reader.read(*d.stored) if self._reader is not None else None
            if read is None:
                log.error("a paged-out message body cannot be read back from the body log "
                          "(worker %d, segment %d, offset %d): the message is lost", *d.stored[:3])
                return None
            header, body = memoryview(read[0]), memoryview(read[1])
        else:
            view = self.region(d.region).arena.view(d.offset, d.header_len + d.body_len)
            header, body = view[: d.header_len], view[d.header_len :]
        if d.reheader:  # dead-lettered / delivery-counted: new headers, same body
            return memoryview(codec.reheader(header, d.headers, d.expiration)), body
        return header, body

    def close_files(self) -> None:
        """Close the body log segments opened to read paged-out bodies."""
        if self._reader is not None:
            self._reader.close()

    def own_body(self, offset: int, header_len: int, body_len: int) -> tuple[memoryview, memoryview]:
        """A block of this worker's arena: a publish's header and body."""
        view = self.own.arena.view(offset, header_len + body_len)
        return view[:header_len], view[header_len:]

    def free(self, offset: int) -> None:
        """Free a block of this worker's arena (a publish that will never be sent)."""
        self.own.arena.free(offset)
