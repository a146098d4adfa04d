"""The floor of a process layout at a light load (`python -m perf.floor`).

How little a broker shaped like Shoal could spend per message at 1,000 msg/s if its processes did
nothing but pass bytes along: no AMQP, no queue, no arena. Each layout below is a chain of trio
processes joined by pipes (a pipe write is a copy and a wake-up, as Shoal's ring record and
eventfd are), fed by a publisher and drained by a consumer over loopback TCP, as a broker is:

- **1 process** (RabbitMQ's shape for this load: one OS process reads the publisher's socket,
  writes the consumer's and reads its acks);
- **3 processes** (Shoal's: the publisher's worker reads the socket and hands the message to the
  supervisor, which hands it to the consumer's worker, which writes it to the consumer's socket
  and reads the consumer's acks, passing them on to the supervisor 50 at a time).

Each comes with trio loops (as Shoal's workers) and without: ``3-epoll`` is the middle process
as a plain ``epoll`` loop (Shoal's supervisor since issue 38), ``3-all-epoll`` and ``1-epoll``
have no trio at all (what leaving trio in the workers too would be worth).

The publisher sends 128-byte messages at `--rate`, each with its send time
(CLOCK_MONOTONIC); the consumer acks each one on its own (8 bytes) and records the latency.
Printed per layout and round: the relays' CPU per message (user + system, `/proc`, over the
whole run) and the latency p50 / p99. What Shoal spends above the 3-process figure is its own
work and the cost of waking processes that do it (`python -m perf.idle_cost` prints Shoal's
and RabbitMQ's whole figures).

    python -m perf.floor                      # 1 and 3 processes, with trio and without, 2 rounds, 6 s each
    python -m perf.floor --layouts 3,3-one-task --rounds 3
    python -m perf.floor --rounds 3 --seconds 10

Every process it starts is a child it ends by PID and waits for; the sockets are connected
pairs made on 127.0.0.1 and closed at the end.
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

import trio

MESSAGE = 128
ACK = 8
ACKS_PER_RECORD = 50  # the consumer's worker passes acks on in batches (Shoal's lazy settle)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair: (client end, broker end)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        broker, _ = listener.accept()
    for sock in (client, broker):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, broker


def _reader(source: int | socket.socket) -> Callable[[], bytes]:
    """``source`` (a pipe end or a socket) made non-blocking, and a read of up to 64 KiB of it."""
    if isinstance(source, socket.socket):
        source.setblocking(False)
        return functools.partial(source.recv, 65536)
    os.set_blocking(source, False)
    return functools.partial(os.read, source, 65536)


def _ack_batcher(acks_fd: int | None) -> Callable[[bytes], None]:
    """What a consumer's relay does with the acks it reads: count them and pass the count on to
    ``acks_fd`` ``ACKS_PER_RECORD`` at a time (drop them if ``acks_fd`` is None: one process
    settles them itself)."""
    held = 0

    def acked(data: bytes) -> None:
        nonlocal held
        held += len(data) // ACK
        if acks_fd is not None and held >= ACKS_PER_RECORD:
            os.write(acks_fd, struct.pack("q", held))
            held = 0

    return acked


async def _pump(source: int | socket.socket, handle: Callable[[bytes], object]) -> None:
    """Wait for bytes on a pipe end or socket and hand each read to ``handle``, until end of
    file: a relay's whole loop."""
    read = _reader(source)
    while True:
        await trio.lowlevel.wait_readable(source)
        try:
            data = read()
        except BlockingIOError:
            continue
        if not data:
            return
        handle(data)


async def _forward(source: int | socket.socket, write_fd: int) -> None:
    """The publisher's worker (from its socket), or the supervisor (from a pipe): on to the
    next process."""
    await _pump(source, functools.partial(os.write, write_fd))


async def _deliver(read_fd: int | socket.socket, sock: socket.socket, acks_fd: int | None) -> None:
    """The consumer's worker (``read_fd`` from the previous process), or one process doing
    all (``read_fd`` the publisher's socket): messages to the consumer's socket; its acks read
    and passed on ``ACKS_PER_RECORD`` at a time (dropped if ``acks_fd`` is None: one process
    settles them itself)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pump, sock, _ack_batcher(acks_fd))
        await _pump(read_fd, sock.send)
        nursery.cancel_scope.cancel()


async def _supervisor(read_fd: int, write_fd: int, acks_fd: int) -> None:
    """The middle process: forwards messages, takes the consumer worker's ack batches (a trio
    task per input, as Shoal's supervisor had a task per worker's ring)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pump, acks_fd, len)
        await _forward(read_fd, write_fd)
        nursery.cancel_scope.cancel()


