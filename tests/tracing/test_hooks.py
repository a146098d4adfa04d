"""The runtime's view of tracing: an interface that costs nothing to import, and its Arrow writer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tracing import TraceWriter
from tracing.writer import ArrowTraceWriter, open_writer

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_interface_loads_no_pyarrow() -> None:
    """`tracing`, `tracing.hooks` and `tracing.names` import without pyarrow: tracing off costs
    the runtime nothing."""
    probe = "import sys, tracing, tracing.hooks, tracing.names; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"


def test_open_writer_gives_the_arrow_writer_of_one_process(tmp_path: Path) -> None:
    """open_writer makes the Arrow writer that names its process and worker index."""
    trace: TraceWriter = open_writer(tmp_path, "worker3", worker=3)
    assert isinstance(trace, ArrowTraceWriter)
    assert (trace.process, trace.worker) == ("worker3", 3)
    assert trace.published(1, 1, 1, "", "q", 10) == 1
    trace.close()
    assert trace.rows_written == 1
