"""One dynamic shovel: consume from the source, publish to the destination, ack at the source.

Theory of operation
-------------------
A shovel is a loop of sessions. Each session connects to one of the source URIs and one of the
destination URIs (chosen at random, as RabbitMQ does), declares what the value names (a
``src-queue`` and a ``dest-queue`` durable, as RabbitMQ's shovel does, with ``src-queue-args``
and ``dest-queue-args``; a ``src-exchange`` gets
an exclusive server-named queue bound with ``src-exchange-key``), sets ``basic.qos`` to
``src-prefetch-count`` and consumes. Each delivery is published to the destination in the order
it came, and its source ack depends on ``ack-mode``:

* ``on-confirm`` (the default): the destination channel is in confirm mode; a delivery is acked
  at the source once the destination has confirmed it and every delivery before it (one
  ``basic.ack multiple`` for all that are ready in one turn of the loop). A kill of either broker
  or a broken link loses nothing: what was not acked comes back to the source queue and is sent
  again by the next session (so a message may arrive twice: redelivered ones are counted in
  ``possible_duplicates``);
* ``on-publish``: acked once the publish is written to the destination's socket;
* ``no-ack``: consumed with no_ack (fastest; a failure loses what was in flight).

Any failure (a connection refused or lost, a channel closed by either broker) ends the session:
the shovel reports ``terminated`` with the reason, waits ``reconnect-delay`` seconds and starts
again (``starting``, then ``running``). Each change of state is logged.

``src-delete-after``: ``queue-length`` takes the source queue's length when the first session
declares it; a number is a count. After that many messages the shovel stops consuming, waits for
the last confirms, and asks the broker to clear its parameter (control command
``clear_parameter``), as RabbitMQ deletes such a shovel.

The destination gets each message's body and properties, with ``dest-publish-properties``
written over them and, when asked, RabbitMQ's ``x-shovelled`` and ``x-shovelled-timestamp``
headers. Messages are published as they came (no ``message_id`` added where there was none).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiormq
from aiormq.abc import ChannelFrame, DeliveredMessage
from pamqp.frame import marshal as frame_marshal
from pamqp.header import ContentHeader

from broker.parameters import ParsedURI, ShovelSettings, parse_uri, shovel_settings

log = logging.getLogger("shoal.shovel")

CONNECT_TIMEOUT = 15.0
FRAME_BUFFER = 4096  # frames queued per channel (a delivery is three: method, header, body)


class Finished(Exception):
    """src-delete-after reached: the shovel is done."""


class LinkLost(Exception):
    """A connection or channel of the session closed."""


def amqp_url(uri: ParsedURI, local: tuple[str, int]) -> str:
    host, port = (uri.host, uri.port) if not uri.local else local
    if ":" in host:
        host = f"[{host}]"
    return (f"{uri.scheme}://{quote(uri.user, safe='')}:{quote(uri.password, safe='')}@{host}:"
            f"{port}/{quote(uri.vhost, safe='')}")


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, (ConnectionError, OSError)) and not str(exc):
        text = type(exc).__name__
    return text.replace("\n", " ")


class Shovel:
    """One shovel parameter, running (module text). ``report`` gets each status row."""

    def __init__(self, vhost: str, name: str, value: dict[str, Any], local: tuple[str, int],
                 report: Callable[[dict[str, Any]], None],
                 finished: Callable[[str, str], Awaitable[None]]) -> None:
        self.vhost, self.name, self.value = vhost, name, value
        self.settings: ShovelSettings = shovel_settings(value)
        self.local = local
        self._report = report
        self._finished = finished
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()
        self.src_uri = self.dest_uri = ""
        self.forwarded = 0  # acked at the source (or published, with no-ack)
        self.redelivered = 0  # of those, delivered before: maybe at the destination twice
        self.remaining: int | None = None  # src-delete-after, counted down
        self._reported = (-1, -1)

    # ----------------------------------------------------------------- status

    def row(self) -> dict[str, Any]:
        s = self.settings
        row: dict[str, Any] = {
            "vhost": self.vhost, "name": self.name, "type": "dynamic", "state": self.state,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
            "src_protocol": "amqp091", "dest_protocol": "amqp091",
            "messages_forwarded": self.forwarded, "possible_duplicates": self.redelivered}
        if self.src_uri:
            row["src_uri"] = self.src_uri
        if self.dest_uri:
            row["dest_uri"] = self.dest_uri
        if s.src_queue is not None:
            row["src_queue"] = s.src_queue
        else:
            row["src_exchange"], row["src_exchange_key"] = s.src_exchange, s.src_exchange_key
        if s.dest_queue is not None:
            row["dest_queue"] = s.dest_queue
        elif s.dest_exchange is not None:
            row["dest_exchange"] = s.dest_exchange
            if s.dest_exchange_key is not None:
                row["dest_exchange_key"] = s.dest_exchange_key
        if self.state == "running":
            row["blocked_status"] = "running"
        if self.reason is not None:
            row["reason"] = self.reason
        return row

    def _set(self, state: str, reason: str | None = None) -> None:
        if state != self.state or reason != self.reason:
            self.state, self.reason, self.since = state, reason, time.time()
            if state == "terminated":
                log.warning("shovel '%s' in vhost '%s': terminated: %s", self.name, self.vhost,
                            reason)
            else:
                log.info("shovel '%s' in vhost '%s': %s", self.name, self.vhost, state)
        self.report()

    def report(self) -> None:
        self._reported = (self.forwarded, self.redelivered)
        self._report(self.row())

    def report_if_changed(self) -> None:
        if (self.forwarded, self.redelivered) != self._reported:
            self.report()

    # ----------------------------------------------------------------- the loop

    async def run(self) -> None:
        while True:
            self._set("starting")
            try:
                await self._session()
            except Finished:
                log.info("shovel '%s' in vhost '%s': src-delete-after reached after %d "
                         "message(s); deleting it", self.name, self.vhost, self.forwarded)
                await self._finished(self.vhost, self.name)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure: report, wait, start again
                self._set("terminated", describe(exc))
            await asyncio.sleep(self.settings.reconnect_delay)

    async def _connect(self, uris: list[str]) -> tuple[aiormq.abc.AbstractConnection, str]:
        uri = parse_uri(random.choice(uris))
        connection = await asyncio.wait_for(aiormq.connect(
            amqp_url(uri, self.local),
            client_properties={"connection_name": f"Shovel {self.name}"}), CONNECT_TIMEOUT)
        return connection, uri.redacted()

    async def _session(self) -> None:
        s = self.settings
        src, self.src_uri = await self._connect(s.src_uris)
        try:
            dest, self.dest_uri = await self._connect(s.dest_uris)
            try:
                await self._shovel(src, dest)
            finally:
                await _close(dest)
        finally:
            await _close(src)

    async def _shovel(self, src: Any, dest: Any) -> None:
        s = self.settings
        confirm = s.ack_mode == "on-confirm"
        no_ack = s.ack_mode == "no-ack"
        # aiormq's channels queue 10 frames by default, so its reader hands over three or four
        # deliveries at a time: a deeper queue lets one turn of the loop see a socket read's worth.
        src_ch = await src.channel(publisher_confirms=False, frame_buffer_size=FRAME_BUFFER)
        dest_ch = await dest.channel(publisher_confirms=confirm, frame_buffer_size=FRAME_BUFFER)
        if s.dest_queue is not None:
            await dest_ch.queue_declare(s.dest_queue, durable=True,
                                        arguments=s.dest_queue_args or None)
        if s.src_queue is not None:
            declared = await src_ch.queue_declare(s.src_queue, durable=True,
                                                  arguments=s.src_queue_args or None)
            queue = s.src_queue
        else:
            declared = await src_ch.queue_declare("", exclusive=True, auto_delete=True)
            queue = declared.queue
            await src_ch.queue_bind(queue, s.src_exchange or "", routing_key=s.src_exchange_key)
        if self.remaining is None:
            if s.delete_after == "queue-length":
                self.remaining = int(declared.message_count or 0)
            elif isinstance(s.delete_after, int):
                self.remaining = s.delete_after
        if self.remaining is not None and self.remaining <= 0:
            raise Finished
        prefetch = s.prefetch
        if self.remaining is not None and not no_ack:
            prefetch = min(prefetch, self.remaining) if prefetch else self.remaining
        await src_ch.basic_qos(prefetch_count=prefetch)

        inbox: asyncio.Queue[DeliveredMessage | BaseException | None] = asyncio.Queue()
        pending: collections.deque[tuple[int, bool, asyncio.Future[Any]]] = collections.deque()
        loop = asyncio.get_running_loop()
        flush_scheduled = False
        dispatched = 0

        def flush() -> None:
            """Ack at the source every delivery whose publish is done, up to the first that
            is not (one ack multiple)."""
            nonlocal flush_scheduled
            flush_scheduled = False
            last = 0
            while pending and pending[0][2].done():
                tag, redelivered, fut = pending.popleft()
                if fut.cancelled():
                    inbox.put_nowait(LinkLost("a publish to the destination was cancelled"))
                    return
                exc = fut.exception()
                if exc is not None:
                    if isinstance(exc, aiormq.exceptions.DeliveryError):  # nacked: RabbitMQ drops it
                        if last:
                            _spawn(src_ch.basic_ack(last, multiple=True))
                            last = 0
                        _spawn(src_ch.basic_nack(tag, requeue=False))
                        continue
                    inbox.put_nowait(exc)
                    break
                last = tag
                self.forwarded += 1
                self.redelivered += redelivered
            if last and not no_ack:
                _spawn(src_ch.basic_ack(last, multiple=True))
            if self.remaining is not None and self.forwarded >= self.remaining and not pending:
                inbox.put_nowait(None)

        def published(_: asyncio.Future[Any]) -> None:
            nonlocal flush_scheduled
            if not flush_scheduled:
                flush_scheduled = True
                loop.call_soon(flush)

        async def on_message(message: DeliveredMessage) -> None:
            inbox.put_nowait(message)

        def lost(what: str) -> Callable[[asyncio.Future[Any]], None]:
            def closed(fut: asyncio.Future[Any]) -> None:
                exc = None if fut.cancelled() else fut.exception()
                inbox.put_nowait(LinkLost(f"{what}: {describe(exc)}" if exc else f"{what} closed"))
            return closed

        watchers = []
        for what, thing in (("source connection", src), ("destination connection", dest),
                            ("source channel", src_ch), ("destination channel", dest_ch)):
            fut = thing.closing
            fut.add_done_callback(lost(what))
            watchers.append(fut)
        deliver_inline(src_ch, inbox.put_nowait)
        consume = await src_ch.basic_consume(queue, on_message, no_ack=no_ack,
                                             arguments=s.src_consumer_args or None)
        self._set("running")
        try:
            while True:
                batch = [await inbox.get()]
                while not inbox.empty():
                    batch.append(inbox.get_nowait())
                messages = []
                stop: BaseException | None = None
                for item in batch:
                    if item is None:
                        stop = Finished()
                        break
                    if isinstance(item, BaseException):
                        stop = item
                        break
                    if self.remaining is not None and dispatched >= self.remaining:
                        continue  # beyond src-delete-after: left unacked, so it goes back
                    dispatched += 1
                    messages.append(item)
                if messages:
                    futures = await self._publish(dest_ch, messages, confirm)
                    for item, fut in zip(messages, futures, strict=True):
                        tag = int(getattr(item.delivery, "delivery_tag", 0) or 0)
                        pending.append((tag, bool(getattr(item.delivery, "redelivered", False)),
                                        fut))
                    watched = set()
                    for fut in futures:
                        if id(fut) not in watched:
                            watched.add(id(fut))
                            fut.add_done_callback(published)
                if stop is not None:
                    raise stop
                if messages and self.remaining is not None and dispatched >= self.remaining:
                    with _quiet():
                        await src_ch.basic_cancel(consume.consumer_tag)
        finally:
            for fut in watchers:
                fut.cancel()
            for _, _, fut in pending:
                fut.cancel()

    async def _publish(self, channel: Any, messages: list[DeliveredMessage],
                       confirm: bool) -> list[asyncio.Future[Any]]:
        return await publish_batch(channel, [(*self._outgoing(m), m.body) for m in messages],
                                   confirm)

    def _outgoing(self, message: DeliveredMessage) -> tuple[str, str, Any]:
        """The exchange, routing key and properties ``message`` is published with."""
        s = self.settings
        props = message.header.properties
        for key, value in s.publish_properties.items():
            setattr(props, key, value)
        if s.add_forward_headers or s.add_timestamp_header:
            headers = dict(props.headers or {})
            if s.add_forward_headers:
                entry: dict[str, Any] = {
                    "shovel-type": "dynamic", "shovel-name": self.name,
                    "shovel-vhost": self.vhost, "src-uri": self.src_uri,
                    "dest-uri": self.dest_uri}
                if s.src_queue is not None:
                    entry["src-queue"] = s.src_queue
                else:
                    entry["src-exchange"] = s.src_exchange
                    entry["src-exchange-key"] = s.src_exchange_key
                if s.dest_queue is not None:
                    entry["dest-queue"] = s.dest_queue
                elif s.dest_exchange is not None:
                    entry["dest-exchange"] = s.dest_exchange
                previous = headers.get("x-shovelled")
                headers["x-shovelled"] = [*(previous if isinstance(previous, list) else []), entry]
            if s.add_timestamp_header:
                headers["x-shovelled-timestamp"] = int(time.time())
            props.headers = headers
        delivery = message.delivery
        if s.dest_queue is not None:
            exchange, key = "", s.dest_queue
        elif s.dest_exchange is not None:
            exchange = s.dest_exchange
            key = s.dest_exchange_key if s.dest_exchange_key is not None else str(
                getattr(delivery, "routing_key", "") or "")
        else:  # neither: the message's own exchange and routing key
            exchange = str(getattr(delivery, "exchange", "") or "")
            key = str(getattr(delivery, "routing_key", "") or "")
        return exchange, key, props


async def publish_batch(channel: Any, messages: list[tuple[str, str, Any, bytes]],
                        confirm: bool) -> list[asyncio.Future[Any]]:
    """Publish ``(exchange, routing key, properties, body)`` each to ``channel`` in one write
    (one frame buffer for them all).

    Returns a future per message: its publisher confirm (a ``DeliveryError`` when nacked)
    with ``confirm``, else one future for the batch, done once it is written to the socket.
    This is aiormq's ``basic_publish`` for many messages at once: one lock, one write and
    one wake-up of the connection's writer instead of one each (the links process's cost).
    """
    number, size = channel.number, channel.max_content_size
    payload = b"".join([encode_publish(number, exchange, key, props, body, size)
                        for exchange, key, props, body in messages])
    futures: list[asyncio.Future[Any]] = []
    async with channel.lock:
        first = channel.delivery_tag + 1
        if confirm:
            for tag in range(first, first + len(messages)):
                fut = channel.create_future()
                channel.confirmations[tag] = fut
                futures.append(fut)
            channel.delivery_tag += len(messages)
        written = None if confirm else channel.create_future()
        try:
            await channel.write_queue.put(ChannelFrame(
                payload=payload, should_close=False, drain_future=written))
        except BaseException:  # not queued: the broker never sees these
            if confirm:
                channel.delivery_tag = first - 1
                for tag, fut in enumerate(futures, first):
                    channel.confirmations.pop(tag, None)
                    fut.cancel()
            if written is not None:
                written.cancel()
            raise
    return futures if written is None else [written] * len(messages)


_FRAME = struct.Struct(">BHI")  # AMQP 0-9-1 §4.2.3: type, channel, size
_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # basic.publish, ticket 0


def encode_publish(channel: int, exchange: str, key: str, props: Any, body: bytes,
                    max_size: int) -> bytes:
    """basic.publish, its content header and body frames, as bytes: pamqp's marshalling of the
    method and body frames was a fifth of the links process's time (the header, with its
    properties table, is still pamqp's)."""
    ex, rk = exchange.encode(), key.encode()
    method = b"".join((_PUBLISH, bytes((len(ex),)), ex, bytes((len(rk),)), rk, b"\x00"))
    parts = [_FRAME.pack(1, channel, len(method)), method, b"\xce",
             frame_marshal(ContentHeader(properties=props, body_size=len(body)), channel)]
    for start in range(0, len(body), max_size):
        chunk = body[start:start + max_size]
        parts += (_FRAME.pack(3, channel, len(chunk)), chunk, b"\xce")
    return b"".join(parts)


def deliver_inline(channel: Any, receive: Callable[[DeliveredMessage], None]) -> None:
    """Hand each delivery on ``channel`` to ``receive`` as the channel's reader reads it.

    aiormq starts a task per delivery to run the consumer's callback; every consumer here only
    queues the message for its own loop, so the task is pure cost (the links process's largest
    after frame parsing). The channel must carry one consumer: every delivery goes to
    ``receive`` whatever its consumer tag.
    """
    read_header = channel._Channel__get_content_header

    async def on_deliver(frame: Any) -> None:
        receive(await channel._read_content(frame, await read_header()))

    channel._on_deliver_frame = on_deliver


_tasks: set[asyncio.Task[Any]] = set()


def _spawn(coro: Awaitable[Any]) -> None:
    """An ack or nack, sent without waiting (its failure is the channel's, seen by the watchers)."""
    async def run() -> None:
        with _quiet():
            await coro
    task = asyncio.get_running_loop().create_task(run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, Exception)


async def _close(connection: Any) -> None:
    with _quiet():
        await asyncio.wait_for(connection.close(), 5.0)
