"""Every broker process's heap on huge pages (ipc/huge_pages.py): `shoal serve` starts itself
again with glibc's tunable (the PID the caller started, as the ready file says), the supervisor
and each worker put pymalloc's arenas on 2 MiB pages before their imports, and the log says so;
SHOAL_SMALL_PAGES=1 leaves it all out."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from ipc.huge_pages import LIBRARY, thp_setting
from tests.integration.harness import Broker, finish


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def _huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def _round_trip(broker: Broker) -> list[int]:
    conn = broker.connect()
    try:
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
        return got
    finally:
        conn.close()


@pytest.mark.skipif(not LIBRARY.exists(), reason=f"{LIBRARY} not built (make arenas)")
def test_every_process_puts_its_heap_on_huge_pages_and_serves(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "b")  # the harness checks the ready file names this PID
    try:
        pids = [broker.pid, *broker.worker_pids]
        for pid in pids:
            assert "glibc.malloc.hugetlb=1" in _environ(pid).get("GLIBC_TUNABLES", "").split(":")
        assert _round_trip(broker) == [i * 97 for i in range(200)]
        mode = thp_setting()
        assert (f"heap on huge pages: pymalloc's arenas on; glibc's heap on; the kernel's THP "
                f"mode: {mode or 'unknown'}") in broker.log_path.read_text()
        if mode in ("madvise", "always"):
            assert all(_huge_kib(pid) > 0 for pid in pids), [_huge_kib(p) for p in pids]
    finally:
        finish(broker)


def test_small_pages_leaves_the_heap_as_it_was(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_SMALL_PAGES", "1")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    broker = Broker(tmp_path / "b")
    try:
        for pid in [broker.pid, *broker.worker_pids]:
            assert "hugetlb" not in _environ(pid).get("GLIBC_TUNABLES", "")
            if thp_setting() == "madvise":  # ("always" would give some unasked)
                assert _huge_kib(pid) == 0
        assert _round_trip(broker) == [i * 97 for i in range(200)]
        assert ("pymalloc's arenas off (SHOAL_SMALL_PAGES is set); glibc's heap off"
                in broker.log_path.read_text())
    finally:
        finish(broker)
