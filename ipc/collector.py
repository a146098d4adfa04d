"""The cyclic garbage collector in a broker process: started objects frozen, young ones let die.

A broker process allocates container objects on every message (records, events, entries, lists),
and CPython runs its cyclic collector every 700 of them by default: in a worker taking an unpaced
publisher, about a collection of the youngest generation per 300 publishes, of the middle one per
3,000 and a full one per 40,000 -- each full one walking every object the process holds, the
imported modules (trio, pamqp, msgspec, ours) included. S3 measured with ``gc.callbacks``: 0.69 µs
per message in the publishing worker, 8 % of its CPU, 180 ms of it in 15 full collections.

:func:`settle` runs once a process has started (modules imported, the runtime built, nothing of a
client's yet): one collection, then ``gc.freeze`` moves every object alive into the permanent
generation, which later collections never walk (they are still freed by reference counting), and
the youngest generation's threshold goes up, so that most of what a message allocates is freed by
its reference count before a collection ever looks at it. Cycles are still found: later.
With S3 measured again: 15 ms of collections in the publishing worker instead of 365 (0.03 µs per
message). ``SHOAL_GC_DEFAULT=1`` leaves the collector as CPython sets it (to measure against).
"""

from __future__ import annotations

import gc
import os

# Container allocations (less deallocations) between two collections of the youngest generation.
GEN0_THRESHOLD = 10_000
ENV = "SHOAL_GC_DEFAULT"


def settle() -> None:
    """Freeze what the started process holds; collect the young generation less often."""
    if os.environ.get(ENV):
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
