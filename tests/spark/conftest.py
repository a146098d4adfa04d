"""One SparkSession for the whole test session: local[1], UI off, one shuffle partition."""

from __future__ import annotations

import os
import shutil

import pytest


def _have_java() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and os.path.exists(os.path.join(home, "bin", "java"))))


@pytest.fixture(scope="session")
def spark():
    """A local[1] SparkSession shared by every Spark test (and reused by `shoal report`)."""
    if not _have_java():
        pytest.skip("no Java runtime: PySpark needs Java 17")
    from perf.spark.job import spark_session

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
