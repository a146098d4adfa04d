"""The summary's sections from the rows the Spark job collected (``report.job``): plain
Python on the driver, no Spark -- fairness (Jain's index), wake-ups, throughput per second and
in buckets sized for the run, the processes' CPU and memory, and the JSON-safe summary.

The definitions of what each section holds are ``report.job``'s docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²); None for no values or all zero."""
    n = len(values)
    squares = sum(v * v for v in values)
    if n == 0 or squares == 0:
        return None
    return sum(values) ** 2 / (n * squares)


def ratio(num: float, den: float) -> float | None:
    return None if not den else num / den


def fairness(rows: list[Any]) -> dict[str, Any]:
    per_queue: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["browser"]:
            continue  # a browser sees every message: not a share of the work
        tag = r["tag"] or r["ctag"] or ""
        per_queue[r["queue"]].append({
            "consumer": f"w{r['consumer_worker']}.c{r['consumer_id']}",
            "tag": tag,
            "priority": int(r["priority"] or 0),
            "delivered": int(r["delivered"] or 0),
        })
    consumers, share, index, by_priority = {}, {}, {}, {}
    for queue in sorted(per_queue, key=str):
        group = sorted(per_queue[queue], key=lambda c: (-c["priority"], c["consumer"]))
        total = sum(c["delivered"] for c in group)
        for c in group:
            c["share"] = ratio(c["delivered"], total)
        consumers[queue] = group
        share[queue] = {c["consumer"]: c["share"] for c in group}
        index[queue] = jain([c["delivered"] for c in group])
        levels: dict[int, list[int]] = defaultdict(list)
        for c in group:
            levels[c["priority"]].append(c["delivered"])
        by_priority[queue] = {str(p): jain(v) for p, v in sorted(levels.items(), reverse=True)}
    return {"consumers": consumers, "share": share, "jain": index, "jain_by_priority": by_priority}


def wakeups(rows: list[Any], delivered: int, delivered_by_queue: dict[str, int]) -> dict[str, Any]:
    keys = ("notifies", "pulls", "notified_pulls", "spurious_pulls")
    total = {k: sum(int(r[k]) for r in rows) for k in keys}

    def derived(d: dict[str, int], dlv: int) -> dict[str, Any]:
        return {**d, "per_delivered": ratio(d["notifies"], dlv),
                "spurious_share": ratio(d["spurious_pulls"], d["notified_pulls"])}

    by_queue = {r["queue"]: derived({k: int(r[k]) for k in keys}, delivered_by_queue.get(r["queue"], 0))
                for r in sorted(rows, key=lambda r: str(r["queue"]))}
    return {**derived(total, delivered), "by_queue": by_queue}


def throughput(rows: list[Any], t0: int) -> dict[str, Any]:
    kinds = ("published", "delivered", "acked")
    if not rows:
        return {"interval_s": 1, "t": [], **{k: [] for k in kinds}, "peak": {}, "mean": {}}
    last = max(r["s"] for r in rows)
    span = last - t0 + 1
    out: dict[str, Any] = {"interval_s": 1, "t": list(range(span))}
    for k in kinds:
        out[k] = [0] * span
    for r in rows:
        out[r["k"]][r["s"] - t0] += int(r["count"])
    out["peak"] = {k: max(out[k]) for k in kinds}
    out["mean"] = {}
    for k in kinds:  # events over the time from the first to the last of them, not whole seconds
        mine = [r for r in rows if r["k"] == k]
        count = sum(int(r["count"]) for r in mine)
        if not mine:
            out["mean"][k] = 0.0
            continue
        span_s = (max(int(r["hi"]) for r in mine) - min(int(r["lo"]) for r in mine)) / 1e9
        out["mean"][k] = count / span_s if span_s > 0 else float(count)
    return out


FINE_NS = 10_000_000  # 10 ms: the finest bucket of the throughput plot
_FINE_STEPS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
FINE_POINTS = 40  # at most this many buckets across a run, whatever its length