def _epoll_of(*fds: int) -> select.epoll:
    epoll = select.epoll()
    for fd in fds:
        os.set_blocking(fd, False)
        epoll.register(fd, select.EPOLLIN)
    return epoll


def _relay_ready(epoll: select.epoll, read_fd: int, write_fd: int, timeout: float) -> bool:
    """One turn of a single-loop middle process: every input that is ready; False at end of file."""
    for fd, _ in epoll.poll(timeout):
        data = os.read(fd, 65536)
        if not data:
            return False
        if fd == read_fd:
            os.write(write_fd, data)
    return True


async def _supervisor_one_task(read_fd: int, write_fd: int, acks_fd: int) -> None:
    """The middle process as one trio task waiting on one epoll fd that holds both inputs (the
    supervisor's ring loop since issue 38)."""
    epoll = _epoll_of(read_fd, acks_fd)
    while True:
        await trio.lowlevel.wait_readable(epoll.fileno())
        if not _relay_ready(epoll, read_fd, write_fd, 0):
            return


def _supervisor_epoll(read_fd: int, write_fd: int, acks_fd: int) -> None:
    """The middle process without trio: a blocking epoll loop."""
    epoll = _epoll_of(read_fd, acks_fd)
    while _relay_ready(epoll, read_fd, write_fd, -1):
        pass


def _forward_epoll(source: int | socket.socket, write_fd: int) -> None:
    """:func:`_forward` without trio: a blocking epoll loop on its one input."""
    read = _reader(source)
    epoll = select.epoll()
    epoll.register(source, select.EPOLLIN)
    while True:
        epoll.poll(-1)
        try:
            data = read()
        except BlockingIOError:
            continue
        if not data:
            return
        os.write(write_fd, data)


def _deliver_epoll(read_fd: int | socket.socket, sock: socket.socket, acks_fd: int | None) -> None:
    """:func:`_deliver` without trio: one blocking epoll loop over the messages' input and the
    consumer's socket (its acks)."""
    read_messages = _reader(read_fd)
    read_acks = _reader(sock)
    acked = _ack_batcher(acks_fd)
    messages_fd = read_fd if isinstance(read_fd, int) else read_fd.fileno()
    epoll = select.epoll()
    epoll.register(messages_fd, select.EPOLLIN)
    epoll.register(sock.fileno(), select.EPOLLIN)
    while True:
        for fd, _ in epoll.poll(-1):
            try:
                data = read_messages() if fd == messages_fd else read_acks()
            except BlockingIOError:
                continue
            if not data:
                return
            if fd == messages_fd:
                sock.send(data)
            else:
                acked(data)


