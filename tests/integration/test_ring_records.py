"""Records bigger than a ring, with real clients (bad input and overload: no record size takes
a process down).

Records between a worker and the supervisor carry a message's headers where the supervisor
needs them (routing, dead-lettering): a publish with 100 KB of headers is a request record of
over 100 KB, and a pull of 128 dead-lettered messages with a few KiB of headers each an event
record of hundreds of KB. On the smallest rings (`--ring-kb 64`) neither could ever be written
whole: the publishing worker failed, and the supervisor stopped with every client of the broker.
The rings now carry such records in fragments (ipc.ring); this checks what a client sees: every
message arrives, headers intact, and the connection carries on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.harness import close_quietly, finish, start_broker, wait_until

SMALL_HEADERS = {f"h{i}": "v" * 100 for i in range(20)}  # ~2.4 KB each
MANY = 300  # several pulls of 128: each a record of ~300 KB
BIG_HEADER = "b" * 100_000  # one message's headers bigger than the whole ring


@pytest.mark.deadline(120)
def test_messages_whose_records_outgrow_the_rings_are_delivered_whole(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "broker", extra_args=["--ring-kb", "64"])
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("dead")
        # Every message expires at once and is dead-lettered: its delivery from "dead" carries
        # its headers (and x-death) in the supervisor's event record.
        channel.queue_declare("doomed", arguments={
            "x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        channel.basic_publish("", "doomed", b"big", pika.BasicProperties(headers={"big": BIG_HEADER}))
        for i in range(MANY):
            channel.basic_publish("", "doomed", str(i).encode(),
                                  pika.BasicProperties(headers={**SMALL_HEADERS, "i": i}))

        got: list[tuple[bytes, dict[str, Any]]] = []

        def on_message(ch: object, method: object, props: pika.BasicProperties, body: bytes) -> None:
            got.append((body, props.headers))

        channel.basic_consume("dead", on_message, auto_ack=True)  # no prefetch: pulls of 128
        wait_until(lambda: connection.process_data_events(0.05) or len(got) >= MANY + 1, 60,
                   f"{MANY + 1} dead-lettered messages")
        assert [body for body, _ in got] == [b"big"] + [str(i).encode() for i in range(MANY)]
        big_headers = got[0][1]
        assert big_headers["big"] == BIG_HEADER
        assert [d["reason"] for d in big_headers["x-death"]] == ["expired"]
        for i, (_, headers) in enumerate(got[1:]):
            assert headers == {**SMALL_HEADERS, "i": i, **_first_death(headers)}
            assert [d["reason"] for d in headers["x-death"]] == ["expired"]
        assert connection.is_open
        assert channel.queue_declare("dead", passive=True).method.message_count == 0
        close_quietly(connection)
    finally:
        finish(broker)


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    """The headers dead-lettering adds (x-death, x-first-death-*), as the message has them."""
    return {k: v for k, v in headers.items() if k.startswith(("x-death", "x-first-death"))}
