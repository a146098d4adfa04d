"""ipc.allocator.settle: a worker's big socket reads reuse freed heap memory instead of having
it handed back to the kernel and faulted in again. Each case runs in a child interpreter (the
setting is process-wide), reading a socket pair the way a worker reads a busy publisher: asks of
1 MiB, shorter reads, a little of each read kept. Page faults are counted, not timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipc import allocator

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import resource, socket
from ipc import allocator

settled = allocator.settle()
a, b = socket.socketpair()
for s in (a, b):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
chunk = b"x" * 300_000
keep = []

def rounds(n):
    for i in range(n):
        a.sendall(chunk * (1 + i % 3))
        got = 0
        while got < len(chunk) * (1 + i % 3):
            data = b.recv(1 << 20)
            got += len(data)
            keep.append(bytes(data[:100]))

rounds(30)  # warm up
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(300)
print(int(settled), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(*, default: bool) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV}
    if default:
        env[allocator.ENV] = "1"
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    return out[0] == "1", int(out[1])


def test_big_reads_reuse_freed_heap_memory() -> None:
    """300 rounds of 1 MiB asks take next to no page faults once settled (glibc's defaults:
    tens of thousands here, each read's pages faulted in afresh)."""
    settled, faults = _faults(default=False)
    if not settled:
        pytest.skip("the C library is not glibc: nothing to set")
    _, control = _faults(default=True)
    if control < 5_000:
        pytest.skip(f"this glibc does not trim the heap under this pattern ({control} faults)")
    assert faults < control // 10, (faults, control)


def test_shoal_malloc_default_leaves_the_allocator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(allocator.ENV, "1")
    assert allocator.settle() is False
