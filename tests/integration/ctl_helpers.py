"""A running test broker's two control paths, as the integration tests drive them: `shoal ctl`
as a subprocess (what an operator types) and one request on its control socket (what the
management process and `shoal ctl` send)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from cli.control import ask
from tests.integration.harness import REPO_ROOT, Broker


def ctl(broker: Broker, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`shoal ctl ARGS` against ``broker``'s control socket (``input``: its stdin)."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "ctl", "--control-socket",
         str(broker.control_dir / "control.sock"), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, input=input, timeout=30)


def control(broker: Broker, **request: Any) -> dict[str, Any]:
    """One request on ``broker``'s control socket, and its answer."""
    return ask(str(broker.control_dir / "control.sock"), request)
