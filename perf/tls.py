"""TLS variants of S1 (1 publisher -> 1 queue -> 1 consumer), plain beside TLS, with pika.

    .venv/bin/python -m perf.tls                     # Shoal: plain and TLS, 128 B and 256 KiB
    .venv/bin/python -m perf.tls --rabbitmq          # and RabbitMQ's TLS listener side by side
    .venv/bin/python -m perf.tls --seconds 5 --workers 2
    .venv/bin/python -m perf.tls --rabbitmq --rounds 3   # medians of three runs of each row

The C generator (perf/cgen) speaks plain TCP only, so both sides here are pika processes (the
same client on every row: the figures compare the listeners, not the clients). Certificates
are made with the openssl command line in a temporary directory. Each row prints msg/s and msg
per broker CPU-second (psutil, every process of the broker: on a loaded host the steadier
figure). RabbitMQ is perf.brokers' private node (its own node name, ports, HOME, mnesia and log
directories under /tmp, run as this user, so it reads the key file) with ``listeners.ssl.default``
and ``ssl_options.*`` in its rabbitmq.conf. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import psutil

from perf.brokers import Broker, RabbitBroker, ShoalBroker, free_port, rabbitmq_wanted

HOST = "127.0.0.1"
BODIES = {"128 B": 128, "256 KiB": 256 * 1024}
COUNTS = {128: 200_000, 256 * 1024: 4_000}
RABBIT_TLS_READY = 60.0  # seconds for the ssl listener's first handshake, after AMQP answers


def make_certs(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=perf-ca")
    run("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")


def _params(port: int, ca: str | None) -> pika.ConnectionParameters:
    ssl_options = None
    if ca is not None:
        ssl_options = pika.SSLOptions(ssl.create_default_context(cafile=ca), "localhost")
    return pika.ConnectionParameters(HOST, port, ssl_options=ssl_options, heartbeat=0,
                                     frame_max=131072)


def _publisher(port: int, ca: str | None, queue: str, size: int, count: int, seconds: float,
               window: Any) -> None:
    connection = pika.BlockingConnection(_params(port, ca))
    channel = connection.channel()
    body = os.urandom(size)
    limit = time.monotonic() + seconds
    for n in range(count):
        while n - window.value > 2000:  # keep within a window of the consumer, as perf/ does
            connection.sleep(0.0005)
        channel.basic_publish("", queue, body)
        if time.monotonic() > limit:
            break
    channel.basic_publish("", queue, b"end")
    connection.close()


def _consumer(port: int, ca: str | None, queue: str, out: Any, window: Any) -> None:
    connection = pika.BlockingConnection(_params(port, ca))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    state = {"n": 0, "bytes": 0, "first": 0.0, "last": 0.0}

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        if body == b"end":
            ch.basic_ack(method.delivery_tag, multiple=True)
            ch.stop_consuming()
            return
        if not state["n"]:
            state["first"] = time.monotonic()
        state["n"] += 1
        state["bytes"] += len(body)
        state["last"] = time.monotonic()
        window.value = state["n"]
        if state["n"] % 50 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)

    channel.basic_consume(queue, on_message)
    out.put("ready")
    channel.start_consuming()
    connection.close()
    out.put(state)


def one_run(port: int, ca: str | None, size: int, seconds: float) -> dict[str, float]:
    queue = f"perf-tls-{os.getpid()}-{time.monotonic_ns()}"
    setup = pika.BlockingConnection(_params(port, ca))
    setup.channel().queue_declare(queue, auto_delete=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    window = ctx.Value("q", 0, lock=False)
    consumer = ctx.Process(target=_consumer, args=(port, ca, queue, out, window))
    consumer.start()
    assert out.get(timeout=30) == "ready"
    publisher = ctx.Process(target=_publisher,
                            args=(port, ca, queue, size, COUNTS[size], seconds, window))
    publisher.start()
    state = out.get(timeout=seconds + 120)
    publisher.join(30)
    consumer.join(30)
    setup.channel().queue_delete(queue)
    setup.close()
    elapsed = max(state["last"] - state["first"], 1e-9)
    return {"msgs": state["n"], "msg_s": state["n"] / elapsed,
            "mib_s": state["bytes"] / elapsed / (1 << 20)}


def broker_cpu(broker: Broker) -> float:
    """CPU seconds (user + system) the broker's processes have used so far."""
    total = 0.0
    for process in broker.processes().values():
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def start_shoal(d: Path, workers: int) -> tuple[Broker, int]:
    """Shoal with an AMQPS listener beside the plain one; the broker and its TLS port."""
    broker = ShoalBroker(workers, [
        "--tls-port", str(free_port()), "--tls-cert", str(d / "server.pem"),
        "--tls-key", str(d / "server.key"), "--management-port", "0", "--prometheus-port", "0"])
    info = json.loads(broker.ready_file.read_text())
    return broker, int(info["tls_port"])


