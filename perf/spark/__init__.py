"""The Spark side of the data pipeline: `shoal report` reads a trace directory with PySpark.

`perf.spark.job` is the job (reading, joining, aggregating), `perf.spark.plots` draws PNGs,
`perf.spark.html` writes the self-contained report page.
"""
