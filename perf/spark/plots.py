"""PNG plots of a report summary (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_DPI = 100


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def throughput(summary: dict[str, Any]) -> bytes:
    """Published, delivered and acked messages per second over time."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    tp = summary.get("throughput") or {}
    if tp.get("t"):
        for key, style in (("published", "-"), ("delivered", "--"), ("acked", ":")):
            ax.plot(tp["t"], tp[key], style, label=key, drawstyle="steps-mid")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("messages / s")
        ax.legend(loc="best")
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
    for stage, points in cdfs.items():
        xs = [max(v, 1e-3) for _, v in points]
        ys = [q for q, _ in points]
        if xs:
            ax.plot(xs, ys, label=stage)
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("fraction of messages")
        ax.legend(loc="lower right", fontsize="small")
        ax.grid(alpha=0.3, which="both")
    else:
        _empty(ax, "no latencies in the trace")
    ax.set_title("Latency by stage (CDF)")
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
        ax.set_xticklabels(stages, rotation=30, ha="right", fontsize="small")
        ax.set_yscale("log")
        ax.set_ylabel("µs")
        ax.legend(loc="best", fontsize="small")
        ax.grid(alpha=0.3, axis="y")
    else:
        _empty(ax, "no latencies in the trace")
    ax.set_title("Latency percentiles by stage")
    return _png(fig)


def fairness(summary: dict[str, Any]) -> bytes:
    """Each consumer's share of its queue's deliveries, with Jain's index per queue."""
    queues = summary.get("consumers") or {}
    fig, ax = plt.subplots(figsize=(9, 3.8))
    labels, values, colours = [], [], []
    cmap = plt.get_cmap("tab10")
    for i, (queue, group) in enumerate(queues.items()):
        for c in group:
            labels.append(f"{queue}\n{c['tag'] or c['consumer']} ({c['consumer']}) p{c['priority']}")
            values.append(c["share"] or 0.0)
            colours.append(cmap(i % 10))
    if labels:
        ax.bar(range(len(labels)), values, color=colours)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize="x-small")
        ax.set_ylabel("share of the queue's deliveries")
        j = summary.get("jain") or {}
        ax.set_title("Per-consumer share — Jain: " + ", ".join(
            f"{q}={v:.3f}" if v is not None else f"{q}=n/a" for q, v in j.items()))
    else:
        _empty(ax, "no consumers in the trace")
        ax.set_title("Per-consumer share")
    return _png(fig)


def processes(summary: dict[str, Any], key: str, ylabel: str, scale: float = 1.0) -> bytes:
    """One line per process over time, for ``cpu_percent`` or ``rss_bytes``."""
    procs = summary.get("processes") or {}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if procs:
        for name, p in procs.items():
            ax.plot(p["t"], [v / scale for v in p[key]], label=name, marker=".", markersize=3)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        ax.legend(loc="best", fontsize="small", ncol=2)
        ax.grid(alpha=0.3)
    else:
        _empty(ax, "no process samples in the trace")
    ax.set_title(ylabel + " per process")
    return _png(fig)


def render_all(summary: dict[str, Any], extra: dict[str, Any]) -> dict[str, bytes]:
    """Every plot of the report, by title, as PNG bytes."""
    return {
        "Throughput": throughput(summary),
        "Latency distribution": latency_cdf(summary, extra),
        "Latency percentiles": latency_percentiles(summary),
        "Consumer shares": fairness(summary),
        "CPU": processes(summary, "cpu_percent", "CPU %"),
        "RSS": processes(summary, "rss_bytes", "RSS (MiB)", scale=1 << 20),
    }