class TLSRabbit(RabbitBroker):
    """perf.brokers' private RabbitMQ node (its own node name, ports, HOME, mnesia and log
    directories under /tmp, run as this user) with an ssl listener: ``listeners.ssl.default``
    and the ``ssl_options`` files, TLS 1.2 and 1.3 (what Shoal takes), no client certificate."""

    certs: Path
    tls_port = 0

    def _start(self) -> None:
        self.tls_port = free_port()
        (self.directory / "rabbitmq.conf").write_text(
            f"listeners.ssl.default = {self.tls_port}\n"
            f"ssl_options.cacertfile = {self.certs / 'ca.pem'}\n"
            f"ssl_options.certfile = {self.certs / 'server.pem'}\n"
            f"ssl_options.keyfile = {self.certs / 'server.key'}\n"
            "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
            "ssl_options.versions.1 = tlsv1.3\nssl_options.versions.2 = tlsv1.2\n"
            "loopback_users = none\n")
        super()._start()


def start_rabbitmq(d: Path, _workers: int) -> tuple[Broker, int]:
    TLSRabbit.certs = d
    broker = TLSRabbit()
    # The AMQP port answers first; the ssl listener is up by then, but wait for its handshake.
    limit = time.monotonic() + RABBIT_TLS_READY
    while True:
        try:
            pika.BlockingConnection(_params(broker.tls_port, str(d / "ca.pem"))).close()
            return broker, broker.tls_port
        except pika.exceptions.AMQPError as exc:
            if time.monotonic() > limit:
                log = broker.log_tail()
                broker.stop()
                raise SystemExit(f"rabbitmq's TLS listener did not answer: {exc!r}\n{log}") from None
            time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rabbitmq", action="store_true")
    parser.add_argument("--no-shoal", action="store_true", help="RabbitMQ only (with --rabbitmq)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each row this many times on one broker; the table has the medians")
    args = parser.parse_args()
    d = Path(tempfile.mkdtemp(prefix="perf-tls-"))
    rows: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    brokers: list[tuple[str, Callable[[Path, int], tuple[Broker, int]]]] = []
    if not args.no_shoal:
        brokers.append(("Shoal", start_shoal))
    if args.rabbitmq and rabbitmq_wanted():
        brokers.append(("RabbitMQ", start_rabbitmq))
    try:
        make_certs(d)
        for name, start in brokers:
            broker, tls_port = start(d, args.workers)
            try:
                for _round, (label, size), (transport, port, ca) in itertools.product(
                        range(args.rounds), BODIES.items(),
                        (("plain", broker.port, None), ("TLS", tls_port, str(d / "ca.pem")))):
                    cpu = broker_cpu(broker)
                    result = one_run(port, ca, size, args.seconds)
                    result["msg_cpu_s"] = result["msgs"] / max(broker_cpu(broker) - cpu, 1e-9)
                    rows.setdefault((name, label, transport), []).append(result)
                    print(f"{name:8} {label:8} {transport:5} {result['msg_s']:10.0f} msg/s "
                          f"{result['mib_s']:8.1f} MiB/s {result['msg_cpu_s']:10.0f} msg/CPU-s",
                          file=sys.stderr)
            finally:
                for problem in broker.stop():
                    print(problem, file=sys.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("| broker | body | transport | msg/s | MiB/s | msg per broker CPU-s |")
    print("|---|---|---|---:|---:|---:|")
    for (name, label, transport), results in rows.items():
        msg_s, mib_s, msg_cpu_s = (statistics.median(r[key] for r in results)
                                   for key in ("msg_s", "mib_s", "msg_cpu_s"))
        print(f"| {name} | {label} | {transport} | {msg_s:.0f} | {mib_s:.1f} | {msg_cpu_s:.0f} |")


if __name__ == "__main__":
    main()
