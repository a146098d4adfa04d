from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import pytest

from ipc import ring as ring_module
from ipc.ring import HEADER_BYTES, LENGTH_BYTES, Ring, RingCorrupt, RingEmpty, RingFull


def make_ring(capacity: int) -> tuple[bytearray, Ring]:
    buf = bytearray(HEADER_BYTES + capacity)
    return buf, Ring(buf, init=True)


def counters(buf: bytearray) -> tuple[int, int]:
    return struct.unpack_from("<Q", buf, 0)[0], struct.unpack_from("<Q", buf, 64)[0]


def test_records_come_out_in_order_and_intact() -> None:
    """Records are read back in the order written, byte for byte, empty ones included."""
    _, ring = make_ring(256)
    for payload in (b"a", b"", b"hello world", bytes(range(50))):
        ring.put_nowait(payload)
    assert [ring.get_nowait() for _ in range(4)] == [b"a", b"", b"hello world", bytes(range(50))]
    assert ring.is_empty()


def test_head_and_tail_are_on_separate_cache_lines() -> None:
    """The producer's head and the consumer's tail are 64 bytes apart, data after both."""
    buf, ring = make_ring(64)
    ring.put_nowait(b"xyz")
    assert counters(buf) == (LENGTH_BYTES + 3, 0)
    assert buf[HEADER_BYTES : HEADER_BYTES + 7] == struct.pack("<I", 3) + b"xyz"
    ring.get_nowait()
    assert counters(buf) == (7, 7)


def test_used_free_and_capacity_count_length_prefixes() -> None:
    """used() + free() == capacity, each record costing its payload plus 4 bytes."""
    _, ring = make_ring(100)
    assert (ring.capacity, ring.used(), ring.free()) == (100, 0, 100)
    ring.put_nowait(b"12345")
    assert (ring.used(), ring.free()) == (9, 91)


def test_empty_ring_raises_ring_empty() -> None:
    """get_nowait on an empty ring raises RingEmpty; get_all_nowait returns []."""
    _, ring = make_ring(64)
    with pytest.raises(RingEmpty):
        ring.get_nowait()
    assert ring.get_all_nowait() == []
    ring.put_nowait(b"x")
    ring.get_nowait()
    with pytest.raises(RingEmpty):
        ring.get_nowait()


def test_full_ring_raises_ring_full_and_writes_nothing() -> None:
    """A record that does not fit raises RingFull and leaves buffer and head untouched."""
    buf, ring = make_ring(32)
    ring.put_nowait(b"x" * 20)  # 24 of 32 used
    before = bytes(buf)
    with pytest.raises(RingFull):
        ring.put_nowait(b"y" * 5)  # needs 9
    assert bytes(buf) == before
    ring.put_nowait(b"z" * 4)  # exactly 8: fills the ring
    assert ring.free() == 0
    assert ring.get_all_nowait() == [b"x" * 20, b"z" * 4]


def test_put_nowait_takes_a_record_whole_or_raises() -> None:
    """put_nowait writes a record whole: one over capacity - 4 can never fit (ValueError, not
    RingFull); put_many_nowait takes it in fragments."""
    _, ring = make_ring(32)
    ring.put_nowait(b"m" * 28)  # the largest possible, into an empty ring
    ring.get_nowait()
    with pytest.raises(ValueError):
        ring.put_nowait(b"m" * 29)
    assert ring.is_empty()


def _pass_through(capacity: int, sent: list[bytes], batch: int = 5, take: int | None = 3) -> list[bytes]:
    """A producer and a consumer Ring over one buffer exchange ``sent``; returns what came out.
    The consumer never sees part of a record."""
    buf = bytearray(HEADER_BYTES + capacity)
    producer = Ring(memoryview(buf), init=True)
    consumer = Ring(memoryview(buf), init=False)
    got: list[bytes] = []
    pending = list(sent)
    rounds = 0
    while pending or not consumer.is_empty():
        del pending[: producer.put_many_nowait(pending[:batch])]
        got += consumer.get_all_nowait(take)
        assert got == sent[: len(got)]
        rounds += 1
        assert rounds < 100_000, "no progress"
    return got


