"""Liveness: heartbeats sent and expected, handshake and close timeouts, the pause rule."""

from __future__ import annotations

from workers.liveness import Liveness

RUNNING = {"running": True, "monitored": True, "closing": False}


def running(heartbeat: int) -> Liveness:
    liveness = Liveness(handshake_timeout=10)
    liveness.heartbeat = heartbeat
    assert liveness.tick(0, None, **RUNNING) is None
    return liveness


def test_silence_for_two_heartbeats_is_death() -> None:
    """The client is dead after 2 x heartbeat seconds in which nothing was received."""
    liveness = running(5)
    assert liveness.tick(9, None, **RUNNING) is None
    assert liveness.tick(10, None, **RUNNING) == "missed heartbeats from client, timeout: 5s"


def test_any_received_byte_counts() -> None:
    """Any received byte resets the clock, not only heartbeat frames."""
    liveness = running(5)
    liveness.bytes_received += 1
    assert liveness.tick(9, None, **RUNNING) is None
    assert liveness.tick(18, None, **RUNNING) is None
    assert liveness.tick(19, None, **RUNNING) is not None


def test_paused_reading_is_not_missed_heartbeats() -> None:
    """While the runtime does not read the socket, the client's silence is ours."""
    liveness = running(5)
    liveness.reading_paused = True
    assert liveness.tick(30, None, **RUNNING) is None


def test_a_heartbeat_is_due_after_half_the_interval_of_our_silence() -> None:
    """A heartbeat goes out when nothing was sent for heartbeat/2 seconds."""
    liveness = running(10)
    assert not liveness.heartbeat_due(4, monitored=True)
    assert liveness.heartbeat_due(5, monitored=True)
    liveness.heartbeat_queued(5, unsent_bytes=8)
    assert not liveness.heartbeat_due(9, monitored=True)
    assert not running(0).heartbeat_due(100, monitored=True)


def test_handshake_and_close_timeouts() -> None:
    """A handshake may take handshake_timeout; a close waits for the heartbeat, at most 30 s."""
    handshake = Liveness(handshake_timeout=10)
    assert handshake.tick(0, None, running=False, monitored=False, closing=False) is None
    assert handshake.tick(10, None, running=False, monitored=False, closing=False) == (
        "handshake timeout")
    closing = running(60)
    assert closing.tick(1, None, running=False, monitored=False, closing=True) is None
    assert closing.tick(31, None, running=False, monitored=False, closing=True) == (
        "timed out waiting for connection.close-ok")
