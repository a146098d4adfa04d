"""The management API's writes that are AMQP operations, over AMQP to the broker's own port.

RabbitMQ's management plugin declares, deletes, binds, publishes and gets through its direct
(Erlang) client as the HTTP user; here that is a short AMQP 0-9-1 connection from the
management process to the broker's listener, logged in as the HTTP user with the password of
the request, so the broker applies the same checks (and the same errors) as to any client.
One connection per HTTP request: writes are rare, and nothing is shared between users.

A small client on trio and pamqp (the broker's own frame codec): no AMQP client library is a
core dependency, and the AMQP side is a handful of synchronous methods.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio
from pamqp import body as pbody
from pamqp import commands as c
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.base import Frame

CONNECT_TIMEOUT = 10.0
OP_TIMEOUT = 30.0
PRODUCT = "Shoal management"


class AMQPFailure(Exception):
    """The broker refused: ``code`` (404, 406, 403, ...) and its reply text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


@dataclass
class GotMessage:
    exchange: str
    routing_key: str
    redelivered: bool
    message_count: int
    properties: dict[str, Any]
    body: bytes


@dataclass
class _Content:
    method: Any
    header: pheader.ContentHeader | None = None
    chunks: list[bytes] = field(default_factory=list)


class Client:
    """One AMQP connection with one channel (1), used by one HTTP request."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.frame_max = 131072

    # ------------------------------------------------------------------ frames

    async def _send(self, *frames: tuple[Any, int]) -> None:
        await self._stream.send_all(b"".join(pframe.marshal(f, ch) for f, ch in frames))

    async def _frame(self) -> tuple[int, Any]:
        while True:
            buffer = self._buffer
            # type (1), channel (2), size (4), payload, frame-end: a whole frame is there
            if len(buffer) >= 7 and len(buffer) >= 8 + int.from_bytes(buffer[3:7], "big"):
                used, channel, value = pframe.unmarshal(buffer)
                self._buffer = buffer[used:]
                if isinstance(value, pheartbeat.Heartbeat):
                    await self._send((pheartbeat.Heartbeat(), 0))
                    continue
                return channel, value
            data = await self._stream.receive_some(65536)
            if not data:
                raise AMQPFailure(320, "CONNECTION_FORCED - the broker closed the connection")
            self._buffer += data

    async def _expect(self, *kinds: type) -> Any:
        """The next method on channel 1 (or 0); a close becomes AMQPFailure."""
        while True:
            channel, value = await self._frame()
            if isinstance(value, c.Connection.Close):
                with contextlib.suppress(Exception):
                    await self._send((c.Connection.CloseOk(), 0))
                raise AMQPFailure(value.reply_code or 0, value.reply_text or "")
            if isinstance(value, c.Channel.Close):
                with contextlib.suppress(Exception):
                    await self._send((c.Channel.CloseOk(), channel))
                raise AMQPFailure(value.reply_code or 0, value.reply_text or "")
            if isinstance(value, kinds):
                return value

    async def _rpc(self, method: Frame, *answers: type) -> Any:
        await self._send((method, 1))
        return await self._expect(*answers)

    # --------------------------------------------------------------- handshake

    async def open(self, user: str, password: str, vhost: str) -> None:
        await self._stream.send_all(pheader.ProtocolHeader().marshal())
        await self._expect(c.Connection.Start)
        await self._send((c.Connection.StartOk(
            client_properties={"product": PRODUCT, "capabilities": {
                "authentication_failure_close": True, "publisher_confirms": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}"), 0))
        tune = await self._expect(c.Connection.Tune)
        self.frame_max = tune.frame_max or self.frame_max
        await self._send((c.Connection.TuneOk(tune.channel_max, self.frame_max, 0), 0))
        await self._send((c.Connection.Open(vhost), 0))
        await self._expect(c.Connection.OpenOk)
        await self._rpc(c.Channel.Open(), c.Channel.OpenOk)

    async def close(self) -> None:
        with contextlib.suppress(Exception), trio.move_on_after(2):
            await self._send((c.Connection.Close(200, "Goodbye"), 0))
            await self._expect(c.Connection.CloseOk)

    # --------------------------------------------------------------- operations

    async def exchange_declare(self, name: str, type: str, durable: bool, auto_delete: bool,
                               internal: bool, arguments: dict[str, Any]) -> None:
        await self._rpc(c.Exchange.Declare(exchange=name, exchange_type=type, durable=durable,
                                           auto_delete=auto_delete, internal=internal,
                                           arguments=arguments), c.Exchange.DeclareOk)

    async def exchange_delete(self, name: str, if_unused: bool) -> None:
        await self._rpc(c.Exchange.Delete(exchange=name, if_unused=if_unused), c.Exchange.DeleteOk)

    async def queue_declare(self, name: str, durable: bool, auto_delete: bool,
                            arguments: dict[str, Any]) -> None:
        await self._rpc(c.Queue.Declare(queue=name, durable=durable, auto_delete=auto_delete,
                                        arguments=arguments), c.Queue.DeclareOk)

    async def queue_delete(self, name: str, if_unused: bool, if_empty: bool) -> None:
        await self._rpc(c.Queue.Delete(queue=name, if_unused=if_unused, if_empty=if_empty),
                        c.Queue.DeleteOk)

    async def queue_purge(self, name: str) -> int:
        ok = await self._rpc(c.Queue.Purge(queue=name), c.Queue.PurgeOk)
        return int(ok.message_count)

    async def bind(self, destination_type: str, source: str, destination: str,
                   routing_key: str, arguments: dict[str, Any]) -> None:
        if destination_type == "queue":
            await self._rpc(c.Queue.Bind(queue=destination, exchange=source,
                                         routing_key=routing_key, arguments=arguments),
                            c.Queue.BindOk)
        else:
            await self._rpc(c.Exchange.Bind(destination=destination, source=source,
                                            routing_key=routing_key, arguments=arguments),
                            c.Exchange.BindOk)

    async def unbind(self, destination_type: str, source: str, destination: str,
                     routing_key: str, arguments: dict[str, Any]) -> None:
        if destination_type == "queue":
            await self._rpc(c.Queue.Unbind(queue=destination, exchange=source,
                                           routing_key=routing_key, arguments=arguments),
                            c.Queue.UnbindOk)
        else:
            await self._rpc(c.Exchange.Unbind(destination=destination, source=source,
                                              routing_key=routing_key, arguments=arguments),
                            c.Exchange.UnbindOk)

    async def publish(self, exchange: str, routing_key: str, body: bytes,
                      properties: dict[str, Any]) -> bool:
        """Mandatory, in confirm mode: routed unless basic.return comes before the ack."""
        await self._rpc(c.Confirm.Select(), c.Confirm.SelectOk)
        props = c.Basic.Properties(**properties)
        frames: list[tuple[Any, int]] = [
            (c.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True), 1),
            (pheader.ContentHeader(0, len(body), props), 1)]
        step = max(1, self.frame_max - 8)
        frames += [(pbody.ContentBody(body[i:i + step]), 1) for i in range(0, len(body), step)]
        await self._send(*frames)
        routed = True
        while True:
            method = await self._expect(c.Basic.Return, c.Basic.Ack, c.Basic.Nack)
            if isinstance(method, c.Basic.Return):
                routed = False
                continue
            if isinstance(method, c.Basic.Nack):
                raise AMQPFailure(500, "the broker nacked the message")
            return routed

    async def get(self, queue: str, count: int, ackmode: str) -> list[GotMessage]:
        """basic.get up to ``count`` times, then settle them all per ``ackmode``."""
        got: list[GotMessage] = []
        last_tag = 0
        for _ in range(count):
            method = await self._rpc(c.Basic.Get(queue=queue), c.Basic.GetOk, c.Basic.GetEmpty)
            if isinstance(method, c.Basic.GetEmpty):
                break
            last_tag = method.delivery_tag
            header: pheader.ContentHeader = await self._expect(pheader.ContentHeader)
            chunks: list[bytes] = []
            size = 0
            while size < header.body_size:
                part = await self._expect(pbody.ContentBody)
                chunks.append(part.value)
                size += len(part.value)
            got.append(GotMessage(method.exchange, method.routing_key, method.redelivered,
                                  method.message_count, properties_dict(header.properties),
                                  b"".join(chunks)))
        if last_tag:
            if ackmode == "ack_requeue_false":
                await self._send((c.Basic.Ack(delivery_tag=last_tag, multiple=True), 1))
            else:  # ack_requeue_true, reject_requeue_true, reject_requeue_false
                await self._send((c.Basic.Nack(delivery_tag=last_tag, multiple=True,
                                               requeue=ackmode != "reject_requeue_false"), 1))
            # a round trip after the settlement: it was applied before the answer goes out
            await self._rpc(c.Basic.Qos(prefetch_count=0), c.Basic.QosOk)
        return got


def properties_dict(props: c.Basic.Properties | None) -> dict[str, Any]:
    """The properties a message has, by RabbitMQ's management names."""
    if props is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                 "user_id", "app_id", "cluster_id"):
        value = getattr(props, name, None)
        if value is None or (value == "" and name == "cluster_id"):
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.replace(tzinfo=datetime.UTC).timestamp())
        out[name] = value
    message_type = getattr(props, "message_type", None)
    if message_type is not None:
        out["type"] = message_type
    return out


