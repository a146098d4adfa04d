"""The hot path's compiled modules (ipc/compiled.py): what the suite runs is what it says it runs.

``make test`` runs the suite twice: with the modules the Makefile compiles with mypyc, then with
``SHOAL_PURE_PYTHON=1``. These tests check that each run imports what it is meant to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipc.compiled import ENV, compiled_modules

ROOT = Path(__file__).resolve().parents[2]
BUILT = any((ROOT / "workers").glob("codec.*.so"))
# One compiled module of each package that holds some: the switch is per package directory.
ONE_A_PACKAGE = ("workers.codec", "ipc.ring", "broker.runtime.dispatch", "broker.queues.fifo_entries",
                 "broker.topology.routing")


def _module_files(pure: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if pure:
        env[ENV] = "1"
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]: print(importlib.import_module(name).__file__)")
    out = subprocess.run([sys.executable, "-c", script, *ONE_A_PACKAGE],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_the_pure_python_switch_imports_the_sources() -> None:
    assert _module_files(pure=True) == [
        str(ROOT.joinpath(*name.split("."))) + ".py" for name in ONE_A_PACKAGE]


def test_the_makefile_compiles_a_module_of_every_package_checked() -> None:
    from tests.compiled_reach import compiled_modules as makefile_list

    compiled = makefile_list()
    assert set(ONE_A_PACKAGE) <= compiled
    # every package holding a compiled module calls sources_only, so the switch covers it
    for package in {name.rpartition(".")[0] for name in compiled}:
        init = ROOT.joinpath(*package.split("."), "__init__.py").read_text()
        assert "sources_only(__path__)" in init, package


@pytest.mark.skipif(not BUILT, reason="the hot path is not compiled here (make compiled)")
def test_without_the_switch_the_compiled_modules_are_imported() -> None:
    assert all(path.endswith(".so") for path in _module_files(pure=False))


def test_this_run_imports_what_its_mode_says() -> None:
    # the modules it checks, whichever tests ran before (workers.channel imports neither
    # workers.connection nor ipc.ring: run alone, or after tests/broker, this failed)
    # (imported by name too: tests/compiled_reach.py reads the imports to mark this module for
    # the pure pass)
    import broker.queues.fifo_entries
    import broker.runtime.dispatch
    import broker.topology.routing  # noqa: F401
    import ipc.ring  # noqa: F401
    import workers.channel
    import workers.codec
    import workers.connection  # noqa: F401

    if os.environ.get(ENV):
        assert compiled_modules() == []
    elif BUILT:
        assert {"workers.codec", "workers.connection", *ONE_A_PACKAGE} <= set(compiled_modules())
    else:
        assert compiled_modules() == []
