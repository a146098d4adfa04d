"""``shoal report DIR``: analyse a trace directory with PySpark and write the report
(the job, its plots and its page are the top-level ``report`` package)."""

from __future__ import annotations

import click

from report import prerequisites


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
    missing = prerequisites.missing()
    if missing:
        raise click.ClickException(missing)
    from report.job import run_report

    paths = run_report(trace_dir, out_dir, master=master, shuffle_partitions=shuffle_partitions)
    click.echo(f"report:  {paths['report']}")
    click.echo(f"summary: {paths['summary']}")