PUBLISH_PROPERTIES = {
    "content_type", "content_encoding", "headers", "delivery_mode", "priority",
    "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "user_id",
    "app_id", "cluster_id",
}


def publish_properties(props: dict[str, Any]) -> dict[str, Any]:
    """The management API's ``properties`` object as pamqp's Basic.Properties arguments."""
    out: dict[str, Any] = {}
    for key, value in props.items():
        if key == "type":
            out["message_type"] = str(value)
        elif key in ("delivery_mode", "priority"):
            out[key] = int(value)
        elif key == "timestamp":
            out[key] = datetime.datetime.fromtimestamp(int(value), tz=datetime.UTC)
        elif key == "headers":
            out[key] = dict(value or {})
        elif key in PUBLISH_PROPERTIES:
            out[key] = str(value)
        else:
            raise ValueError(f"unknown property {key!r}")
    return out


def decode_payload(payload: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(payload)
    if encoding == "string":
        return payload.encode()
    raise ValueError(f"payload_encoding must be string or base64, not {encoding!r}")


@contextlib.asynccontextmanager
async def connect(host: str, port: int, user: str, password: str,
                  vhost: str = "/") -> AsyncIterator[Client]:
    """An open connection and channel, logged in as ``user``; closed on the way out."""
    with trio.fail_after(CONNECT_TIMEOUT):
        stream = await trio.open_tcp_stream(host, port)
    async with stream:
        client = Client(stream)
        with trio.fail_after(CONNECT_TIMEOUT):
            await client.open(user, password, vhost)
        try:
            with trio.fail_after(OP_TIMEOUT):
                yield client
        finally:
            await client.close()
