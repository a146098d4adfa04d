"""``shoal report``: a trace directory (``shoal serve --trace``, the perf scripts) read with PySpark.

    report.prerequisites      what the report needs on this machine (PySpark, Java 17), checked first
    report.job                the Spark job: reading, joining, aggregating into summary.json
    report.summary_sections   the summary's sections from the rows the job collected (driver side)
    report.plots              the PNG plots (matplotlib)
    report.html               the self-contained report page

It reads the trace through :mod:`tracing` alone; nothing at runtime imports it, and it imports
nothing of ``perf``, so a cluster's executors need Shoal's ``tracing`` and ``report`` packages only.
"""
