"""Headless Chromium (Debian's `chromium`) for the report's page tests: found or the test skips,
run with a fresh profile and no background networking, killed with its whole process group if it
hangs."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

TIMEOUT_S = 90
# as root (CI) Chromium needs --no-sandbox; without the background-networking flags it keeps
# trying to reach Google's hosts from a machine that has no network
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-quic", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars")
_profiles = itertools.count()


def chromium() -> str:
    """The browser's path; skips the calling test, saying why, when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("the report's browser tests need Chromium (Debian: apt-get install chromium; "
                ".ci/run installs it)")


def run(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run Chromium with ``args`` and a new profile under ``tmp`` (removed afterwards)."""
    profile = tmp / f"chromium-profile-{next(_profiles)}"
    proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"headless Chromium did not finish within {TIMEOUT_S} s")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
