"""A worker's CPU per delivery on the consumer's side, in process, without sockets or a supervisor.

    .venv/bin/python -m perf.consumer_path                     # 20,000 rounds of 5, 3 times
    .venv/bin/python -m perf.consumer_path --batch 1 --rounds 5
    SHOAL_PURE_PYTHON=1 .venv/bin/python -m perf.consumer_path # the sources, not the extensions

What a consumer acking each message costs the worker that serves it, step by step, on a real
``workers.worker.Worker`` over a real region (shared memory, removed at the end): one consumer
on channel 1 with prefetch 10; each round the supervisor's ``Pulled`` with ``--batch``
deliveries of 128-byte bodies goes on the event ring, the worker applies it
(``handle_events``: the ring, the record, the deliver frames), the output is taken as the socket
would take it, the client's ``--batch`` acks (one read, each ``multiple=false``) are parsed
(``AMQPConnection.receive_data``) and applied (``ConnectionHandler.handle``), and the requests
go to the request ring (``flush_requests``). Each step's ``process_time`` is summed; the figures
are µs per delivery, the median of ``--repeat`` runs.

In a running broker the same delivery also costs its system calls (a ``send`` and a ``recv``
shared by the deliveries and acks of one read), trio's wake-ups and cold caches: S3 with each
message acked spends ~2.5 times these figures per delivery in the consuming worker. What this
measures is the Python on the path, without the host's noise: a change to the codec, the frame
buffer or the channel shows here at once. Figures to read, never assertions.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time

from pamqp import commands, frame, header

from ipc import records as r
from ipc.compiled import describe
from ipc.region import Region
from ipc.wakeup import EventFd
from ipc.worker_config import WorkerConfig
from workers.connection import AMQPConnection
from workers.connection_handler import ConnectionHandler
from workers.server import server_properties
from workers.worker import Worker

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
BODY = b"x" * 128
STEPS = ("deliver", "take output", "parse acks", "apply acks", "flush requests")


class _Consumer:
    """A worker with one open connection, channel 1, prefetch 10 and consumer c1."""

    def __init__(self) -> None:
        self.name = f"/shoalperf.{os.getpid()}-{secrets.token_hex(4)}.w0"
        self.region = Region.create(self.name, ring_bytes=1 << 20, slots=64, arena_bytes=1 << 22)
        self.request, self.event = EventFd(), EventFd()
        config = WorkerConfig(
            index=0, instance=f"{os.getpid()}-00", regions=[self.name], listen_fd=-1,
            request_fd=self.request.fileno(), event_fd=self.event.fileno(), alive_fd=-1)
        self.worker = Worker(config, self.region)
        self.proto = AMQPConnection(server_properties=server_properties(0))
        self.handler = ConnectionHandler(self.worker, 1, self.proto)
        self.worker.handlers[1] = self.handler
        self._feed(PROTOCOL_HEADER)
        self._client(0, commands.Connection.StartOk({"product": "perf"}, "PLAIN", "\0guest\0guest"))
        self._client(0, commands.Connection.TuneOk(2047, 131072, 60))
        self._client(0, commands.Connection.Open("/"))
        self._client(1, commands.Channel.Open())
        self._client(1, commands.Basic.Qos(prefetch_count=10))
        self._supervisor(r.Reply(1, 1, "qos"))
        self._client(1, commands.Basic.Consume(queue="q", consumer_tag="c1"))
        self._supervisor(r.Reply(1, 1, "consume"))
        self.handler.take_parts()
        self.handler.written()
        self.worker.flush_requests()
        self.region.request_ring.get_all_nowait()
        self.target = self.handler.channels[1].consumers["c1"].id
        self.head = header.ContentHeader(0, len(BODY), commands.Basic.Properties()).marshal()

    def _feed(self, data: bytes) -> None:
        for event in self.proto.receive_data(data):
            self.handler.handle(event)

    def _client(self, channel: int, method: commands.Frame) -> None:
        self._feed(frame.marshal(method, channel))

    def _supervisor(self, event: r.Event) -> None:
        self.region.event_ring.put_nowait(self.worker.codec.encode(event))
        self.worker.handle_events()

    def run(self, rounds: int, batch: int) -> dict[str, float]:
        """µs per delivery of each step over ``rounds`` rounds of ``batch`` deliveries."""
        clock = time.process_time
        spent = dict.fromkeys(STEPS, 0.0)
        arena, worker, handler, proto = self.region.arena, self.worker, self.handler, self.proto
        size = len(self.head) + len(BODY)
        entry = tag = 0
        for _ in range(rounds):
            deliveries, offsets = [], []
            for _ in range(batch):
                entry += 1
                offset = arena.alloc(size)
                assert offset is not None
                arena.view(offset, size)[:] = self.head + BODY
                offsets.append(offset)
                deliveries.append(r.Delivery(entry, False, "", "q", 0, offset, len(self.head), len(BODY)))
            pulled = worker.codec.encode(r.Pulled(self.target, deliveries, False, batch))
            acks = b"".join(frame.marshal(commands.Basic.Ack(n), 1) for n in range(tag + 1, tag + batch + 1))
            tag += batch
            self.region.event_ring.put_nowait(pulled)
            t0 = clock()
            worker.handle_events()
            t1 = clock()
            handler.take_parts()
            handler.written()
            t2 = clock()
            events = proto.receive_data(acks)
            t3 = clock()
            for event in events:
                handler.handle(event)
            t4 = clock()
            worker.flush_requests()
            t5 = clock()
            records = self.region.request_ring.get_all_nowait()
            assert records, "the acks sent no Settle"
            for offset in offsets:  # as the supervisor does on the settles
                arena.free(offset)
            for step, took in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                spent[step] += took
        return {step: 1e6 * total / (rounds * batch) for step, total in spent.items()}

    def close(self) -> None:
        self.worker.close()
        self.region.close()
        self.region.unlink()
        self.request.close()
        self.event.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20_000, help="rounds per run (default 20,000)")
    parser.add_argument("--batch", type=int, default=5, help="deliveries (and acks) per round (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is printed (default 3)")
    args = parser.parse_args(argv)
    runs = []
    for _ in range(args.repeat):
        consumer = _Consumer()
        try:
            runs.append(consumer.run(args.rounds, args.batch))
        finally:
            consumer.close()
    median = {step: statistics.median(run[step] for run in runs) for step in STEPS}
    compiled = describe()
    print(f"consumer side, µs per delivery (median of {args.repeat}; {args.rounds:,} rounds of "
          f"{args.batch}; {compiled}):")
    for step in STEPS:
        print(f"  {step:<16} {median[step]:6.2f}")
    print(f"  {'all':<16} {sum(median.values()):6.2f}")


if __name__ == "__main__":
    main()