def fine_throughput(rows: list[Any], t0: int) -> dict[str, Any]:
    """Messages per second in buckets sized for the run: 10 ms for a sub-second run, up to a
    minute for hours, never more than FINE_POINTS buckets; ``t`` is each bucket's start in
    seconds from ``t0``."""
    kinds = ("published", "delivered", "acked")
    if not rows:
        return {"interval_s": 1, "t": [], **{k: [] for k in kinds}}
    first = min(int(r["b"]) for r in rows)
    last = max(int(r["b"]) for r in rows)
    span_s = (last - first + 1) * FINE_NS / 1e9
    step = next((x for x in _FINE_STEPS_S if span_s / x <= FINE_POINTS), _FINE_STEPS_S[-1])
    per = max(1, round(step * 1e9 / FINE_NS))  # fine buckets per plotted bucket
    origin = t0 * 1_000_000_000 // FINE_NS  # buckets are counted from t0: the axis starts at 0
    start = first - (first - origin) % per
    n = (last - start) // per + 1
    out: dict[str, Any] = {"interval_s": step,
                           "t": [round((start + i * per) * FINE_NS / 1e9 - t0, 3) for i in range(n)]}
    for k in kinds:
        out[k] = [0.0] * n
    for r in rows:
        out[r["k"]][(int(r["b"]) - start) // per] += int(r["count"]) / step
    return out


def _spread(group: list[Any], hi: str, lo: str) -> float:
    """Sum over pids of (last - first) of a cumulative counter."""
    total = 0.0
    for pid in {r["pid"] for r in group}:
        mine = [r for r in group if r["pid"] == pid and r[hi] is not None and r[lo] is not None]
        if mine:
            total += max(r[hi] for r in mine) - min(r[lo] for r in mine)
    return total


def processes(rows: list[Any], t0: int) -> dict[str, Any]:
    by_name: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by_name[r["name"]].append(r)
    out: dict[str, Any] = {}
    for name in sorted(by_name, key=str):
        group = by_name[name]
        times, cpus, rss = _summed(group, lambda r: r["s"] - t0)
        known = [c for c in cpus if c is not None]
        out[name] = {
            "pids": sorted({int(r["pid"]) for r in group}),
            "samples": int(sum(r["samples"] for r in group)),
            "cpu_percent_mean": sum(known) / len(known) if known else None,
            "cpu_percent_max": max(known) if known else None,
            "cpu_seconds": round(_spread(group, "cpu_hi", "cpu_lo"), 3),
            "rss_max_bytes": max(rss) if rss else None,
            "ctx_voluntary": int(_spread(group, "vol_hi", "vol_lo")),
            "ctx_involuntary": int(_spread(group, "inv_hi", "inv_lo")),
            "t": times,
            "cpu_percent": cpus,
            "rss_bytes": rss,
        }
    return out


def _summed(rows: list[Any], bucket: Any) -> tuple[list[Any], list[float | None], list[int]]:
    """Buckets, CPU % and RSS of one process name's sample rows, by ``bucket(row)``: a restarted
    process shares its name, so their CPU and RSS add up."""
    slots: dict[Any, dict[str, Any]] = {}
    for r in rows:
        slot = slots.setdefault(bucket(r), {"cpu": None, "rss": 0})
        if r["cpu"] is not None:  # a process's first sample has no CPU % (no interval yet)
            slot["cpu"] = (slot["cpu"] or 0.0) + r["cpu"]
        slot["rss"] += r["rss"] or 0
    keys = sorted(slots)
    return keys, [slots[k]["cpu"] for k in keys], [int(slots[k]["rss"]) for k in keys]


def fine_processes(rows: list[Any], step_s: float) -> dict[str, dict[str, Any]]:
    """CPU % and RSS per process in the throughput plot's buckets (``b``: bucket index from t0),
    for a run too short for one point a second."""
    by_name: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by_name[r["name"]].append(r)
    out = {}
    for name, group in by_name.items():
        buckets, cpus, rss = _summed(group, lambda r: int(r["b"]))
        out[name] = {"interval_s": step_s, "t": [round(b * step_s, 3) for b in buckets],
                     "cpu_percent": cpus, "rss_bytes": rss}
    return out


def clean(value: Any) -> Any:
    """JSON-safe: NaN / inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value
