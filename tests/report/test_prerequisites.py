"""`shoal report` on a machine without what PySpark needs: one line that says what is missing
and how to get it, and a non-zero exit -- not a Java or import traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from report.prerequisites import java_major

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_java_versions_are_read_from_both_version_styles() -> None:
    assert java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major('openjdk version "21" 2023-09-19') == 21
    assert java_major('java version "1.8.0_392"') == 8
    assert java_major("no version here") is None


def test_report_without_java_says_so_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.mkdir()
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java-here")}
    done = subprocess.run([sys.executable, "-m", "cli.main", "report", str(trace)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "shoal report needs Java 17 or newer" in lines[0]
    assert not (trace / "report").exists()
