"""The PySpark job behind ``shoal report``: a trace directory in, a summary (and plot data) out.

Reading
    Every table is a set of Arrow IPC stream files (:mod:`tracing.schema`). The file names are
    listed on the driver and spread over the executors; each task reads its files with pyarrow
    (``mapInArrow``), keeping the complete batches of a file cut short by a crash, and conforms
    them to the current schema. With ``--master`` pointing at a cluster the trace directory must
    be readable by the executors (a shared path or any URI pyarrow.fs opens) and the executors'
    Python must be able to import ``tracing`` (install Shoal there).

Joining a message's partial rows
    1. Rows with an ``entry_id`` (supervisor enqueue / notify / pull / settle, worker deliver /
       ack) are grouped by ``entry_id`` into one row per queue entry: earliest enqueue and
       notify, first and last pull and delivery, the latest settlement's outcome, the client's
       final ack time.
    2. That row is joined to the publishing worker's ``publish`` row on the publish key
       ``(pub_worker, pub_pid, pub_seq)`` the supervisor's rows carry. A publish row whose
       routing key or size disagrees with the supervisor's is counted in ``join_mismatches``
       (it would mean the two sides counted Publish records differently).

Definitions (all in the summary)
    * ``published``: publish rows (Publish records the workers put on their rings);
      ``delivered``: deliver rows (Basic.Deliver / Get-Ok frames, redeliveries included);
      ``redelivered``: deliver rows with the redelivered flag; ``requeued``: requeue events;
      ``acked`` / ``rejected`` / ``expired`` / ``dead_lettered`` / ``dropped``: entries by final
      outcome (the supervisor's settle row, else the client's last non-requeue ack row);
      ``unsettled``: entries with neither; ``unrouted``: publish rows no entry refers to.
    * latency stages, per entry, in microseconds (``percentile_approx``, relative rank error
      1/``ACCURACY``): ``end_to_end`` publish → ack (acked entries), ``publish_to_deliver``,
      ``publish_to_enqueue``, ``enqueue_to_notify``, ``notify_to_deliver``,
      ``enqueue_to_deliver``, ``pull_to_deliver`` (first pull and first delivery),
      ``deliver_to_ack`` (last delivery → the client's ack), ``ack_to_settle``, and the load
      generator's own ``client_end_to_end`` (its receive time − the send time in the message).
    * fairness: deliveries per consumer (Basic.Get and browsers excluded) over the consumers of a
      queue — those that received something and those a ``consume`` event names — share =
      deliveries / queue's deliveries; Jain's index J = (Σx)² / (n·Σx²), 1 = perfectly even,
      1/n = one consumer got everything; per queue and per (queue, consumer priority).
    * wake-ups: ``notifies`` (notify events), ``notified_pulls`` (pulls with ``found_work`` set:
      the first pull after a notify), ``spurious_pulls`` (those that found nothing);
      ``wakeups_per_delivered`` = notifies / delivered; ``spurious_wakeup_share`` =
      spurious_pulls / notified_pulls.
    * throughput: published / delivered / acked per second of the monotonic clock, ``t`` in
      seconds from the first second seen anywhere in the trace.
    * processes: per sampled process name, CPU % (mean, max, per second; psutil's
      ``cpu_percent`` where the sample has it, else derived from the cumulative user+system
      times between consecutive samples), CPU seconds (from those cumulative times), RSS (max,
      per second), context switches.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from report.summary_sections import (
    FINE_NS,
    clean,
    fairness,
    fine_processes,
    fine_throughput,
    processes,
    throughput,
    wakeups,
)
from tracing import schema as ts

ACCURACY = 10000
QUANTILES = (0.5, 0.9, 0.99, 0.999)
QUANTILE_KEYS = ("p50", "p90", "p99", "p99.9")
CDF_QUANTILES = (*(round(0.01 * i, 2) for i in range(1, 100)), 0.995, 0.999)
LATENCY_STAGES = (
    "end_to_end", "publish_to_deliver", "publish_to_enqueue", "enqueue_to_notify",
    "notify_to_deliver", "enqueue_to_deliver", "pull_to_deliver", "deliver_to_ack",
    "ack_to_settle", "client_end_to_end",
)
COUNT_KEYS = ("published", "delivered", "acked", "rejected", "requeued", "redelivered", "expired",
              "dead_lettered", "dropped", "unsettled", "unrouted")
SUMMARY_ORDER = (
    "trace_dir", "files", "truncated_files", *COUNT_KEYS, "entries", "messages", "join_mismatches",
    "client", "latency_us", "jain", "jain_by_priority", "share", "consumers",
    "wakeups_per_delivered", "spurious_wakeup_share", "wakeups", "t0_s", "throughput", "processes",
)


# --------------------------------------------------------------------------- session


def prepare_environment(master: str = "local[*]") -> None:
    """Spark's Python workers run this interpreter (a cluster may name its own with
    PYSPARK_PYTHON); the driver binds to loopback unless SPARK_LOCAL_IP says otherwise."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def spark_session(master: str = "local[*]", *, shuffle_partitions: int | None = None,
                  extra: dict[str, str] | None = None) -> tuple[Any, bool]:
    """The active SparkSession, or a new one on ``master``; and whether this call created it."""
    prepare_environment(master)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if shuffle_partitions is None:
        shuffle_partitions = 8 if master.startswith("local") else 200
    builder = (
        SparkSession.builder.appName("shoal-report").master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


# --------------------------------------------------------------------------- reading


def spark_schema(schema: Any) -> Any:
    """The Spark StructType of one of :mod:`tracing.schema`'s Arrow schemas."""
    import pyarrow as pa
    from pyspark.sql import types as T

    mapping = {
        pa.int16(): T.ShortType(), pa.int32(): T.IntegerType(), pa.int64(): T.LongType(),
        pa.float64(): T.DoubleType(), pa.bool_(): T.BooleanType(), pa.string(): T.StringType(),
    }
    return T.StructType([T.StructField(f.name, mapping[f.type], True) for f in schema])


def list_trace_files(trace_dir: str) -> dict[str, list[str]]:
    """Trace files per table: a local directory, or any URI pyarrow.fs can list."""
    found: dict[str, list[str]] = {table: [] for table in ts.TABLES}
    if "://" in trace_dir and not trace_dir.startswith("file://"):
        from pyarrow import fs

        filesystem, inner = fs.FileSystem.from_uri(trace_dir)
        scheme = trace_dir.split("://", 1)[0]
        for info in filesystem.get_file_info(fs.FileSelector(inner)):
            table = ts.table_of(info.base_name)
            if table and info.type == fs.FileType.File:
                found[table].append(f"{scheme}://{info.path}")
    else:
        directory = Path(trace_dir.removeprefix("file://"))
        if not directory.is_dir():
            raise FileNotFoundError(f"no trace directory {trace_dir}")
        for path in directory.iterdir():
            table = ts.table_of(path.name)
            if table and path.is_file():
                found[table].append(str(path.resolve()))
    return {table: sorted(paths) for table, paths in found.items()}


def _reader(table: str) -> Any:
    def read(batches: Iterator[Any]) -> Iterator[Any]:
        from tracing.reader import iter_batches

        for batch in batches:
            yield from iter_batches(batch.column(0).to_pylist(), ts.SCHEMAS[table].remove_metadata())

    return read


def load_table(spark: Any, paths: list[str], table: str) -> Any:
    """One trace table as a DataFrame (read on the executors, one task per few files)."""
    schema = spark_schema(ts.SCHEMAS[table])
    if not paths:
        return spark.createDataFrame([], schema)
    slices = max(1, min(len(paths), spark.sparkContext.defaultParallelism))
    names = spark.sparkContext.parallelize([(p,) for p in paths], slices).toDF("path string")
    return names.mapInArrow(_reader(table), schema)


def truncated_files(paths: list[str]) -> list[str]:
    """The files among ``paths`` whose last batch was cut short (read on the driver)."""
    from pyarrow import fs

    from tracing.reader import read_stream_file

    cut = []
    for path in paths:
        if path.endswith(".parquet"):
            continue
        filesystem, inner = fs.FileSystem.from_uri(path) if "://" in path else (fs.LocalFileSystem(), path)
        with filesystem.open_input_stream(inner) as stream:
            if not read_stream_file(stream)[1]:
                cut.append(path)
    return cut


# --------------------------------------------------------------------------- helpers


def _us(value: float | None) -> float | None:
    return None if value is None else round(value / 1000.0, 3)


# --------------------------------------------------------------------------- the analysis


def entries_view(msg: Any) -> Any:
    """One row per queue entry: the partial rows of its message merged (see the module doc)."""
    from pyspark.sql import functions as F

    stage = F.col("stage")
    sup = stage.isin(*ts.SUPERVISOR_STAGES)
    settle = stage == ts.SETTLE
    ack = stage == ts.ACK
    final_ack = ack & (F.col("outcome") != ts.REQUEUED)

    def sup_max(name: str) -> Any:
        return F.max(F.when(sup, F.col(name))).alias(name)

    merged = msg.where(F.col("entry_id").isNotNull()).groupBy("entry_id").agg(
        F.max("msg_id").alias("msg_id"),
        F.max("queue").alias("queue"),
        *(sup_max(c) for c in ("pub_worker", "pub_pid", "pub_seq", "exchange", "routing_key",
                               "body_size")),
        F.min(F.when(sup, F.col("routing_key"))).alias("routing_key_lo"),
        F.min(F.when(sup, F.col("body_size"))).alias("body_size_lo"),
        F.min("enqueued_ns").alias("enqueued_ns"),
        F.min("notified_ns").alias("notified_ns"),
        F.min("pulled_ns").alias("first_pulled_ns"),
        F.min("delivered_ns").alias("first_delivered_ns"),
        F.max("delivered_ns").alias("last_delivered_ns"),
        F.max(F.when(settle, F.col("settled_ns"))).alias("settled_ns"),
        F.max_by(F.when(settle, F.col("outcome")),
                 F.when(settle, F.col("settled_ns"))).alias("sup_outcome"),
        F.max(F.when(final_ack, F.col("acked_ns"))).alias("acked_ns"),
        F.max_by(F.when(final_ack, F.col("outcome")),
                 F.when(final_ack, F.col("acked_ns"))).alias("client_outcome"),
    )
    publish = msg.where(stage == ts.PUBLISH).select(
        "pub_worker", "pub_pid", "pub_seq", "published_ns", "pub_conn", "pub_channel",
        F.col("routing_key").alias("pub_routing_key"), F.col("body_size").alias("pub_body_size"),
    )
    joined = merged.join(publish, ["pub_worker", "pub_pid", "pub_seq"], "left")
    return joined.select(
        "*",
        F.coalesce("sup_outcome", "client_outcome").alias("outcome"),
        (F.col("published_ns").isNotNull() & (
            (F.col("pub_routing_key") != F.col("routing_key"))
            | (F.col("pub_routing_key") != F.col("routing_key_lo"))
            | (F.col("pub_body_size") != F.col("body_size"))
            | (F.col("pub_body_size") != F.col("body_size_lo")))).alias("mismatch"),
    )


def _stage_exprs() -> list[tuple[str, Any]]:
    from pyspark.sql import functions as F

    c = F.col
    acked = c("outcome") == ts.ACKED
    return [
        ("end_to_end", F.when(acked, F.coalesce(c("acked_ns"), c("settled_ns")) - c("published_ns"))),
        ("publish_to_deliver", c("first_delivered_ns") - c("published_ns")),
        ("publish_to_enqueue", c("enqueued_ns") - c("published_ns")),
        ("enqueue_to_notify", c("notified_ns") - c("enqueued_ns")),
        ("notify_to_deliver", c("first_delivered_ns") - c("notified_ns")),
        ("enqueue_to_deliver", c("first_delivered_ns") - c("enqueued_ns")),
        ("pull_to_deliver", c("first_delivered_ns") - c("first_pulled_ns")),
        ("deliver_to_ack", F.when(acked, c("acked_ns") - c("last_delivered_ns"))),
        ("ack_to_settle", F.when(acked, c("settled_ns") - c("acked_ns"))),
    ]


def analyse(spark: Any, trace_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the job; return the summary (JSON-ready) and extra plot data (latency CDFs)."""
    from pyspark.sql import functions as F

    files = list_trace_files(str(trace_dir))
    cut = truncated_files(files[ts.MESSAGES] + files[ts.EVENTS] + files[ts.PROCS] + files[ts.CLIENT])
    msg = load_table(spark, files[ts.MESSAGES], ts.MESSAGES).cache()
    events = load_table(spark, files[ts.EVENTS], ts.EVENTS).cache()
    procs = load_table(spark, files[ts.PROCS], ts.PROCS)
    client = load_table(spark, files[ts.CLIENT], ts.CLIENT).cache()
    cached = [msg, events, client]
    try:
        summary: dict[str, Any] = {
            "trace_dir": str(trace_dir),
            "files": {table: len(paths) for table, paths in files.items()},
            "truncated_files": [Path(p).name for p in cut],
        }
        stage, kind = F.col("stage"), F.col("kind")

        # ---- message counts (one pass over msg)
        row = msg.agg(
            F.count(F.when(stage == ts.PUBLISH, 1)).alias("published"),
            F.count(F.when(stage == ts.DELIVER, 1)).alias("delivered"),
            F.count(F.when((stage == ts.DELIVER) & (F.col("redelivered") > 0), 1)).alias("redelivered"),
        ).first()
        counts = row.asDict()

        # ---- per-entry view
        entries = entries_view(msg).cache()
        cached.append(entries)
        outcome = F.col("outcome")
        row = entries.agg(
            F.count(F.lit(1)).alias("entries"),
            F.countDistinct("msg_id").alias("messages"),
            *(F.count(F.when(outcome == o, 1)).alias(o.replace("-", "_")) for o in ts.FINAL_OUTCOMES),
            F.count(F.when(outcome.isNull(), 1)).alias("unsettled"),
            F.count(F.when(F.col("mismatch"), 1)).alias("join_mismatches"),
            F.countDistinct(F.when(F.col("published_ns").isNotNull(),
                                   F.struct("pub_worker", "pub_pid", "pub_seq"))).alias("routed_publishes"),
        ).first().asDict()
        counts.update(row)
        counts["unrouted"] = max(0, counts["published"] - counts.pop("routed_publishes"))

        # ---- client view
        crow = client.agg(
            F.sum(F.when(kind == ts.SEND, F.coalesce(F.col("n"), F.lit(1)))).alias("sent"),
            F.count(F.when(kind == ts.RECV, 1)).alias("received"),
            F.count(F.when((kind == ts.RECV) & F.col("redelivered"), 1)).alias("redelivered"),
        ).first()
        summary["client"] = {k: int(crow[k] or 0) for k in ("sent", "received", "redelivered")}

        # ---- latency percentiles (one aggregation over every stage)
        stages = F.array(*[F.struct(F.lit(name).alias("stage"), expr.cast("long").alias("v"))
                           for name, expr in _stage_exprs()])
        long = entries.select(F.explode(stages).alias("s")).select("s.stage", "s.v")
        long = long.unionByName(
            client.where(kind == ts.RECV).select(
                F.lit("client_end_to_end").alias("stage"),
                (F.col("ts_ns") - F.col("sent_ns")).cast("long").alias("v"),
            )
        ).where(F.col("v").isNotNull())
        lat_rows = long.groupBy("stage").agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx("v", list(QUANTILES), ACCURACY).alias("q"),
            F.percentile_approx("v", list(CDF_QUANTILES), ACCURACY).alias("cdf"),
            F.avg("v").alias("mean"), F.min("v").alias("min"), F.max("v").alias("max"),
        ).collect()
        latency: dict[str, Any] = {}
        cdfs: dict[str, list[tuple[float, float]]] = {}
        by_stage = {r["stage"]: r for r in lat_rows}
        for name in LATENCY_STAGES:
            r = by_stage.get(name)
            if r is None:
                continue
            latency[name] = {"count": int(r["count"]),
                             **{k: _us(v) for k, v in zip(QUANTILE_KEYS, r["q"], strict=True)},
                             "mean": _us(r["mean"]), "min": _us(r["min"]), "max": _us(r["max"])}
            cdfs[name] = [(q, v / 1000.0) for q, v in zip(CDF_QUANTILES, r["cdf"], strict=True)]
        summary["latency_us"] = latency

        # ---- throughput per second
        def sec(col: str) -> Any:
            return F.floor(F.col(col) / F.lit(1_000_000_000)).cast("long")

        timed = (
            msg.where(stage == ts.PUBLISH).select(
                F.col("published_ns").alias("ns"), F.lit("published").alias("k"))
            .unionByName(msg.where(stage == ts.DELIVER).select(
                F.col("delivered_ns").alias("ns"), F.lit("delivered").alias("k")))
            .unionByName(entries.where(outcome == ts.ACKED).select(
                F.coalesce("settled_ns", "acked_ns").alias("ns"), F.lit("acked").alias("k")))
            .where(F.col("ns").isNotNull())
        )
        series = (  # per second, with each second's first and last event (for the exact mean rate)
            timed.select(sec("ns").alias("s"), "k", "ns")
            .groupBy("s", "k").agg(F.count("*").alias("count"), F.min("ns").alias("lo"),
                                   F.max("ns").alias("hi"))
            .collect()
        )
        fine_rows = (  # per 10 ms, for the plot's time axis (fine_throughput picks the bucket)
            timed.select(F.floor(F.col("ns") / F.lit(FINE_NS)).cast("long").alias("b"), "k")
            .groupBy("b", "k").count().collect()
        )

        # ---- fairness
        delivered_by = (
            msg.where((stage == ts.DELIVER) & F.col("consumer_id").isNotNull())
            .groupBy("queue", "consumer_worker", "consumer_id")
            .agg(F.count(F.lit(1)).alias("delivered"), F.max("consumer_tag").alias("tag"))
        )
        subscribed = (
            events.where(kind == ts.EV_CONSUME)
            .groupBy("queue", "consumer_worker", "consumer_id")
            .agg(F.max("consumer_tag").alias("ctag"), F.max("priority").alias("priority"),
                 F.max("browser").alias("browser"))
        )
        consumers = delivered_by.join(
            subscribed, ["queue", "consumer_worker", "consumer_id"], "full").collect()
        summary.update(fairness(consumers))

        # ---- wake-ups
        wake_rows = events.where(kind.isin(ts.EV_NOTIFY, ts.EV_PULL, ts.EV_REQUEUE)).groupBy("queue").agg(
            F.count(F.when(kind == ts.EV_REQUEUE, 1)).alias("requeued"),
            F.count(F.when(kind == ts.EV_NOTIFY, 1)).alias("notifies"),
            F.count(F.when(kind == ts.EV_PULL, 1)).alias("pulls"),
            F.count(F.when((kind == ts.EV_PULL) & F.col("found_work").isNotNull(), 1))
            .alias("notified_pulls"),
            F.count(F.when((kind == ts.EV_PULL) & ~F.col("found_work"), 1)).alias("spurious_pulls"),
            F.min("ts_ns").alias("first_ns"),
        ).collect()
        delivered_by_queue: dict[str, int] = defaultdict(int)
        for r in consumers:
            delivered_by_queue[r["queue"]] += r["delivered"] or 0
        counts["requeued"] = sum(int(r["requeued"]) for r in wake_rows)
        for key in (*COUNT_KEYS, "entries", "messages", "join_mismatches"):
            summary[key] = int(counts[key])
        summary["wakeups"] = wakeups(wake_rows, summary["delivered"], delivered_by_queue)
        summary["wakeups_per_delivered"] = summary["wakeups"]["per_delivered"]
        summary["spurious_wakeup_share"] = summary["wakeups"]["spurious_share"]

        # ---- processes
        # CPU %: psutil's own figure, else derived from the cumulative CPU times between samples
        from pyspark.sql import Window

        cpu_total = F.col("cpu_user_s") + F.col("cpu_system_s")
        previous = Window.partitionBy("name", "pid").orderBy("ts_ns")
        derived = (F.lit(100.0) * (cpu_total - F.lag(cpu_total).over(previous))
                   / ((F.col("ts_ns") - F.lag("ts_ns").over(previous)) / F.lit(1e9)))
        procs = procs.withColumn("cpu", F.coalesce(F.col("cpu_percent"), derived))
        proc_rows = procs.groupBy("name", "pid", sec("ts_ns").alias("s")).agg(
            F.avg("cpu").alias("cpu"), F.max("rss_bytes").alias("rss"),
            F.min(F.col("cpu_user_s") + F.col("cpu_system_s")).alias("cpu_lo"),
            F.max(F.col("cpu_user_s") + F.col("cpu_system_s")).alias("cpu_hi"),
            F.min("ctx_voluntary").alias("vol_lo"), F.max("ctx_voluntary").alias("vol_hi"),
            F.min("ctx_involuntary").alias("inv_lo"), F.max("ctx_involuntary").alias("inv_hi"),
            F.count(F.lit(1)).alias("samples"),
        ).collect()

        # ---- the time axis: seconds from the first second seen anywhere
        firsts = [r["s"] for r in series] + [r["s"] for r in proc_rows]
        firsts += [r["first_ns"] // 1_000_000_000 for r in wake_rows if r["first_ns"] is not None]
        t0 = min(firsts) if firsts else 0
        summary["t0_s"] = t0
        summary["throughput"] = throughput(series, t0)
        fine = summary["throughput"]["fine"] = fine_throughput(fine_rows, t0)
        summary["processes"] = processes(proc_rows, t0)
        if fine["interval_s"] < 1:  # a short run: its samples in the throughput plot's buckets
            step_ns = round(fine["interval_s"] * 1e9)
            bucket = F.floor((F.col("ts_ns") - F.lit(t0 * 1_000_000_000)) / F.lit(step_ns))
            fine_procs = procs.groupBy("name", "pid", bucket.cast("long").alias("b")).agg(
                F.avg("cpu").alias("cpu"), F.max("rss_bytes").alias("rss")).collect()
            for name, series in fine_processes(fine_procs, fine["interval_s"]).items():
                summary["processes"][name]["fine"] = series
        return {k: summary[k] for k in SUMMARY_ORDER if k in summary}, {"cdf_us": cdfs}
    finally:
        for df in cached:
            df.unpersist()


def run_report(trace_dir: str, out_dir: str | None = None, master: str = "local[*]",
               shuffle_partitions: int | None = None) -> dict[str, Path]:
    """Analyse ``trace_dir`` and write ``report.html`` (plots embedded) and ``summary.json``."""
    import json

    from report import html, plots

    out = Path(out_dir) if out_dir else Path(trace_dir) / "report"
    spark, created = spark_session(master, shuffle_partitions=shuffle_partitions)
    try:
        summary, extra = analyse(spark, trace_dir)
    finally:
        if created:
            spark.stop()
    summary = clean(summary)
    out.mkdir(parents=True, exist_ok=True)
    images = plots.render_all(summary, extra)
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    report_path = out / "report.html"
    report_path.write_text(html.render(summary, images))
    return {"summary": summary_path, "report": report_path}
