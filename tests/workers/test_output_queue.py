"""What queued output costs (``OutputQueue.cost``, issue 38): a client that pipelines small
methods and never reads its socket has each reply queued; past COALESCE_AT parts the small
ones are copied onto one bytearray, and every part counts its octets plus PART_COST, which is
what the runtime bounds (``ConnectionHandler.reading_stop``)."""

from __future__ import annotations

from pamqp import commands, frame

from workers.output_queue import COALESCE_AT, PART_COST, SMALL_PART, OutputQueue

QOS_OK = frame.marshal(commands.Basic.QosOk(), 1)


def test_few_parts_are_kept_as_they_are() -> None:
    queue = OutputQueue()
    parts = [QOS_OK] * (COALESCE_AT - 1)
    for part in parts:
        queue.append(part)
    assert queue.parts == parts and all(p is QOS_OK for p in queue.parts)
    assert queue.unsent_bytes == len(QOS_OK) * len(parts)
    assert queue.cost == (len(QOS_OK) + PART_COST) * len(parts)


def test_small_parts_past_coalesce_at_share_one_bytearray() -> None:
    queue = OutputQueue()
    n = 10_000
    for _ in range(n):
        queue.append(QOS_OK)
    assert len(queue.parts) == COALESCE_AT + 1
    assert type(queue.parts[-1]) is bytearray
    assert queue.unsent_bytes == n * len(QOS_OK)
    assert queue.cost == n * len(QOS_OK) + (COALESCE_AT + 1) * PART_COST
    assert queue.take_bytes() == QOS_OK * n
    assert queue.parts == [] and queue.unsent_bytes == 0 and queue.cost == 0


def test_a_big_part_is_not_copied_and_the_next_small_one_starts_a_new_tail() -> None:
    queue = OutputQueue()
    for _ in range(COALESCE_AT + 3):
        queue.append(QOS_OK)
    big = b"x" * (SMALL_PART + 1)
    queue.append(big)
    assert queue.parts[-1] is big
    queue.append(QOS_OK)
    queue.append(QOS_OK)
    assert len(queue.parts) == COALESCE_AT + 3 and queue.parts[-1] == QOS_OK * 2
    assert queue.take_bytes() == QOS_OK * (COALESCE_AT + 3) + big + QOS_OK * 2


def test_a_taken_tail_is_never_written_again() -> None:
    queue = OutputQueue()
    for _ in range(COALESCE_AT + 2):
        queue.append(QOS_OK)
    parts = queue.take_parts()  # one bytes, joined
    assert parts == [QOS_OK * (COALESCE_AT + 2)]
    queue._big = True  # parts handed over as they are (a big body queued)
    for _ in range(COALESCE_AT + 2):
        queue.append(QOS_OK)
    taken = queue.take_parts()
    tail = taken[-1]
    assert type(tail) is bytearray and bytes(tail) == QOS_OK * 2
    for _ in range(COALESCE_AT + 2):
        queue.append(b"y" * len(QOS_OK))
    assert bytes(tail) == QOS_OK * 2  # the writer's part is left alone