def _child(target: object, *args: object, plain: bool = False) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if plain:
                target(*args)  # type: ignore[operator]
            else:
                trio.run(target, *args)  # type: ignore[arg-type]
        except BaseException:  # noqa: BLE001 -- a child reports and exits, never returns
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def _consumer(sock: socket.socket, count: int, result_fd: int) -> int:
    """Receive ``count`` messages, ack each on its own, write p50 and p99 (µs) to ``result_fd``."""
    pid = os.fork()
    if pid != 0:
        return pid
    latencies: list[int] = []
    buffered = b""
    ack = b"a" * ACK
    while len(latencies) < count:
        data = sock.recv(65536)
        if not data:
            break
        buffered += data
        while len(buffered) >= MESSAGE:
            (sent,) = struct.unpack_from("q", buffered)
            latencies.append(time.monotonic_ns() - sent)
            buffered = buffered[MESSAGE:]
            sock.sendall(ack)
    latencies.sort()
    n = len(latencies)
    os.write(result_fd, struct.pack("ddq", latencies[n // 2] / 1e3 if n else 0.0,
                                    latencies[int(n * 0.99)] / 1e3 if n else 0.0, n))
    os._exit(0)


def _cpu_s(pid: int) -> tuple[float, int]:
    """CPU-seconds (user + system) and context switches (voluntary + not) of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    switches = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), switches


# The layouts: name -> how the middle process (Shoal's supervisor) waits; "1" is one process.
LAYOUTS = {
    "1": "one process (RabbitMQ's shape)",
    "3": "3 processes, a trio task per input in the middle",
    "3-one-task": "3 processes, one trio task on one epoll fd in the middle",
    "3-epoll": "3 processes, a plain epoll loop in the middle (no trio)",
    "3-all-epoll": "3 processes, each a plain epoll loop (no trio anywhere: the workers too)",
    "1-epoll": "one process, a plain epoll loop (no trio)",
}


def run_layout(layout: str, rate: float, seconds: float) -> dict[str, object]:
    """One run of a layout: each relay's µs of CPU and context switches per message, latency
    p50 / p99 in µs."""
    count = int(rate * seconds)
    pub_client, pub_broker = _tcp_pair()
    con_client, con_broker = _tcp_pair()
    result_r, result_w = os.pipe()
    consumer = _consumer(con_client, count, result_w)
    con_client.close()
    os.close(result_w)
    relays: list[int] = []
    if layout == "1":
        relays.append(_child(_deliver, pub_broker, con_broker, None))
    elif layout == "1-epoll":
        relays.append(_child(_deliver_epoll, pub_broker, con_broker, None, plain=True))
    else:
        to_sup_r, to_sup_w = os.pipe()
        to_con_r, to_con_w = os.pipe()
        acks_r, acks_w = os.pipe()
        plain = layout == "3-all-epoll"
        if plain:
            relays.append(_child(_forward_epoll, pub_broker, to_sup_w, plain=True))
        else:
            relays.append(_child(_forward, pub_broker, to_sup_w))
        if layout in ("3-epoll", "3-all-epoll"):
            relays.append(_child(_supervisor_epoll, to_sup_r, to_con_w, acks_r, plain=True))
        else:
            middle = _supervisor_one_task if layout == "3-one-task" else _supervisor
            relays.append(_child(middle, to_sup_r, to_con_w, acks_r))
        if plain:
            relays.append(_child(_deliver_epoll, to_con_r, con_broker, acks_w, plain=True))
        else:
            relays.append(_child(_deliver, to_con_r, con_broker, acks_w))
        for fd in (to_sup_r, to_sup_w, to_con_r, to_con_w, acks_r, acks_w):
            os.close(fd)
    pub_broker.close()
    con_broker.close()
    time.sleep(0.3)  # the children are up and waiting
    before = [_cpu_s(pid) for pid in relays]
    padding = b"p" * (MESSAGE - 8)
    start = time.monotonic()
    for i in range(count):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        pub_client.sendall(struct.pack("q", time.monotonic_ns()) + padding)
    result = b""
    deadline = time.monotonic() + 10.0
    while len(result) < 24 and time.monotonic() < deadline:
        chunk = os.read(result_r, 24 - len(result))
        if not chunk:
            break
        result += chunk
    after = [_cpu_s(pid) for pid in relays]
    pub_client.close()
    for pid in relays:  # each holds the others' descriptors too: ended by PID, not end of file
        os.kill(pid, signal.SIGTERM)
    for pid in [*relays, consumer]:
        os.waitpid(pid, 0)
    os.close(result_r)
    p50, p99, received = struct.unpack("ddq", result) if len(result) == 24 else (0.0, 0.0, 0)
    n = max(received, 1)
    per = [((a[0] - b[0]) / n * 1e6, (a[1] - b[1]) / n) for a, b in zip(after, before, strict=True)]
    return {"layout": layout, "us_per_msg": sum(us for us, _ in per), "per_process": per,
            "p50_us": p50, "p99_us": p99, "received": received, "sent": count}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="msg/s (1000)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per layout and round (6)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the layouts alternating (2)")
    parser.add_argument("--layouts", default="1,1-epoll,3,3-epoll,3-all-epoll",
                        help="comma-separated, of: " + "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items()))
    args = parser.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layout(s): {', '.join(unknown)}")
    for round_no in range(1, args.rounds + 1):
        for layout in layouts if round_no % 2 else layouts[::-1]:
            res = run_layout(layout, args.rate, args.seconds)
            per = "  ".join(f"{us:5.1f} us {cs:.2f} cs" for us, cs in res["per_process"])  # type: ignore[attr-defined]
            print(f"round {round_no}  {layout:<10}: {res['us_per_msg']:6.1f} us of CPU a message "
                  f"({per})   p50 {res['p50_us']:6.1f} us   p99 {res['p99_us']:6.1f} us"
                  f"   ({res['received']:,} of {res['sent']:,} received)")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
