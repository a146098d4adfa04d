"""ipc.collector.settle: a started broker process's objects frozen, the young generation's
threshold raised, cycles made later still collected. Each case runs in a child interpreter, so
that the test process's own collector is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import gc, json, weakref
from ipc import collector

class Node:
    pass

started = [Node() for _ in range(1000)]  # what a started process holds
before = gc.get_threshold()
collector.settle()
frozen = gc.get_freeze_count()

a, b = Node(), Node()  # a cycle made once running
a.peer, b.peer = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "cycle_collected": gone() is None, "gen0": collector.GEN0_THRESHOLD}))
"""


def _child(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, check=True, text=True,
                         capture_output=True, env={**os.environ, **env})
    return json.loads(out.stdout)


def test_settle_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    seen = _child()
    assert seen["frozen"] >= 1000  # the started objects, at least
    assert seen["after"][0] == seen["gen0"] > seen["before"][0]
    assert seen["after"][1:] == seen["before"][1:]
    assert seen["cycle_collected"]


def test_settle_leaves_the_collector_alone_when_asked() -> None:
    seen = _child(SHOAL_GC_DEFAULT="1")
    assert seen["frozen"] == 0
    assert seen["after"] == seen["before"]
    assert seen["cycle_collected"]