def test_a_record_bigger_than_the_ring_goes_in_fragments_as_room_frees_up() -> None:
    """A pull of many dead-lettered messages with big headers can be a record bigger than the
    whole ring: put_many_nowait writes it in fragments as the reader makes room, the reader
    hands it over once whole, and the records around it keep their order."""
    big = random.Random(7).randbytes(1000)
    _, ring = make_ring(64)
    assert ring.put_many_nowait([b"before", big, b"after"]) == 1  # some fragments went
    assert ring.get_all_nowait() == [b"before"]  # not the fragments: the record is not whole
    assert _pass_through(64, [b"a", big, b"b", big[::-1], b"c"]) == [b"a", big, b"b", big[::-1], b"c"]


def test_only_records_over_a_quarter_of_the_ring_are_fragmented() -> None:
    """A record of up to a quarter of the capacity is one length prefix, as before; a bigger
    one is fragments of at most that size, the MORE bit set on all but the last."""
    buf, ring = make_ring(256)
    quarter = 256 // 4 - LENGTH_BYTES
    ring.put_many_nowait([b"q" * quarter])
    assert struct.unpack_from("<I", buf, HEADER_BYTES)[0] == quarter
    assert ring.get_all_nowait() == [b"q" * quarter]
    buf, ring = make_ring(256)
    ring.put_many_nowait([b"x" * (quarter + 1)])
    first = struct.unpack_from("<I", buf, HEADER_BYTES)[0]
    second = struct.unpack_from("<I", buf, HEADER_BYTES + LENGTH_BYTES + quarter)[0]
    assert (first, second) == (quarter | ring_module.MORE, 1)
    assert ring.get_all_nowait() == [b"x" * (quarter + 1)]


def test_the_record_being_fragmented_must_come_first() -> None:
    """The next call goes on with the record it left half written; anything else first would
    interleave two records' fragments: a ValueError, nothing written."""
    buf, ring = make_ring(64)
    big = b"b" * 200
    assert ring.put_many_nowait([big]) == 0
    before = bytes(buf)
    with pytest.raises(ValueError):
        ring.put_many_nowait([b"other", big])
    with pytest.raises(ValueError):
        ring.put_nowait(b"other")
    assert bytes(buf) == before
    reader = Ring(buf, init=False)
    got: list[bytes] = []
    while not got:
        got = reader.get_all_nowait()
        ring.put_many_nowait([big])
    assert got == [big]


def test_max_records_and_get_nowait_count_whole_records() -> None:
    """Fragments do not count as records: get_all_nowait(1) and get_nowait give the next
    whole one; what is read of an unfinished one waits, even across calls."""
    buf, ring = make_ring(256)
    big = bytes(range(256)) * 2
    ring.put_many_nowait([b"one", big])  # big: only partly in
    reader = Ring(buf, init=False)
    assert reader.get_all_nowait(1) == [b"one"]
    assert reader.get_all_nowait() == []
    with pytest.raises(RingEmpty):
        reader.get_nowait()
    while ring.put_many_nowait([big, b"two"]) < 2:
        assert reader.get_all_nowait(1) in ([], [big])
    assert reader.get_nowait() in (big, b"two")


def test_reset_forgets_a_record_half_written_or_half_read() -> None:
    """A replaced peer starts afresh: reset drops the producer's place in a fragmented record
    and the fragments the consumer holds."""
    buf = bytearray(HEADER_BYTES + 64)
    producer = Ring(memoryview(buf), init=True)
    consumer = Ring(memoryview(buf), init=False)
    producer.put_many_nowait([b"z" * 300])
    assert consumer.get_all_nowait() == []
    producer.reset()
    consumer.reset()
    assert producer.put_many_nowait([b"fresh"]) == 1
    assert consumer.get_all_nowait() == [b"fresh"]


