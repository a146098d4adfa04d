"""Does the management API cost the message path? A fixed load with the API off, then on and polled.

``python -m perf.management_load [--queues 10000] [--seconds 5] [--rounds 2] [--workers 2]``

Each run starts its own broker (perf.brokers.ShoalBroker), declares ``--queues`` queues BEFORE
the measured window, and, with the API on, starts a poller that GETs /api/queues (every queue)
and /metrics once a second; then one pika publisher and one no-ack pika consumer on one more
queue move messages for ``--seconds``. It prints delivered msg/s and the broker's CPU seconds
per 1,000 messages (supervisor and workers; the management process apart), API off and
on, alternating, ``--rounds`` times. The clients are pika (slow, but the same in both runs):
the broker's CPU per message is the figure to compare.
"""

from __future__ import annotations

import argparse
import base64
import socket
import threading
import time
import urllib.request
from typing import Any

import pika
import psutil

from perf.brokers import HOST, ShoalBroker


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the broker's message path (supervisor, workers) and of its management
    process."""
    parent = psutil.Process(pid)
    path = management = 0.0
    for p in [parent, *parent.children(recursive=True)]:
        try:
            t = p.cpu_times()
            if "management.process" in " ".join(p.cmdline()):
                management += t.user + t.system
            else:
                path += t.user + t.system
        except psutil.Error:
            continue
    return path, management


def poll(http: int, prom: int, stop: threading.Event, counts: dict[str, int]) -> None:
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    while not stop.is_set():
        started = time.monotonic()
        for url in (f"http://{HOST}:{http}/api/queues", f"http://{HOST}:{prom}/metrics"):
            req = urllib.request.Request(url)
            req.add_header("Authorization", auth)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    counts["bytes"] += len(resp.read())
                    counts["polls"] += 1
            except OSError:
                counts["errors"] += 1
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))


def one_run(api: bool, queues: int, seconds: float, workers: int) -> dict[str, Any]:
    http, prom = (free_port(), free_port()) if api else (0, 0)
    broker = ShoalBroker(workers, ["--management-port", str(http), "--prometheus-port", str(prom)])
    try:
        params = pika.ConnectionParameters(HOST, broker.port)
        setup = pika.BlockingConnection(params)
        ch = setup.channel()
        for i in range(queues):
            ch.queue_declare(f"idle-{i}")
        ch.queue_declare("load")
        setup.close()
        stop = threading.Event()
        counts = {"polls": 0, "bytes": 0, "errors": 0}
        poller = threading.Thread(target=poll, args=(http, prom, stop, counts), daemon=True)
        if api:
            poller.start()
            time.sleep(2.0)  # the first full samples are taken before the window
        delivered = [0]
        done = threading.Event()

        def consume() -> None:
            conn = pika.BlockingConnection(params)
            c = conn.channel()

            def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
                delivered[0] += 1

            c.basic_consume("load", on_message, auto_ack=True)
            while not done.is_set():
                conn.process_data_events(time_limit=0.1)
            conn.close()

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        time.sleep(0.5)
        pub = pika.BlockingConnection(params)
        pch = pub.channel()
        body = b"x" * 100
        cpu0, t0, d0 = tree_cpu(broker.popen.pid), time.monotonic(), delivered[0]
        while time.monotonic() - t0 < seconds:
            for _ in range(100):
                pch.basic_publish("", "load", body)
            pub.process_data_events(time_limit=0)
        elapsed = time.monotonic() - t0
        cpu1, d1 = tree_cpu(broker.popen.pid), delivered[0]
        pub.close()
        done.set()
        stop.set()
        consumer.join(10)
        if api:
            poller.join(35)
        n = d1 - d0
        path, management = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        return {"api": api, "msg_s": n / elapsed, "cpu_s": path, "mgmt_cpu_s": management,
                "cpu_ms_per_1k": 1e6 * path / max(n, 1),
                "polls": counts["polls"], "poll_mb": counts["bytes"] / 1e6, "errors": counts["errors"]}
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"{'API':<5} {'msg/s':>9} {'path CPU s':>11} {'ms/1k msg':>10} {'mgmt CPU s':>11} "
          f"{'polls':>6} {'polled MB':>10}")
    for _ in range(args.rounds):
        for api in (False, True):
            r = one_run(api, args.queues, args.seconds, args.workers)
            print(f"{'on' if api else 'off':<5} {r['msg_s']:>9.0f} {r['cpu_s']:>11.2f} "
                  f"{r['cpu_ms_per_1k']:>10.1f} {r['mgmt_cpu_s']:>11.2f} {r['polls']:>6} "
                  f"{r['poll_mb']:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
