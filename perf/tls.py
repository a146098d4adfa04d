"""TLS variants of S1 (1 publisher -> 1 queue -> 1 consumer), plain beside TLS, with pika.

    .venv/bin/python -m perf.tls                     # Shoal: plain and TLS, 128 B and 256 KiB
    .venv/bin/python -m perf.tls --rabbitmq          # and RabbitMQ's TLS listener side by side
    .venv/bin/python -m perf.tls --seconds 5 --workers 2

The C generator (perf/cgen) speaks plain TCP only, so both sides here are pika processes (the
same client on every row: the figures compare the listeners, not the clients). Certificates
are made with the openssl command line in a temporary directory. Timings are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

HOST = "127.0.0.1"
BODIES = {"128 B": 128, "256 KiB": 256 * 1024}
COUNTS = {128: 200_000, 256 * 1024: 4_000}


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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start_shoal(d: Path, workers: int) -> tuple[subprocess.Popen[bytes], int, int]:
    ready = d / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0", "--workers", str(workers),
         "--management-port", "0", "--prometheus-port", "0", "--data-dir", str(d / "data"),
         "--control-socket", str(d / "c.sock"), "--ready-file", str(ready), "--log-level", "warning",
         "--tls-port", str(_free_port()), "--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key")],
        cwd=Path(__file__).resolve().parents[1], start_new_session=True)
    limit = time.monotonic() + 30
    while time.monotonic() < limit:
        if ready.exists():
            info = json.loads(ready.read_text())
            if len(info["worker_pids"]) == workers:
                return proc, int(info["port"]), int(info["tls_port"])
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("shoal did not start")


def start_rabbitmq(d: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    port, tls_port = _free_port(), _free_port()
    conf = d / "rabbitmq.conf"
    conf.write_text(
        f"listeners.tcp.default = {port}\nlisteners.ssl.default = {tls_port}\n"
        f"ssl_options.certfile = {d / 'server.pem'}\nssl_options.keyfile = {d / 'server.key'}\n"
        f"ssl_options.cacertfile = {d / 'ca.pem'}\nssl_options.verify = verify_none\n"
        "ssl_options.versions.1 = tlsv1.3\nssl_options.versions.2 = tlsv1.2\n"
        "loopback_users = none\n")
    env = {**os.environ, "RABBITMQ_NODENAME": f"perftls{os.getpid()}@localhost",
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
           "RABBITMQ_LOG_BASE": str(d / "log"), "RABBITMQ_CONFIG_FILE": str(conf),
           "RABBITMQ_DIST_PORT": str(_free_port()), "RABBITMQ_ENABLED_PLUGINS": "[]",
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins")}
    (d / "enabled_plugins").write_text("[].\n")
    proc = subprocess.Popen(["rabbitmq-server"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    limit = time.monotonic() + 90
    while time.monotonic() < limit:
        try:
            pika.BlockingConnection(_params(tls_port, str(d / "ca.pem"))).close()
            return proc, port, tls_port
        except Exception:  # noqa: BLE001 -- not up yet
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit("rabbitmq did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rabbitmq", action="store_true")
    args = parser.parse_args()
    d = Path(tempfile.mkdtemp(prefix="perf-tls-"))
    rows: list[tuple[str, str, str, dict[str, float]]] = []
    try:
        make_certs(d)
        brokers = [("Shoal", start_shoal)]
        if args.rabbitmq and shutil.which("rabbitmq-server"):
            brokers.append(("RabbitMQ", lambda d, _w: start_rabbitmq(d)))
        for name, start in brokers:
            proc, port, tls_port = start(d, args.workers)  # type: ignore[operator]
            try:
                for label, size in BODIES.items():
                    for transport, p, ca in (("plain", port, None), ("TLS", tls_port, str(d / "ca.pem"))):
                        result = one_run(p, ca, size, args.seconds)
                        rows.append((name, label, transport, result))
                        print(f"{name:8} {label:8} {transport:5} {result['msg_s']:10.0f} msg/s "
                              f"{result['mib_s']:8.1f} MiB/s", file=sys.stderr)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("| broker | body | transport | msg/s | MiB/s |\n|---|---|---|---:|---:|")
    for name, label, transport, result in rows:
        print(f"| {name} | {label} | {transport} | {result['msg_s']:.0f} | {result['mib_s']:.1f} |")


if __name__ == "__main__":
    main()
