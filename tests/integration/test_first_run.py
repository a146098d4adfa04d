"""First-run rough edges a newcomer meets: a port already in use is one clear line and a non-zero
exit, with nothing left behind in /dev/shm."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import HOST, REPO_ROOT, SHM_DIR, Broker, serve_command

# It compares all of /dev/shm before and after: a broker another test starts meanwhile would
# show up as left behind.
pytestmark = pytest.mark.serial


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob("shoal.*")}


def test_a_port_in_use_is_one_line_and_a_non_zero_exit_leaving_nothing(
        shared_broker: Broker, tmp_path: Path) -> None:
    before = _segments()
    done = subprocess.run(
        [*serve_command(), "serve", "--management-port", "0", "--host", HOST, "--port", str(shared_broker.port),
         "--workers", "1", "--control-socket", str(tmp_path / "control.sock")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode != 0
    output = (done.stdout + done.stderr).strip().splitlines()
    assert len(output) == 1, output
    assert f"{HOST}:{shared_broker.port}: address already in use" in output[0]
    assert "Traceback" not in done.stderr
    assert _segments() <= before, f"left behind: {_segments() - before}"
    assert not (tmp_path / "control.sock").exists()
