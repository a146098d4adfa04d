"""A worker's memory under method floods never read (`python -m perf.flood_memory`), issue 38.

N raw-socket clients connect to a one-worker Shoal (each with a 4 KiB receive buffer, so the
kernel holds little of the broker's output), then each pipelines `--frames` basic.qos frames
(19 octets each; every one answered by a 12-octet qos-ok) and never reads its socket. Sending
is round-robin on non-blocking sockets and ends when every client has sent its frames, when
none of them made progress for `--stall` seconds (the worker stopped reading them all), or
after `--limit` seconds. Then, once the worker's CPU time stands still for a second, its RSS
(psutil) is read again: the growth per connection is what a connection's unread replies cost
it. `--frames 0` floods each client until the worker stops reading it (the bound itself).

    python -m perf.flood_memory                       # 1, 100 and 1,000 connections
    python -m perf.flood_memory --counts 1 --frames 0 # one client, to the bound
    python -m perf.flood_memory --json out.json

The broker runs as `perf.brokers.ShoalBroker` (its own data directory) and is stopped by PID
at the end of each row, also on Ctrl-C; the clients are sockets of this process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands, frame
from pamqp.common import FieldTable

from perf.brokers import HOST, ShoalBroker
from perf.wire import PROTOCOL_HEADER, split_frames

MiB = 1 << 20
QOS = frame.marshal(commands.Basic.Qos(prefetch_count=10), 1)
CHANNEL_OPEN_OK = frame.marshal(commands.Channel.OpenOk(), 1)


def _handshake_bytes() -> bytes:
    return b"".join([
        PROTOCOL_HEADER,
        frame.marshal(commands.Connection.StartOk(
            client_properties=FieldTable(product="shoal-flood", capabilities={}),
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"), 0),
        frame.marshal(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0),
        frame.marshal(commands.Connection.Open(virtual_host="/"), 0),
        frame.marshal(commands.Channel.Open(), 1),
    ])


def connect(port: int, timeout: float = 30.0) -> socket.socket:
    """A connection past channel.open-ok on channel 1, with a small receive buffer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)
    sock.connect((HOST, port))
    sock.sendall(_handshake_bytes())
    buf = bytearray()
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the broker closed a connection during the handshake")
        buf += chunk
        frames, used = split_frames(buf)
        del buf[:used]
        if any(raw == CHANNEL_OPEN_OK for _ch, raw in frames):
            break
    sock.setblocking(False)
    return sock


def settle(process: psutil.Process, quiet: float = 1.0, limit: float = 120.0) -> None:
    """Wait until ``process`` used (almost) no CPU for ``quiet`` seconds."""
    end = time.monotonic() + limit
    last = sum(process.cpu_times()[:2])
    while time.monotonic() < end:
        time.sleep(quiet)
        now = sum(process.cpu_times()[:2])
        if now - last < 0.02 * quiet:
            return
        last = now


def flood(socks: list[socket.socket], frames: int, stall: float, limit: float) -> tuple[int, bool]:
    """Each socket sends ``frames`` basic.qos (0: without end) round-robin; (octets sent in
    all, whether it ended because nothing moved for ``stall`` seconds)."""
    chunk = QOS * 4096
    left = [frames * len(QOS) if frames else -1] * len(socks)
    pos = [0] * len(socks)
    total = 0
    end = time.monotonic() + limit
    last_progress = time.monotonic()
    while time.monotonic() < end:
        moved = False
        busy = False
        for i, sock in enumerate(socks):
            if left[i] == 0:
                continue
            busy = True
            p = pos[i]
            want = len(chunk) - p if left[i] < 0 else min(len(chunk) - p, left[i])
            try:
                n = sock.send(memoryview(chunk)[p:p + want])
            except BlockingIOError:
                continue
            moved = True
            total += n
            pos[i] = (p + n) % len(chunk)
            if left[i] > 0:
                left[i] -= n
        if not busy:
            return total, False
        if moved:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress >= stall:
            return total, True
        else:
            time.sleep(0.01)
    return total, False


def rss_parts(process: psutil.Process) -> dict[str, int]:
    """The process's resident memory by kind (/proc/PID/status, octets): RssAnon (its heap:
    what a connection's output and parsing cost), RssFile, RssShmem (the shared rings and
    arena pages it touched)."""
    parts = {}
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            parts[key] = int(value.split()[0]) * 1024
    return parts


def run_row(count: int, frames: int, stall: float, limit: float) -> dict[str, Any]:
    broker = ShoalBroker(1)
    socks: list[socket.socket] = []
    try:
        worker = broker.processes()["worker0"]
        for _ in range(count):
            socks.append(connect(broker.port))
        settle(worker)
        before = worker.memory_info().rss
        parts_before = rss_parts(worker)
        started = time.monotonic()
        sent, stalled = flood(socks, frames, stall, limit)
        settle(worker)
        after = worker.memory_info().rss
        parts_after = rss_parts(worker)
        return {
            "connections": count, "frames": frames, "sent_octets": sent,
            "replies": sent // len(QOS), "stalled": stalled,
            "seconds": round(time.monotonic() - started, 1),
            "rss_before": before, "rss_after": after,
            "growth_per_connection": (after - before) / count,
            "growth_by_kind": {k: parts_after[k] - parts_before[k] for k in parts_after},
        }
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        for problem in broker.stop():
            print(problem, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,100,1000", help="connection counts, one row each")
    parser.add_argument("--frames", type=int, default=10_000,
                        help="basic.qos per connection (0: until the worker stops reading it)")
    parser.add_argument("--stall", type=float, default=3.0)
    parser.add_argument("--limit", type=float, default=180.0, help="seconds of flooding at most")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    rows = []
    print("connections  frames/conn  replies  stalled  RSS growth  per connection  anon / shmem / file")
    for count in (int(c) for c in args.counts.split(",")):
        row = run_row(count, args.frames, args.stall, args.limit)
        rows.append(row)
        growth = row["rss_after"] - row["rss_before"]
        print(f"{count:>11}  {args.frames:>11}  {row['replies']:>7}  {row['stalled']!s:>7}  "
              f"{growth / MiB:>7.1f} MiB  {row['growth_per_connection'] / 1024:>10.1f} KiB  "
              + " / ".join(f"{row['growth_by_kind'][k] / MiB:.1f}" for k in ("RssAnon", "RssShmem", "RssFile"))
              + " MiB",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
