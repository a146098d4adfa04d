"""`shoal serve --huge-pages` (cli.heap): the broker started again in its own process (the PID
the caller started, as the ready file says), every worker with Python's heap from glibc's
allocator on transparent huge pages, and the broker serving as without it."""

from __future__ import annotations

from pathlib import Path

import pika

from cli.heap import thp_setting
from tests.integration.harness import Broker, finish


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def _huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_huge_pages_run_every_process_on_the_malloc_heap_and_serve(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "b", extra_args=["--huge-pages"])  # checks the ready file's PID
    try:
        pids = [broker.pid, *broker.worker_pids]
        for pid in pids:
            env = _environ(pid)
            assert env.get("PYTHONMALLOC") == "malloc"
            assert "glibc.malloc.hugetlb=1" in env.get("GLIBC_TUNABLES", "").split(":")
        conn = broker.connect()
        ch = conn.channel()
        ch.queue_declare("hp", durable=True)
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", "hp", b"x" * (i * 97), pika.BasicProperties(delivery_mode=2))
        got = []
        for method, _, body in ch.consume("hp", inactivity_timeout=5):
            if method is None:
                break
            got.append(len(body))
            ch.basic_ack(method.delivery_tag)
            if len(got) == 200:
                break
        assert got == [i * 97 for i in range(200)]
        mode = thp_setting()
        log = broker.log_path.read_text()
        if mode in ("always", "madvise"):
            assert f"the kernel's mode: {mode}" in log
            # what the option is for: each process's heap on 2 MiB pages
            assert all(_huge_kib(pid) > 0 for pid in pids), [_huge_kib(p) for p in pids]
        elif mode == "never":
            assert "transparent huge pages are off" in log
    finally:
        finish(broker)
