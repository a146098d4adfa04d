"""``shoal report DIR``: analyse a trace directory with PySpark and write the report."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import click

REPORT_EXTRA = "pip install -e '.[report]' (make test installs it)"


def report_prerequisites_missing() -> str | None:
    """What `shoal report` needs and this machine lacks, in one line; None when all is there."""
    absent = [name for name in ("pyspark", "pyarrow", "pandas", "matplotlib")
              if importlib.util.find_spec(name) is None]
    if absent:
        return f"shoal report needs {', '.join(absent)}: {REPORT_EXTRA}"
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        return ("shoal report needs Java 17 or newer for PySpark, and no `java` was found "
                "(install a JRE, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"shoal report needs Java 17 or newer for PySpark; `{java} -version` failed: {exc}"
    version = _java_major(out.stderr + out.stdout)
    if version is not None and version < 17:
        return f"shoal report needs Java 17 or newer for PySpark; {java} is Java {version}"
    return None


def _java_major(text: str) -> int | None:
    """17 from 'openjdk version "17.0.15"', 8 from 'java version "1.8.0_392"'."""
    import re

    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@click.command()
@click.argument("trace_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where report.html and summary.json go  [default: DIR/report]")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL (spark://host:7077, yarn, local[N], ...). With a cluster the "
                   "trace directory must be readable by the executors.")
@click.option("--shuffle-partitions", default=None, type=click.IntRange(1, 100000),
              help="spark.sql.shuffle.partitions  [default: 8 for local masters, else 200]")
def report(trace_dir: str, out_dir: str | None, master: str, shuffle_partitions: int | None) -> None:
    """Analyse the trace in TRACE_DIR (written by `shoal serve --trace DIR` and the perf scripts)
    and write report.html (plots embedded) and summary.json."""
    missing = report_prerequisites_missing()
    if missing:
        raise click.ClickException(missing)
    from perf.spark.job import run_report

    paths = run_report(trace_dir, out_dir, master=master, shuffle_partitions=shuffle_partitions)
    click.echo(f"report:  {paths['report']}")
    click.echo(f"summary: {paths['summary']}")
