"""Soak: a producer process and a consumer process hammer one ring for a while.

Run with ``pytest -m soak tests/ipc/test_ring_soak.py``; not part of ``make test``.
It is what caught counters being written with ``struct.pack_into``, whose
memset let the consumer read a transient head of 0 once in millions of reads.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import secrets
import struct
import time

import pytest

from ipc.region import Region, region_name

SECONDS = 20.0


def _produce(name: str, seconds: float, counts: mp.Queue) -> None:
    region = Region.attach(name)
    ring, rnd, seq, pending = region.request_ring, random.Random(7), 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(rnd.randint(1, 60)):
            size = rnd.choice((12, 19, 40, 90, 300, 1500))
            pending.append(struct.pack("<Q", seq) + bytes([seq % 251]) * size)
            seq += 1
        del pending[: ring.put_many_nowait(pending)]
    while pending:
        del pending[: ring.put_many_nowait(pending)]
    counts.put(seq)
    region.close()


@pytest.mark.soak
def test_two_processes_exchange_millions_of_records_intact() -> None:
    """Every record arrives once, in order, intact, and the consumer never sees
    the counters disagree, through a small ring that wraps constantly."""
    name = region_name(f"{os.getpid()}-{secrets.token_hex(4)}", 0)
    region = Region.create(name, ring_bytes=64 << 10, arena_bytes=1 << 20)
    ctx = mp.get_context("spawn")
    counts: mp.Queue = ctx.Queue()
    producer = ctx.Process(target=_produce, args=(name, SECONDS, counts))
    try:
        producer.start()
        ring, expected = region.request_ring, 0
        deadline = time.monotonic() + SECONDS + 30
        while (producer.is_alive() or not ring.is_empty()) and time.monotonic() < deadline:
            for record in ring.get_all_nowait(1000):
                seq = struct.unpack_from("<Q", record)[0]
                assert seq == expected
                assert record[8:] == bytes([seq % 251]) * (len(record) - 8)
                expected += 1
        producer.join(10)
        assert expected == counts.get(timeout=10) > 0
    finally:
        if producer.is_alive():
            producer.kill()
        region.close()
        region.unlink()
