"""What ``shoal report`` needs on this machine (PySpark and its friends, Java 17), checked before
anything heavy is imported: one line that says what is missing and how to get it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess

REPORT_EXTRA = "pip install -e '.[report]' (make test installs it)"
JAVA_MIN = 17  # PySpark 4 runs on Java 17 or newer


def missing() -> str | None:
    """What `shoal report` needs and this machine lacks, in one line; None when all is there."""
    absent = [name for name in ("pyspark", "pyarrow", "pandas", "matplotlib")
              if importlib.util.find_spec(name) is None]
    if absent:
        return f"shoal report needs {', '.join(absent)}: {REPORT_EXTRA}"
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        return (f"shoal report needs Java {JAVA_MIN} or newer for PySpark, and no `java` was found "
                "(install a JRE, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"shoal report needs Java {JAVA_MIN} or newer for PySpark; `{java} -version` failed: {exc}"
    version = java_major(out.stderr + out.stdout)
    if version is not None and version < JAVA_MIN:
        return f"shoal report needs Java {JAVA_MIN} or newer for PySpark; {java} is Java {version}"
    return None


def java_major(text: str) -> int | None:
    """17 from 'openjdk version "17.0.15"', 8 from 'java version "1.8.0_392"'."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major
