"""PNG plots of a report summary (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import io
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import Formatter, FuncFormatter, LogFormatter, ScalarFormatter

from report.wording import consumer, number, percent, process, stage

_DPI = 100


class _Numbers(Formatter):
    """matplotlib's own tick labels (0.5, 1e3, 10², 2×10²) written the way the page writes
    numbers, at the ticks matplotlib would label."""

    def __init__(self, own: Formatter) -> None:
        self.own = own

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.own.set_axis(axis)

    def set_locs(self, locs: Any) -> None:
        super().set_locs(locs)
        self.own.set_locs(locs)

    def __call__(self, x: float, pos: int | None = None) -> str:
        return number(float(x)) if self.own(x, pos) else ""


def _numbers_on_ticks(axis: Any) -> None:
    """Labels a plot chose itself (stage names, percentages) stay."""
    if isinstance(axis.get_major_formatter(), ScalarFormatter | LogFormatter):
        axis.set_major_formatter(_Numbers(axis.get_major_formatter()))
    if isinstance(axis.get_minor_formatter(), LogFormatter):
        axis.set_minor_formatter(_Numbers(axis.get_minor_formatter()))


def _png(fig: Any) -> bytes:
    for ax in fig.axes:
        _numbers_on_ticks(ax.xaxis)
        _numbers_on_ticks(ax.yaxis)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _legend_outside(ax: Any, **options: Any) -> None:
    """The legend to the right of the axes: it never covers a line or a bar."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small",
              **options)


def _steps(ax: Any, t: list[float], values: list[float], step: float, **options: Any) -> None:
    """A bucketed series as steps covering each bucket [t, t + step): a run of one bucket is a
    visible plateau, not an invisible single point."""
    xs = [*t, t[-1] + step]
    ax.stairs(values, xs, **options)


def throughput(summary: dict[str, Any]) -> bytes:
    """Published, delivered and acked messages per second over time, in buckets sized for the
    run's length (10 ms for a sub-second run, seconds for minutes)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    tp = summary.get("throughput") or {}
    fine = tp.get("fine") or {}
    if fine.get("t"):
        step = fine["interval_s"]
        for key, style in (("published", "-"), ("delivered", "--"), ("acked", ":")):
            _steps(ax, fine["t"], fine[key], step, linestyle=style, label=key, linewidth=1.5)
        ax.set_xlabel(f"time (s), {number(float(step))} s buckets")
        ax.set_ylabel("messages / s")
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        ax.grid(alpha=0.3)
    else:
        _empty(ax, "no messages in the trace")
    ax.set_title("Throughput")
    return _png(fig)


def latency_cdf(summary: dict[str, Any], extra: dict[str, Any]) -> bytes:
    """Latency distribution (CDF from approximate percentiles) per stage, log time axis."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    cdfs = extra.get("cdf_us") or {}
    drawn = False
    for name, points in cdfs.items():
        xs = [max(v, 1e-3) for _, v in points]
        ys = [q for q, _ in points]
        if xs:
            ax.plot(xs, ys, label=stage(name))
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("share of messages at or below")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: percent(value)))
        _legend_outside(ax)
        ax.grid(alpha=0.3, which="both")
    else:
        _empty(ax, "no latencies in the trace")
    ax.set_title("Latency distribution, from each event to the next")
    return _png(fig)


def latency_percentiles(summary: dict[str, Any]) -> bytes:
    """p50 / p90 / p99 / p99.9 per stage as grouped bars, log scale."""
    lat = summary.get("latency_us") or {}
    fig, ax = plt.subplots(figsize=(9, 4.2))
    stages = list(lat)
    if stages:
        keys = ("p50", "p90", "p99", "p99.9")
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            values = [max(lat[s][key] or 0, 1e-3) for s in stages]
            ax.bar([x + i * width for x in range(len(stages))], values, width, label=key)
        ax.set_xticks([x + 1.5 * width for x in range(len(stages))])
        ax.set_xticklabels([stage(s) for s in stages], rotation=30, ha="right", fontsize="small")
        ax.set_yscale("log")
        ax.set_ylabel("latency (µs)")
        _legend_outside(ax)
        ax.grid(alpha=0.3, axis="y")
    else:
        _empty(ax, "no latencies in the trace")
    ax.set_title("Latency percentiles, from each event to the next")
    return _png(fig)


def fairness(summary: dict[str, Any]) -> bytes:
    """Each consumer's share of its queue's deliveries as horizontal bars (one row per
    consumer, labelled queue / consumer / priority: tags are in the table above), with Jain's
    index per queue in the title."""
    queues = summary.get("consumers") or {}
    rows = [(queue, c) for queue, group in queues.items() for c in group]
    fig, ax = plt.subplots(figsize=(9, max(2.2, 0.9 + 0.38 * len(rows))))
    cmap = plt.get_cmap("tab10")
    if rows:
        labels = [f"{_short(queue)} · {consumer(c['consumer'])} · priority {c['priority']}"
                  for queue, c in rows]
        values = [c["share"] or 0.0 for _, c in rows]
        order = {queue: i for i, queue in enumerate(queues)}
        colours = [cmap(order[queue] % 10) for queue, _ in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, values, color=colours, height=0.6)
        for yi, v, (_, c) in zip(y, values, rows, strict=True):
            ax.text(min(v, 1.0) + 0.01, yi, f"{percent(v)} ({number(c['delivered'])})",
                    va="center", fontsize="small")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize="small")
        ax.set_xlim(0, 1.15)
        ax.set_xlabel("share of the queue's deliveries")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: percent(value)))
        ax.grid(alpha=0.3, axis="x")
        j = summary.get("jain") or {}
        index = ", ".join(f"{_short(q)} {number(v)}" for q, v in j.items())
        ax.set_title(textwrap.fill(f"Each consumer's share of its queue; Jain's fairness index "
                                   f"(1 = even): {index}", 90), fontsize="medium")
    else:
        _empty(ax, "no consumers in the trace")
        ax.set_title("Each consumer's share")
    return _png(fig)


def _short(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def processes(summary: dict[str, Any], key: str, title: str, ylabel: str,
              scale: float = 1.0) -> bytes:
    """One line per process over time, for ``cpu_percent`` or ``rss_bytes``."""
    procs = summary.get("processes") or {}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if procs:
        for name, p in procs.items():
            series = p.get("fine") or p  # a short run's samples in sub-second buckets
            values = [float("nan") if v is None else v / scale for v in series[key]]
            if len(values) == 1:  # a run shorter than one sample bucket: a visible point
                ax.plot(series["t"], values, label=process(name), marker="o", linestyle="none")
            else:
                ax.plot(series["t"], values, label=process(name), marker=".", markersize=4)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        _legend_outside(ax)
        ax.grid(alpha=0.3)
    else:
        _empty(ax, "no process samples in the trace")
    ax.set_title(title)
    return _png(fig)


def render_all(summary: dict[str, Any], extra: dict[str, Any]) -> dict[str, bytes]:
    """Every plot of the report, by title, as PNG bytes."""
    return {
        "Throughput": throughput(summary),
        "Latency distribution": latency_cdf(summary, extra),
        "Latency percentiles": latency_percentiles(summary),
        "Consumer shares": fairness(summary),
        "CPU": processes(summary, "cpu_percent", "CPU per process",
                         "CPU % (100 = one core)"),
        "Memory": processes(summary, "rss_bytes", "Memory per process (resident set)",
                            "memory (MiB)", scale=1 << 20),
    }
