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


def _codec_file(pure: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if pure:
        env[ENV] = "1"
    out = subprocess.run([sys.executable, "-c", "import workers.codec as c; print(c.__file__)"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_pure_python_switch_imports_the_sources() -> None:
    assert _codec_file(pure=True).endswith(os.path.join("workers", "codec.py"))


@pytest.mark.skipif(not BUILT, reason="the hot path is not compiled here (make compiled)")
def test_without_the_switch_the_compiled_module_is_imported() -> None:
    assert _codec_file(pure=False).endswith(".so")


def test_this_run_imports_what_its_mode_says() -> None:
    # the modules it checks, whichever tests ran before (workers.channel imports neither
    # workers.connection nor ipc.ring: run alone, or after tests/broker, this failed)
    import ipc.ring  # noqa: F401
    import workers.channel
    import workers.codec
    import workers.connection  # noqa: F401

    if os.environ.get(ENV):
        assert compiled_modules() == []
    elif BUILT:
        assert {"workers.codec", "workers.connection", "ipc.ring"} <= set(compiled_modules())
    else:
        assert compiled_modules() == []
