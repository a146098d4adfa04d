"""`AsyncDriver`: pika's asynchronous adapters (SelectConnection, AsyncioConnection) driven from a
test. It runs the adapter's own ioloop until a condition holds (bounded) and fails the test if a
channel or the connection is closed under it (test_compat_pika_async.py, test_flow_control.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.select_connection import IOLoop

from tests.integration.harness import Broker


class AsyncDriver:
    """One ioloop (pika's IOLoop or an asyncio loop) and the async connections on it."""

    def __init__(self, broker: Broker, adapter: str):
        self.broker = broker
        self.adapter = adapter
        self.loop: Any = IOLoop() if adapter == "select" else asyncio.new_event_loop()
        self.connections: list[pika.connection.Connection] = []
        self.failures: list[str] = []  # unexpected closes seen by callbacks

    # ---- the loop

    def run_until(self, predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
        limit = time.monotonic() + timeout
        state = {"timed_out": False}

        def check() -> None:
            if predicate() or self.failures:
                self.loop.stop()
            elif time.monotonic() > limit:
                state["timed_out"] = True
                self.loop.stop()
            else:
                self.loop.call_later(0.01, check)

        self.loop.call_later(0, check)
        if self.adapter == "select":
            self.loop.start()
        else:
            self.loop.run_forever()
        assert not self.failures, f"while waiting for {what or predicate}: {self.failures}"
        assert not state["timed_out"], f"timed out after {timeout:g} s waiting for {what or predicate}"

    def pump(self, seconds: float) -> None:
        """Run the loop for an observation window."""
        limit = time.monotonic() + seconds
        self.run_until(lambda: time.monotonic() >= limit, seconds + 5, "an observation window")

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call an async pika method with `callback=` and wait for the reply frame."""
        replies: list[Any] = []
        method(*args, callback=replies.append, **kwargs)
        self.run_until(lambda: replies, what=getattr(method, "__name__", "a reply"))
        return replies[0]

    # ---- connections and channels

    def parameters(self, **overrides: Any) -> pika.ConnectionParameters:
        return self.broker.connection_parameters(**overrides)

    def connect(self, on_close: Callable[[Any, Exception], None] | None = None,
                **overrides: Any) -> pika.connection.Connection:
        opened: list[Any] = []

        def open_error(connection: Any, error: Exception) -> None:
            self.failures.append(f"connection failed to open: {error!r}")

        def closed(connection: Any, reason: Exception) -> None:
            if on_close is not None:
                on_close(connection, reason)
            elif not isinstance(reason, pika.exceptions.ConnectionClosedByClient):
                self.failures.append(f"connection closed: {reason!r}")

        cls = pika.SelectConnection if self.adapter == "select" else AsyncioConnection
        connection = cls(
            self.parameters(**overrides),
            on_open_callback=opened.append,
            on_open_error_callback=open_error,
            on_close_callback=closed,
            custom_ioloop=self.loop,
        )
        self.connections.append(connection)
        self.run_until(lambda: opened, what="connection.open-ok")
        return connection

    def channel(self, connection: Any, expect_close: bool = False) -> Any:
        opened: list[Any] = []
        channel = connection.channel(on_open_callback=opened.append)
        if not expect_close:
            channel.add_on_close_callback(self._channel_closed)
        self.run_until(lambda: opened, what="channel.open-ok")
        return channel

    def _channel_closed(self, channel: Any, reason: Exception) -> None:
        if not isinstance(reason, pika.exceptions.ChannelClosedByClient):
            self.failures.append(f"channel {channel.channel_number} closed: {reason!r}")

    def close(self) -> None:
        for connection in self.connections:
            if connection.is_open:
                connection.close()
        open_ones = [c for c in self.connections if not c.is_closed]
        if open_ones:
            self.failures.clear()
            try:
                self.run_until(lambda: all(c.is_closed for c in open_ones), 5.0, "connections to close")
            except AssertionError:
                pass
        self.loop.close()
