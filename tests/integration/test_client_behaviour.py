"""Client-visible behaviour that must match RabbitMQ 3.10, each through the client library that
exposed the difference: connection.update-secret (pika), basic.recover-async (aiormq), the order
of a channel's replies after a mandatory publish (pika's confirm_delivery), channel numbers above
channel_max (pika), the close after pipelined publishes, guest only via localhost, the log, and
heartbeats through a stalling proxy (aiormq)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import aiormq
import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.harness import Broker, finish, start_broker, wait_until
from tests.integration.pika_helpers import Names, pump_until, ready_count
from tests.integration.rawclient import RawClient, method_frame, publish_frames

SCENARIO_TIMEOUT = 30.0


def test_update_secret_is_answered_and_the_connection_carries_on(shared_broker: Broker, names: Names) -> None:
    """pika's update_secret waits for update-secret-ok (RabbitMQ answers it and logs it at info;
    Shoal used to close the connection with 504)."""
    connection = shared_broker.connect()
    connection.update_secret("guest", "token refreshed")
    channel = connection.channel()
    queue = names("after-secret")
    channel.queue_declare(queue, auto_delete=True)
    channel.basic_publish("", queue, b"still here")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"still here"
    wait_until(lambda: "user 'guest' updated secret, reason: token refreshed"
               in shared_broker.log_path.read_text(errors="replace"), 10, "the update in the log")


def test_recover_async_requeues_the_unacked_deliveries_without_a_reply(shared_broker: Broker, names: Names) -> None:
    """aiormq's basic_recover(nowait=True, requeue=True) sends the deprecated basic.recover-async:
    RabbitMQ takes it as basic.recover (redelivering what the channel holds unacked) and sends
    nothing back."""
    queue = names("recover-async")

    async def scenario() -> list[tuple[bytes, bool]]:
        connection = await aiormq.connect(shared_broker.url)
        try:
            channel = await connection.channel()
            await channel.queue_declare(queue, auto_delete=True)
            await channel.basic_qos(prefetch_count=1)
            got: asyncio.Queue[aiormq.abc.DeliveredMessage] = asyncio.Queue()
            await channel.basic_consume(queue, got.put)
            await channel.basic_publish(b"once", routing_key=queue)
            first = await got.get()
            await channel.basic_recover(nowait=True, requeue=True)  # the unacked delivery comes back
            second = await got.get()
            await channel.basic_ack(second.delivery_tag)
            ok = await channel.queue_declare(queue, passive=True)  # the channel is still usable
            assert ok.message_count == 0
            return [(first.body, first.redelivered), (second.body, second.redelivered)]
        finally:
            await connection.close()

    deliveries = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT))
    assert deliveries == [(b"once", False), (b"once", True)]


def test_recover_async_without_requeue_is_not_implemented_as_in_rabbitmq(shared_broker: Broker) -> None:
    """aiormq's default basic_recover(nowait=True) has requeue=false, which RabbitMQ 3.10 closes
    the connection for: 540 NOT_IMPLEMENTED - requeue=false (its basic.recover likewise)."""

    async def scenario() -> BaseException:
        connection = await aiormq.connect(shared_broker.url)
        try:
            channel = await connection.channel()
            await channel.basic_recover(nowait=True)
            with pytest.raises(aiormq.exceptions.AMQPError) as refused:
                await channel.queue_declare("", exclusive=True)
            return refused.value
        finally:
            await connection.close()

    refused = asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT))
    assert "540" in repr(refused) or "NOT_IMPLEMENTED" in repr(refused), repr(refused)
    assert "requeue=false" in repr(refused), repr(refused)


def test_a_return_owed_for_an_earlier_publish_comes_before_confirm_select_ok(
        shared_broker: Broker, names: Names) -> None:
    """pika's BlockingChannel counts a basic.return that arrives after confirm.select-ok as a
    return for its next confirmed publish, which then fails with UnroutableError. The worker
    answers select-ok itself: it must not overtake the return of the publish before it."""
    connection = shared_broker.connect()
    queue = names("routable")
    for attempt in range(20):  # the overtaking was a race the worker won almost every time
        channel = connection.channel()
        returned: list[bytes] = []
        channel.add_on_return_callback(lambda _ch, _m, _p, body, returned=returned: returned.append(body))
        channel.queue_declare(queue, auto_delete=True)
        channel.basic_publish("", names("nobody-bound"), f"unroutable {attempt}".encode(),
                              mandatory=True)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"routable", mandatory=True)  # raised UnroutableError
        pump_until([connection], lambda returned=returned: bool(returned), 10, "the basic.return")
        assert returned == [f"unroutable {attempt}".encode()]
        channel.queue_purge(queue)
        channel.close()


def test_channel_max_limits_open_channels_not_channel_numbers(shared_broker: Broker, names: Names) -> None:
    """AMQP channel-max is "the maximum total number of channels": RabbitMQ lets a client open
    channel 65535 with channel_max 2047, and refuses the channel past the count with 530."""
    connection = shared_broker.connect()
    high = connection.channel(channel_number=65535)
    queue = names("high-channel")
    high.queue_declare(queue, auto_delete=True)
    high.basic_publish("", queue, b"on 65535")
    assert ready_count(high, queue) == 1

    small = shared_broker.connect(channel_max=2)
    small.channel(channel_number=40000)
    small.channel(channel_number=50000)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        third = small.channel(channel_number=60000)
        third.queue_declare("", exclusive=True)
    assert closed.value.reply_code == 530
    assert "number of channels opened (2) has reached the negotiated channel_max (2)" in closed.value.reply_text


def test_publishes_pipelined_ahead_of_connection_close_are_all_queued(shared_broker: Broker, names: Names) -> None:
    """pika writes 3,000 publishes and connection.close without waiting: close-ok comes back and
    every publish before the close is in the queue (the worker's reader finishes what it read)."""
    queue = names("before-close")
    checker = shared_broker.connect()
    channel = checker.channel()
    channel.queue_declare(queue, auto_delete=False)
    try:
        publisher = shared_broker.connect()
        pipe = publisher.channel()
        for n in range(3000):
            pipe.basic_publish("", queue, b"%d" % n)
        publisher.close()  # returns once close-ok arrived
        wait_until(lambda: ready_count(channel, queue) == 3000, 20, "all 3,000 publishes queued")
    finally:
        channel.queue_delete(queue)


def test_after_close_ok_the_broker_reads_and_drops_until_the_client_closes(shared_broker: Broker) -> None:
    """A client that keeps writing after its connection.close (amqplib flushing what it had
    buffered) gets close-ok and then a clean end of stream, never a reset: the broker reads and
    drops its input for a short while after close-ok, as RabbitMQ does."""
    client = RawClient.opened(shared_broker.port)
    try:
        late = b"".join(publish_frames(1, "", "nowhere", b"x" * 1000)) * 200
        client.send(method_frame(0, commands.Connection.Close(200, "bye", 0, 0)) + late)
        client.read_until(commands.Connection.CloseOk)
        for _ in range(5):  # read and dropped; a broker that had closed would answer with a reset
            time.sleep(0.05)
            client.send(late)
        assert client.expect_eof() == []
    finally:
        client.close()


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than 127.0.0.0/8: traffic to it stays on this host."""
    import ipaddress

    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return str(address.address)
    return None


def test_guest_may_log_in_only_via_localhost(tmp_path: Path) -> None:
    """RabbitMQ's loopback_users default: a broker listening on every address refuses guest from a
    non-loopback address with RabbitMQ's generic ACCESS_REFUSED - Login was refused using
    authentication mechanism PLAIN (the reason logged with the peer), and lets guest in from
    127.0.0.1 and other users in from anywhere."""
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to itself through")
    broker = start_broker(tmp_path / "broker", workers=1, extra_args=[
        "--host", "0.0.0.0", "--user", "guest:guest", "--user", "alice:secret-1"])
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
            broker.connect(host=address)
        assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. " \
            "For details see the broker logfile.'" in str(refused.value), str(refused.value)
        alice = broker.connect(host=address, credentials=pika.PlainCredentials("alice", "secret-1"))
        alice.channel().queue_declare("", exclusive=True)
        broker.connect().channel().queue_declare("", exclusive=True)  # guest via 127.0.0.1

        def logged() -> bool:
            return any(f"({address}:" in line and "ERROR" in line and "login refused: user "
                       "'guest' - can only connect via localhost" in line
                       for line in broker.log_path.read_text(errors="replace").splitlines())

        wait_until(logged, 10, "the refused login in the log")
    finally:
        finish(broker)


def test_the_log_says_who_connected_who_left_and_whose_login_was_refused(
        shared_broker: Broker, names: Names) -> None:
    """What RabbitMQ logs at info: accepted (peer -> local), authenticated (user, vhost), the
    client-provided name, closed; a channel exception at error; a refused login with the user
    name and peer -- never the password."""
    label = names("conn-name")
    connection = shared_broker.connect(client_properties={"connection_name": label})
    local_port = connection._impl._transport._sock.getsockname()[1]
    missing = names("missing")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        connection.channel().queue_declare(missing, passive=True)
    connection.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        shared_broker.connect(credentials=pika.PlainCredentials("guest", "not-the-password-1234"))
    peer = f"127.0.0.1:{local_port}"

    def lines() -> list[str]:
        return shared_broker.log_path.read_text(errors="replace").splitlines()

    def logged() -> bool:
        text = "\n".join(lines())
        return "closing AMQP connection" in text and "login refused: user 'guest'" in text \
            and any(peer in line and "closing AMQP connection" in line for line in lines())

    wait_until(logged, 10, "the connection's log lines")
    mine = [line for line in lines() if peer in line]
    assert any("accepting AMQP connection" in line for line in mine)
    assert any("user 'guest' authenticated and granted access to vhost '/'" in line for line in mine)
    assert any(f"has a client-provided name: {label}" in line for line in mine)
    assert any("closing AMQP connection" in line and "user: 'guest'" in line for line in mine)
    assert any("ERROR" in line and "channel error" in line and
               f"NOT_FOUND - no queue '{missing}' in vhost '/'" in line for line in mine)
    refused = [line for line in lines() if "login refused: user 'guest' - invalid credentials" in line]
    assert refused and "ERROR" in refused[-1]  # RabbitMQ logs it at error
    assert "not-the-password-1234" not in "\n".join(lines())


def test_aio_pika_rpc_pattern_closes_cleanly(shared_broker: Broker) -> None:
    """aio_pika.patterns.RPC: close() cancels the result consumer (its auto-delete queue goes,
    and the auto-delete rpc.dlx exchange with it), then unbinds the queue from rpc.dlx -- which
    RabbitMQ answers with unbind-ok although both are gone."""
    import aio_pika
    from aio_pika.patterns import RPC

    async def scenario() -> int:
        connection = await aio_pika.connect(shared_broker.url)
        try:
            channel = await connection.channel()
            rpc = await RPC.create(channel)

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            await rpc.register("multiply", multiply, auto_delete=True)
            result = await rpc.proxy.multiply(x=6, y=7)
            await rpc.close()
            assert not channel.is_closed  # no NOT_FOUND closed it
            return int(result)
        finally:
            await connection.close()

    assert asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT)) == 42


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, paused: asyncio.Event) -> None:
    try:
        while data := await reader.read(65536):
            while paused.is_set():  # the proxy holds what it read: nothing gets through
                await asyncio.sleep(0.01)
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def test_heartbeats_through_a_stalling_proxy_fail_the_connection_and_a_reconnect_works(
        shared_broker: Broker) -> None:
    """aiormq with a 1 s heartbeat through a loopback TCP proxy that stops forwarding for 5 s:
    the broker closes the connection for missed heartbeats (RabbitMQ: after two intervals), the
    client sees it fail as soon as traffic flows again -- before its own 6 s grace -- and a new
    connection works."""
    port = shared_broker.port
    events: list[str] = []
    peers: list[str] = []  # the proxy's end of each connection to the broker, as the log names it

    async def scenario() -> None:
        paused = asyncio.Event()

        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", port)
            peers.append(f"127.0.0.1:{broker_w.get_extra_info('sockname')[1]}")
            await asyncio.gather(_pipe(client_r, broker_w, paused), _pipe(broker_r, client_w, paused))

        proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
        proxy_port = proxy.sockets[0].getsockname()[1]
        url = f"amqp://guest:guest@127.0.0.1:{proxy_port}/?heartbeat=1"
        try:
            connection = await aiormq.connect(url)
            await connection.channel()
            paused.set()
            await asyncio.sleep(5)
            paused.clear()
            try:
                await asyncio.wait_for(asyncio.shield(connection.closing), 10)
            except TimeoutError:
                events.append("still open")
            except Exception as exc:  # noqa: BLE001 -- aiormq's error for the lost connection
                events.append(f"failed: {type(exc).__name__}")
            else:
                events.append("closed")
            again = await aiormq.connect(shared_broker.url)
            channel = await again.channel()
            await channel.queue_declare("", exclusive=True)
            events.append("reconnected")
            await again.close()
        finally:
            proxy.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert events[0] != "still open", events
    assert events[-1] == "reconnected"
    def closed_for_missed_heartbeats() -> bool:
        return any(peers[0] in line and "missed heartbeats from client, timeout: 1s" in line
                   for line in shared_broker.log_path.read_text(errors="replace").splitlines())

    wait_until(closed_for_missed_heartbeats, 10, "the broker's missed-heartbeats close in its log")


class _StallingProxy:
    """A loopback TCP proxy whose two directions stall on command: a stalled direction is not
    read at all, so the sender's socket buffers fill as on a network that stopped carrying data."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.stalled = {"to_client": asyncio.Event(), "to_broker": asyncio.Event()}
        self.broker_sides: list[str] = []  # the proxy's end of each broker connection (host:port)
        self._tasks: list[asyncio.Task[None]] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        stalled = self.stalled[direction]
        try:
            while True:
                while stalled.is_set():
                    await asyncio.sleep(0.01)
                data = await reader.read(65536)
                if not data:
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.broker_port)
        self.broker_sides.append(f"127.0.0.1:{broker_w.get_extra_info('sockname')[1]}")
        self._tasks += [asyncio.ensure_future(self._pipe(client_r, broker_w, "to_broker")),
                        asyncio.ensure_future(self._pipe(broker_r, client_w, "to_client"))]

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def test_a_stalled_consumer_whose_output_backed_up_is_closed_for_missed_heartbeats(
        shared_broker: Broker, names: Names) -> None:
    """aiormq (heartbeat 1 s) consuming a 20 MiB message through a proxy that first stops
    carrying the broker's output (the client's heartbeats still arrive: the worker stops reading
    it for its unsent output) and then stops both ways: the broker closes the connection for
    missed heartbeats, as RabbitMQ does, instead of holding it and its unacked message forever."""
    queue = names("stalled-consumer")

    def closed_for_missed_heartbeats(peer: str) -> bool:
        return any(peer in line and "missed heartbeats from client, timeout: 1s" in line
                   for line in shared_broker.log_path.read_text(errors="replace").splitlines())

    async def scenario() -> bool:
        proxy = _StallingProxy(shared_broker.port)
        async with proxy as proxy_port:
            consumer = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{proxy_port}/?heartbeat=1")
            publisher = await aiormq.connect(shared_broker.url)
            try:
                channel = await consumer.channel()
                await channel.queue_declare(queue, auto_delete=True)
                await channel.basic_qos(prefetch_count=1)
                await channel.basic_consume(queue, _ignore)
                proxy.stalled["to_client"].set()
                publishing = await publisher.channel()
                await publishing.basic_publish(b"x" * (20 << 20), routing_key=queue)
                await asyncio.sleep(3)  # the client's heartbeats still reach the broker
                proxy.stalled["to_broker"].set()
                for _ in range(200):  # the broker's side of the connection, still held by the proxy
                    if closed_for_missed_heartbeats(proxy.broker_sides[0]):
                        return True
                    await asyncio.sleep(0.1)
                return False
            finally:
                await publisher.close()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(consumer.close(), 1)

    assert asyncio.run(asyncio.wait_for(scenario(), 60)), "the broker kept the stalled connection"


async def _ignore(message: aiormq.abc.DeliveredMessage) -> None:
    pass
