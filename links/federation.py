"""Federation links: one federated exchange or queue and one of its upstreams, in a loop of sessions.

Theory of operation
-------------------
A link (RabbitMQ's rabbit_federation_exchange_link / _queue_link) connects to one of its
upstream's URIs (chosen at random) and to this broker, both asking for a 10 s heartbeat, and
moves messages from the upstream to the downstream object. Any failure -- a connection refused
or lost, a channel closed by either side -- ends the session: the link reports ``error`` with
the reason, waits ``reconnect-delay`` seconds and starts again (``starting``, then ``running``).
Each change of state is logged.

Exchange link, for the downstream exchange X and the upstream exchange U (the upstream's
``exchange`` key, else X's name), as RabbitMQ 3.10 lays it out on the upstream:

* U is declared like X when it is missing (passive first);
* the exchange ``federation: U -> NODE A`` (or ``B``: each session takes the suffix the last one
  did not, so the new one is bound before the old one is deleted) of type
  ``x-federation-upstream`` (durable, auto-delete, internal; ``x-max-hops``,
  ``x-downstream-name`` = NODE, ``x-downstream-vhost``, ``x-internal-purpose``) -- ``fanout``
  where the upstream lacks that type;
* the durable queue ``federation: U -> NODE`` (``x-expires`` / ``x-message-ttl`` from the
  upstream) bound to it and consumed with the upstream's prefetch;
* U bound to that exchange (exchange.bind) once per distinct (routing key, arguments) of X's
  bindings here, the arguments carrying ``x-bound-from`` (broker.federation.bound_from). The
  links process tells the link X's bindings every poll (:meth:`ExchangeLink.update`), and the
  link binds and unbinds the difference.

Each delivery is republished to X with its routing key and ``x-received-from`` gaining this hop
(the upstream's URI without credentials, U, ``redelivered``, the upstream's ``cluster_name`` and
vhost), unless it has made ``max-hops`` hops already or passed this broker (checked again here:
an upstream without the exchange type routes everything). ``ack-mode``: ``on-confirm`` acks the
upstream delivery once the downstream confirmed its publish (a kill of either side loses
nothing; a message may come twice); ``on-publish`` once it is written; ``no-ack`` consumes
without acks. Without ``trust-user-id`` the ``user_id`` property is dropped.

Queue link, for the downstream queue Q and the upstream queue of the same name (or the
``queue`` key): the upstream queue is declared with Q's properties, and consumed with
``x-priority: -1`` only while Q has consumers and no messages -- RabbitMQ starts and stops its
consumer on Q's consumer state; Shoal's links process polls Q's consumer count and depth over
the control socket every POLL seconds instead. Messages go into Q by the default exchange.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import constants as pamqp_constants
from pamqp import encode as pamqp_encode

from broker.federation import (
    DOWNSTREAM_NAME_ARG,
    DOWNSTREAM_VHOST_ARG,
    MAX_HOPS_ARG,
    ROUTING_HEADER,
    UPSTREAM_TYPE,
    Upstream,
    bound_from,
    received_from,
    safe_uri,
    should_forward,
    upstream_queue_name,
)
from broker.parameters import parse_uri
from links.shovel import (
    CONNECT_TIMEOUT,
    FRAME_BUFFER,
    _close,
    _quiet,
    _spawn,
    amqp_url,
    deliver_inline,
    describe,
    publish_batch,
)

log = logging.getLogger("shoal.federation")

HEARTBEAT = 10  # seconds, as RabbitMQ's federation links ask
PURPOSE: dict[str, Any] = {"x-internal-purpose": "federation"}

# pamqp refuses names outside AMQP's suggested character set, and RabbitMQ's own federation names
# have '>' in them ("federation: X -> NODE"); RabbitMQ and Shoal take any name of up to 255 bytes.
for _domain in ("queue-name", "exchange-name"):
    pamqp_constants.DOMAIN_REGEX[_domain] = re.compile(r".*", re.DOTALL)


class Long(int):
    """An integer sent as a field table's 64-bit ``l`` (RabbitMQ's ``long``): RabbitMQ refuses an
    ``x-federation-upstream`` exchange whose ``x-max-hops`` is of another type, and pamqp picks
    the smallest type that holds a value."""


_table_integer = pamqp_encode.table_integer


def _encode_integer(value: int) -> bytes:
    if type(value) is Long:
        return b"l" + pamqp_encode.long_long_int(value)
    return _table_integer(value)


pamqp_encode.table_integer = _encode_integer


class LinkLost(Exception):
    """A connection or channel of the session closed."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _binding_key(routing_key: str, arguments: Any) -> str:
    return json.dumps([routing_key, arguments], sort_keys=True, default=_text)