def test_records_straddling_the_end_wrap_around() -> None:
    """A record crossing the end of the data area is split in two copies and read
    back intact, wherever the split falls (in its length prefix or its payload)."""
    capacity = 32
    payload = bytes(range(100, 120))  # 24 bytes with its prefix
    for start in range(capacity):
        buf, ring = make_ring(capacity)
        struct.pack_into("<QQ", buf, 0, start, 0)  # head = start ...
        struct.pack_into("<Q", buf, 64, start)  # ... = tail: empty, positioned
        ring.put_nowait(payload)
        record = struct.pack("<I", len(payload)) + payload
        spill = start + len(record) - capacity
        data = buf[HEADER_BYTES:]
        if spill > 0:
            assert data[start:] + data[:spill] == record
        else:
            assert data[start : start + len(record)] == record
        assert ring.get_nowait() == payload
        assert ring.is_empty()


def test_put_many_writes_the_prefix_that_fits() -> None:
    """put_many_nowait writes, in order, the leading records that fit and returns
    how many; the rest are left for the caller to retry."""
    buf, ring = make_ring(40)
    batch = [b"a" * 6, b"b" * 6, b"c" * 6, b"d" * 6]  # 10 bytes each: 4 fit in 40
    assert ring.put_many_nowait([*batch, b"e"]) == 4
    assert counters(buf) == (40, 0)
    assert ring.get_all_nowait() == batch
    assert ring.put_many_nowait([b"e", b"f" * 36]) == 1
    assert ring.put_many_nowait([]) == 0
    assert ring.get_all_nowait() == [b"e"]


def test_put_many_does_not_publish_partial_batch_midway() -> None:
    """While a batch is being copied the published head does not move."""
    buf = bytearray(HEADER_BYTES + 64)
    ring = Ring(buf, init=True)
    heads: list[int] = []

    class Watching(list[bytes]):
        def __iter__(self) -> Iterator[bytes]:
            for item in super().__iter__():
                heads.append(counters(buf)[0])
                yield item

    written = ring.put_many_nowait(Watching([b"1", b"22", b"333"]))
    assert written == 3
    assert set(heads) == {0}
    assert counters(buf)[0] == 5 + 6 + 7


def test_get_all_drains_in_order_and_respects_max_records() -> None:
    """get_all_nowait returns records oldest first, at most max_records, tail stored once."""
    buf, ring = make_ring(128)
    ring.put_many_nowait([b"1", b"2", b"3", b"4", b"5"])
    assert ring.get_all_nowait(2) == [b"1", b"2"]
    assert counters(buf)[1] == 10
    assert ring.get_all_nowait(0) == []
    assert ring.get_all_nowait() == [b"3", b"4", b"5"]
    assert ring.is_empty()


def test_batches_wrap_around() -> None:
    """Batches that straddle the end of the data area come back intact and in order."""
    _, ring = make_ring(50)
    sent: list[bytes] = []
    got: list[bytes] = []
    for i in range(200):
        batch = [bytes([i % 256]) * (i % 7) for _ in range(3)]
        assert ring.put_many_nowait(batch) == 3
        sent += batch
        got += ring.get_all_nowait()
    assert got == sent


def test_get_all_reads_records_across_its_copy_chunks_and_bigger_than_one() -> None:
    """get_all_nowait copies the ring out a chunk at a time: records cut by a chunk's end, records
    bigger than a chunk and batches straddling the end of the data area come back intact."""
    chunk = ring_module._READ_CHUNK
    _, ring = make_ring(5 * chunk + 13)
    rng = random.Random(7)
    sent: list[bytes] = []
    got: list[bytes] = []
    outbox: list[bytes] = []  # what did not fit yet is offered again first, as the users do
    for i in range(330):
        if i < 300:
            outbox += [rng.randbytes(rng.choice((0, 1, 9, chunk - 4, chunk, chunk + 1, 2 * chunk + 3,
                                                 rng.randrange(3 * chunk))))
                       for _ in range(rng.randrange(1, 4))]
        written = ring.put_many_nowait(outbox)
        sent += outbox[:written]
        del outbox[:written]
        got += ring.get_all_nowait(rng.choice((None, 1, 2, 1024)))
    got += ring.get_all_nowait()
    assert not outbox and ring.is_empty()
    assert got == sent


