"""One SparkSession for the whole test session: local[1], UI off, one shuffle partition."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from cli.report import report as report_command
from tests.report import handmade


def _have_java() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and os.path.exists(os.path.join(home, "bin", "java"))))


@pytest.fixture(scope="session")
def spark():
    """A local[1] SparkSession shared by every Spark test (and reused by `shoal report`)."""
    if not _have_java():
        pytest.skip("no Java runtime: PySpark needs Java 17")
    from report.job import spark_session

    session, created = spark_session(
        "local[1]", shuffle_partitions=1,
        extra={
            "spark.sql.adaptive.enabled": "false",  # tiny data: no re-planning stages
            "spark.sql.codegen.wholeStage": "false",  # tiny data: compiling costs more than it saves
            "spark.driver.memory": "512m",
            "spark.default.parallelism": "1",
        },
    )
    yield session
    if created:
        session.stop()


@pytest.fixture(scope="session")
def report(spark, tmp_path_factory):
    """Write the hand-made trace, run `shoal report DIR --master local[1]` once, load summary.json."""
    trace = tmp_path_factory.mktemp("trace")
    facts = handmade.write_trace(trace)
    result = CliRunner().invoke(report_command, [str(trace), "--master", "local[1]"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    out = trace / "report"
    summary = json.loads((out / "summary.json").read_text())
    return {"summary": summary, "out": out, "output": result.output, **facts}