class Link:
    """One (federated object, upstream) pair, running (module text). ``report`` gets each status
    row with its key."""

    kind = ""

    def __init__(self, vhost: str, target: dict[str, Any], upstream: Upstream, node: str,
                 local: tuple[str, int],
                 report: Callable[[list[str], dict[str, Any]], None]) -> None:
        self.vhost, self.target, self.upstream, self.node = vhost, target, upstream, node
        self.name = str(target["name"])
        self.local = local
        self._report = report
        self.key = [vhost, self.kind, self.name, upstream.name]
        self.status = "starting"
        self.error: str | None = None
        self.since = time.time()
        self.uri = ""
        self.local_connection = ""
        self.changed = asyncio.Event()
        self.up: Any = None  # the session's connections and channels
        self.down: Any = None
        self.up_ch: Any = None
        self.down_ch: Any = None
        self.upstream_vhost = "/"

    # ------------------------------------------------------------------ status

    def row(self) -> dict[str, Any]:
        """RabbitMQ's /api/federation-links row."""
        row: dict[str, Any] = {
            "vhost": self.vhost, "id": hashlib.sha1(json.dumps(self.key).encode()).hexdigest()[:8],
            "type": self.kind, "upstream": self.upstream.name, self.kind: self.name,
            f"upstream_{self.kind}": self.upstream_name, "status": self.status,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))}
        if self.kind == "queue":
            row["consumer_tag"] = self.upstream.consumer_tag
        if self.uri:
            row["uri"] = self.uri
        if self.status == "running":
            row["local_connection"] = self.local_connection
        if self.error is not None:
            row["error"] = self.error
        return row

    @property
    def upstream_name(self) -> str:
        return self.name

    def _set(self, status: str, error: str | None = None) -> None:
        if (status, error) != (self.status, self.error):
            self.status, self.error, self.since = status, error, time.time()
            what = f"federation link for {self.kind} '{self.name}' in vhost '{self.vhost}' " \
                   f"(upstream '{self.upstream.name}')"
            if error is not None:
                log.warning("%s: %s: %s", what, status, error)
            else:
                log.info("%s: %s", what, status)
        self._report(self.key, self.row())

    def update(self, target: dict[str, Any]) -> None:
        """The object's state at the latest poll (bindings, consumers)."""
        self.target = target
        self.changed.set()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            self._set("starting")
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure: report, wait, start again
                self._set("error", describe(exc))
            await asyncio.sleep(self.upstream.reconnect_delay)

    async def _connect(self) -> None:
        uri = parse_uri(random.choice(self.upstream.uris))
        self.uri = safe_uri(uri.original)
        self.upstream_vhost = uri.vhost
        props: dict[str, Any] = {"connection_name": f"Federation link (upstream: "
                                                    f"{self.upstream.name}, {self.kind}: {self.name})"}
        self.up = await asyncio.wait_for(aiormq.connect(
            f"{amqp_url(uri, self.local)}?heartbeat={HEARTBEAT}", client_properties=props),
            CONNECT_TIMEOUT)
        local = parse_uri("amqp://")
        self.down = await asyncio.wait_for(aiormq.connect(
            f"{amqp_url(local, self.local)}?heartbeat={HEARTBEAT}", client_properties=props),
            CONNECT_TIMEOUT)
        self.local_connection = props["connection_name"]

    async def _session(self) -> None:
        self.up = self.down = None
        self.inbox: asyncio.Queue[DeliveredMessage | BaseException] = asyncio.Queue()
        try:
            await self._connect()
            self.up_ch = await self.up.channel(frame_buffer_size=FRAME_BUFFER)
            deliver_inline(self.up_ch, self.inbox.put_nowait)
            confirm = self.upstream.ack_mode == "on-confirm"
            self.down_ch = await self.down.channel(publisher_confirms=confirm,
                                                   frame_buffer_size=FRAME_BUFFER)
            lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            lost.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, always
            for what, thing in (("upstream connection", self.up),
                                ("downstream connection", self.down),
                                ("upstream channel", self.up_ch),
                                ("downstream channel", self.down_ch)):
                thing.closing.add_done_callback(_watch(what, lost))
            await self._start()
            self._set("running")
            tasks = [asyncio.ensure_future(self._follow()), asyncio.ensure_future(self._pump())]
            try:
                await asyncio.wait([lost, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    if task.done():
                        task.result()
                lost.result()
            finally:
                for task in tasks:
                    task.cancel()
                lost.cancel()
        finally:
            for conn in (self.down, self.up):
                if conn is not None:
                    await _close(conn)

    async def _start(self) -> None:
        raise NotImplementedError

    async def _follow(self) -> None:
        """Act on each update of the target until the session ends."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            await self._changed()

    async def _changed(self) -> None:
        return None

    async def _consume(self, queue: str, arguments: dict[str, Any] | None = None) -> str:
        no_ack = self.upstream.ack_mode == "no-ack"
        if not no_ack:
            await self.up_ch.basic_qos(prefetch_count=self.upstream.prefetch)
        ok = await self.up_ch.basic_consume(queue, self._deliver, no_ack=no_ack,
                                            arguments=arguments,
                                            consumer_tag=self.upstream.consumer_tag)
        return str(ok.consumer_tag)

    async def _deliver(self, message: DeliveredMessage) -> None:
        self.inbox.put_nowait(message)

    async def _pump(self) -> None:
        """Republish downstream what came, in the order delivered, a batch per turn of the
        loop (links.shovel.publish_batch), and settle upstream in that order: one ack multiple
        for every delivery up to the first whose publish is not done yet (on-confirm: confirmed
        downstream), a nack (no requeue) for one nacked downstream, as RabbitMQ's link_util
        does; what is not forwarded (its hops are spent) is acked as it comes."""
        loop = asyncio.get_running_loop()
        pending: collections.deque[tuple[int, asyncio.Future[Any] | None]] = collections.deque()
        scheduled = False

        def settle() -> None:
            nonlocal scheduled
            scheduled = False
            last = 0
            while pending and (pending[0][1] is None or pending[0][1].done()):
                tag, fut = pending.popleft()
                exc = None if fut is None or fut.cancelled() else fut.exception()
                if fut is not None and fut.cancelled():
                    self.inbox.put_nowait(LinkLost("a publish downstream was cancelled"))
                    return
                if isinstance(exc, aiormq.exceptions.DeliveryError):
                    if last:
                        _spawn(self.up_ch.basic_ack(last, multiple=True))
                        last = 0
                    _spawn(self.up_ch.basic_nack(tag, requeue=False))
                    continue
                if exc is not None:
                    self.inbox.put_nowait(exc)
                    return
                last = tag
            if last:
                _spawn(self.up_ch.basic_ack(last, multiple=True))

        def soon(_: Any = None) -> None:
            nonlocal scheduled
            if not scheduled:
                scheduled = True
                loop.call_soon(settle)

        try:
            while True:
                await self._pump_batch(pending, soon)
        finally:
            for _, fut in pending:
                if fut is not None:
                    fut.cancel()

    async def _pump_batch(self, pending: collections.deque[tuple[int, asyncio.Future[Any] | None]],
                          soon: Callable[..., None]) -> None:
        """One turn of :meth:`_pump`: what is in the inbox, published, queued for settling."""
        mode = self.upstream.ack_mode
        batch = [await self.inbox.get()]
        while not self.inbox.empty():
            batch.append(self.inbox.get_nowait())
        order: list[tuple[int, int | None]] = []  # (tag, its index in out, or None)
        out: list[tuple[str, str, Any, bytes]] = []
        for item in batch:
            if isinstance(item, BaseException):
                raise item
            delivery = item.delivery
            tag = int(getattr(delivery, "delivery_tag", 0) or 0)
            props = item.header.properties
            if not self._forward(props.headers):
                order.append((tag, None))
                continue
            props.headers = self._headers(
                props.headers, bool(getattr(delivery, "redelivered", False)), delivery)
            if not self.upstream.trust_user_id:
                props.user_id = None
            order.append((tag, len(out)))
            out.append((*self._destination(delivery), props, item.body))
        futures = await publish_batch(self.down_ch, out, mode == "on-confirm") if out else []
        if mode == "no-ack":
            return
        for tag, index in order:
            pending.append((tag, None if index is None else futures[index]))
        for fut in {id(f): f for f in futures}.values():
            fut.add_done_callback(soon)
        soon()

    def _forward(self, headers: Any) -> bool:
        return True

    def _destination(self, delivery: Any) -> tuple[str, str]:
        raise NotImplementedError

    def _headers(self, headers: Any, redelivered: bool, delivery: Any) -> dict[str, Any]:
        raise NotImplementedError


def _watch(what: str, lost: asyncio.Future[None]) -> Callable[[asyncio.Future[Any]], None]:
    def closed(fut: asyncio.Future[Any]) -> None:
        if lost.done():
            return
        exc = None if fut.cancelled() else fut.exception()
        lost.set_exception(LinkLost(f"{what}: {describe(exc)}" if exc else f"{what} closed"))
    return closed


class ExchangeLink(Link):
    """A federated exchange's link to one upstream (module text)."""

    kind = "exchange"

    @property
    def upstream_name(self) -> str:
        return self.upstream.exchange or self.name

    async def _start(self) -> None:
        up = self.upstream
        ux = self.upstream_name
        self.cluster = _text((self.up.server_properties or {}).get("cluster_name", "")) or None
        queue = upstream_queue_name(ux, self.upstream_vhost, self.name, self.vhost, self.node)
        args: dict[str, Any] = {}
        if up.expires is not None:
            args["x-expires"] = up.expires
        if up.message_ttl is not None:
            args["x-message-ttl"] = up.message_ttl
        await self.up_ch.queue_declare(queue, durable=True, arguments={**args, **PURPOSE})
        # the upstream exchange, like ours where it is missing
        if not await self._exists(ux):
            t = self.target
            await self.up_ch.exchange_declare(ux, exchange_type=t["type"], durable=t["durable"],
                                              auto_delete=t["auto_delete"],
                                              internal=t["internal"], arguments=t["arguments"])
        old = f"{queue} B" if await self._exists(f"{queue} B") else f"{queue} A"
        self.suffix = "A" if old.endswith(" B") else "B"
        self.internal = f"{queue} {self.suffix}"
        await self._disposable("exchange_delete", self.internal)
        xfu = {MAX_HOPS_ARG: Long(up.max_hops), DOWNSTREAM_NAME_ARG: self.node,
               DOWNSTREAM_VHOST_ARG: self.vhost, **PURPOSE}
        if not await self._disposable("exchange_declare", self.internal,
                                      exchange_type=UPSTREAM_TYPE, durable=True, internal=True,
                                      auto_delete=True, arguments=xfu):
            await self.up_ch.exchange_declare(self.internal, exchange_type="fanout", durable=True,
                                              internal=True, auto_delete=True, arguments=PURPOSE)
        await self.up_ch.queue_bind(queue, self.internal)
        self.bound: dict[str, tuple[str, dict[str, Any]]] = {}
        await self._changed()
        await self._disposable("exchange_delete", old)
        await self._consume(queue)

    async def _exists(self, exchange: str) -> bool:
        return await self._disposable("exchange_declare", exchange, passive=True)

    async def _disposable(self, method: str, *args: Any, **kwargs: Any) -> bool:
        """One command on a channel of its own (a refusal closes that channel only)."""
        channel = await self.up.channel()
        try:
            await getattr(channel, method)(*args, **kwargs)
        except aiormq.exceptions.ChannelClosed:
            return False
        with _quiet():
            await channel.close()
        return True

    def _wanted(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """The upstream bindings X's bindings here call for (exchange_link add_binding)."""
        wanted = {}
        for routing_key, arguments in self.target.get("bindings", []):
            args = bound_from(arguments, self.upstream.max_hops, self.cluster,
                              self.upstream_vhost, self.node, self.vhost, self.name, self.suffix)
            if args is not None:
                wanted[_binding_key(routing_key, arguments)] = (str(routing_key), args)
        return wanted

    async def _changed(self) -> None:
        wanted = self._wanted()
        for key in [k for k in self.bound if k not in wanted]:
            routing_key, args = self.bound.pop(key)
            await self.up_ch.exchange_unbind(self.internal, self.upstream_name, routing_key,
                                             arguments=args)
        for key, (routing_key, args) in wanted.items():
            if key not in self.bound:
                await self.up_ch.exchange_bind(self.internal, self.upstream_name, routing_key,
                                               arguments=args)
                self.bound[key] = (routing_key, args)

    def _forward(self, headers: Any) -> bool:
        return should_forward(headers, self.upstream.max_hops, self.node, self.vhost)

    def _destination(self, delivery: Any) -> tuple[str, str]:
        return self.name, str(getattr(delivery, "routing_key", "") or "")

    def _headers(self, headers: Any, redelivered: bool, delivery: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"uri": self.uri, "exchange": self.upstream_name,
                                 "redelivered": redelivered}
        if self.cluster is not None:
            entry["cluster-name"] = self.cluster
        entry["vhost"] = self.upstream_vhost
        return received_from(headers, entry)


class QueueLink(Link):
    """A federated queue's link to one upstream (module text)."""

    kind = "queue"

    @property
    def upstream_name(self) -> str:
        return self.upstream.queue or self.name

    async def _start(self) -> None:
        t = self.target
        await self.up_ch.queue_declare(self.upstream_name, durable=t["durable"],
                                       auto_delete=t["auto_delete"], arguments=t["arguments"])
        if self.upstream.ack_mode != "no-ack":
            await self.up_ch.basic_qos(prefetch_count=self.upstream.prefetch)
        self.consuming = False
        await self._changed()

    def _wants_messages(self) -> bool:
        """rabbit_federation_queue: run while Q is empty and has a consumer, pause otherwise."""
        return int(self.target.get("consumers", 0)) > 0 and int(self.target.get("messages", 0)) == 0

    async def _changed(self) -> None:
        run = self._wants_messages()
        if run and not self.consuming:
            await self.up_ch.basic_consume(self.upstream_name, self._deliver,
                                           no_ack=self.upstream.ack_mode == "no-ack",
                                           arguments={"x-priority": -1},
                                           consumer_tag=self.upstream.consumer_tag)
            self.consuming = True
        elif not run and self.consuming:
            await self.up_ch.basic_cancel(self.upstream.consumer_tag)
            self.consuming = False

    def _destination(self, delivery: Any) -> tuple[str, str]:
        return "", self.name

    def _headers(self, headers: Any, redelivered: bool, delivery: Any) -> dict[str, Any]:
        out = dict(headers or {})
        been = out.get(ROUTING_HEADER)
        count = 0
        if isinstance(been, list):
            mine = [e for e in been if isinstance(e, dict) and _text(e.get("uri")) == self.uri
                    and _text(e.get("queue")) == self.upstream_name]
            if mine:
                count = int(mine[0].get("visit-count", 0) or 0)
            out[ROUTING_HEADER] = [e for e in been if not any(e is m for m in mine)]
        else:
            out["x-original-exchange"] = str(getattr(delivery, "exchange", "") or "")
            out["x-original-routing-key"] = str(getattr(delivery, "routing_key", "") or "")
            out.pop(ROUTING_HEADER, None)
        entry = {"uri": self.uri, "queue": self.upstream_name, "redelivered": redelivered,
                 "visit-count": count + 1}
        return received_from(out, entry)


LINKS: dict[str, type[Link]] = {"exchange": ExchangeLink, "queue": QueueLink}