def test_corrupt_counters_are_detected_by_get_all() -> None:
    """get_all_nowait raises RingCorrupt, storing no tail, for a length prefix past the bytes in
    use, a head further than the capacity from the tail, and a few bytes too short for a prefix."""
    buf, ring = make_ring(64)
    ring.put_many_nowait([b"ab", b"abcd"])
    struct.pack_into("<I", buf, HEADER_BYTES + LENGTH_BYTES + 2, 1000)
    with pytest.raises(RingCorrupt):
        ring.get_all_nowait()
    assert counters(buf)[1] == 0
    buf, ring = make_ring(64)
    struct.pack_into("<Q", buf, 0, 65)  # head 65, tail 0: more in use than the ring holds
    with pytest.raises(RingCorrupt):
        ring.get_all_nowait()
    buf, ring = make_ring(64)
    ring.put_nowait(b"ab")
    struct.pack_into("<Q", buf, 0, LENGTH_BYTES + 2 + 3)  # 3 stray bytes after the record
    with pytest.raises(RingCorrupt):
        ring.get_all_nowait()
    assert counters(buf)[1] == 0


def test_reset_forgets_every_record() -> None:
    """reset() sets head = tail = 0: the ring is empty with full capacity free."""
    buf, ring = make_ring(64)
    ring.put_many_nowait([b"abc", b"def"])
    ring.get_nowait()
    ring.reset()
    assert counters(buf) == (0, 0)
    assert ring.is_empty() and ring.free() == 64
    ring.put_nowait(b"new")
    assert ring.get_all_nowait() == [b"new"]


def test_attach_does_not_reset_and_init_does() -> None:
    """init=False attaches to the records already there; init=True zeroes the header."""
    buf, ring = make_ring(64)
    ring.put_nowait(b"kept")
    assert Ring(buf, init=False).get_nowait() == b"kept"
    ring.put_nowait(b"lost")
    Ring(buf, init=True)
    assert ring.is_empty()


def test_producer_and_consumer_are_separate_objects_over_one_buffer() -> None:
    """A producer Ring and a consumer Ring over the same bytes (as in two processes)
    exchange records through the buffer alone, across many laps."""
    buf = bytearray(HEADER_BYTES + 97)
    producer = Ring(memoryview(buf), init=True)
    consumer = Ring(memoryview(buf), init=False)
    sent = [bytes([n % 251]) * (n % 40) for n in range(500)]
    got: list[bytes] = []
    pending = list(sent)
    while pending or not consumer.is_empty():
        del pending[: producer.put_many_nowait(pending[:5])]
        got += consumer.get_all_nowait(3)
    assert got == sent
    assert producer.free() == producer.capacity


def test_records_of_every_size_pass_through_in_order_across_many_laps() -> None:
    """Small records and records up to three times the ring, mixed, through separate producer
    and consumer objects: all come out whole and in order."""
    rng = random.Random(11)
    sent = [rng.randbytes(rng.choice([0, 3, 20, 24, 25, 60, 97, 150, 300])) for _ in range(400)]
    assert _pass_through(97, sent) == sent
    assert _pass_through(97, sent, batch=1, take=None) == sent


def test_corrupt_length_prefix_is_detected() -> None:
    """A length prefix claiming more bytes than were published raises RingCorrupt."""
    buf, ring = make_ring(64)
    ring.put_nowait(b"abcd")
    struct.pack_into("<I", buf, HEADER_BYTES, 1000)
    with pytest.raises(RingCorrupt):
        ring.get_nowait()


def test_readonly_or_tiny_buffers_are_rejected() -> None:
    """A ring needs a writable buffer with room for a header and a record."""
    with pytest.raises(ValueError):
        Ring(memoryview(bytes(512)), init=False)
    with pytest.raises(ValueError):
        Ring(bytearray(HEADER_BYTES + LENGTH_BYTES), init=True)
