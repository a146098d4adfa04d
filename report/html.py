"""The self-contained ``report.html``: the summary as tables, the plots embedded as base64 PNGs."""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from report.wording import COUNTS, TABLES, WAKEUPS, consumer, number, percent, process, stage

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
body { padding: 0 1em; }
/* a wide table scrolls inside its own box instead of widening the page */
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 0.92em; display: block;
        max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
td { white-space: nowrap; }  /* a number or a name is never cut in two ... */
td.text { text-align: left; }
/* ... but text after a name (a consumer tag) may wrap anywhere rather than widen the page */
td.text + td.text { white-space: normal; overflow-wrap: anywhere; max-width: 28em; }
th:first-child, th.text { text-align: left; } th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0 1.2em; }
details pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
"""


class Share(float):
    """A share (0 … 1) in a table: written as a percentage."""


def _text(value: Any) -> str:
    if isinstance(value, Share):
        return percent(value)
    if value is None or isinstance(value, int | float):
        return number(value)
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    first = rows[0] if rows else [None] * len(headers)
    head = "".join(f"<th{_kind(v)}>{html.escape(h)}</th>" for h, v in zip(headers, first, strict=True))
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    """Numbers right-aligned; text (names, tags) left-aligned, in a "text" cell."""
    return f"<td{_kind(value)}>{_text(value)}</td>"


def _kind(value: Any) -> str:
    return "" if value is None or isinstance(value, int | float) else " class='text'"


def _share(value: float | None) -> Share | None:
    return None if value is None else Share(value)


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / (1 << 20), 1)


def _img(title: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<h3>{html.escape(title)}</h3>'
            f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">')


def render(summary: dict[str, Any], images: dict[str, bytes]) -> str:
    """The whole page."""
    files = summary.get("files") or {}
    parts = [("<!doctype html><html><head><meta charset='utf-8'><title>Shoal trace report</title>"
              f"<style>{_STYLE}</style></head><body>"),
             "<h1>Shoal trace report</h1>",
             (f"<p class='sub'>{html.escape(str(summary.get('trace_dir', '')))} — trace files: "
              + ", ".join(f"{number(n)} {TABLES.get(t, t)}" for t, n in files.items())
              + (f"; cut short (crash?): {html.escape(', '.join(summary['truncated_files']))}"
                 if summary.get("truncated_files") else "") + "</p>")]

    parts.append("<h2>Messages</h2>")
    keys = list(COUNTS)
    for half in (keys[:7], keys[7:]):  # thirteen counts in one row are wider than a laptop
        parts.append(_table([COUNTS[k] for k in half], [[summary.get(k) for k in half]]))
    client = summary.get("client") or {}
    if client.get("sent") or client.get("received"):
        parts.append(_table(["load generator sent", "received", "redelivered"],
                            [[client.get("sent"), client.get("received"), client.get("redelivered")]]))
    tp = summary.get("throughput") or {}
    if tp.get("mean"):
        kinds = ("published", "delivered", "acked")
        peak, label = tp["peak"], "peak (1 s)"
        fine = tp.get("fine") or {}
        if fine.get("t") and fine["interval_s"] < 1:  # a short run: one-second buckets say little
            peak = {k: max(fine[k]) for k in kinds}
            label = f"peak ({number(fine['interval_s'])} s buckets)"
        parts.append(_table(["messages per second", *kinds],
                            [["mean", *(tp["mean"].get(k) for k in kinds)],
                             [label, *(peak.get(k) for k in kinds)]]))
    if "Throughput" in images:
        parts.append(_img("Throughput", images["Throughput"]))

    parts.append("<h2>Latency (µs)</h2>")
    lat = summary.get("latency_us") or {}
    qk = ["count", "p50", "p90", "p99", "p99.9", "mean", "max"]
    parts.append(_table(["from → to", "messages", *qk[1:]],
                        [[stage(s), *(v.get(k) for k in qk)] for s, v in lat.items()]))
    for title in ("Latency distribution", "Latency percentiles"):
        if title in images:
            parts.append(_img(title, images[title]))

    parts.append("<h2>Fairness</h2>")
    rows = []
    for queue, group in (summary.get("consumers") or {}).items():
        for c in group:
            rows.append([queue, consumer(c["consumer"]), c["tag"], c["priority"], c["delivered"],
                         _share(c["share"])])
    parts.append(_table(["queue", "consumer", "consumer tag", "priority", "delivered",
                         "share of the queue"], rows))
    by_priority = summary.get("jain_by_priority") or {}
    parts.append(_table(
        ["queue", "Jain's fairness index (1 = even)", "by priority"],
        [[q, j, ", ".join(f"priority {p}: {number(v)}" for p, v in by_priority.get(q, {}).items())]
         for q, j in (summary.get("jain") or {}).items()]))
    if "Consumer shares" in images:
        parts.append(_img("Consumer shares", images["Consumer shares"]))

    parts.append("<h2>Wake-ups</h2>")
    w = summary.get("wakeups") or {}

    def wake_row(name: str, v: dict[str, Any]) -> list[Any]:
        return [name, *(v.get(k) for k in list(WAKEUPS)[:-1]), _share(v.get("spurious_share"))]

    parts.append(_table(["queue", *WAKEUPS.values()],
                        [wake_row("all queues", w)]
                        + [wake_row(q, v) for q, v in (w.get("by_queue") or {}).items()]))

    parts.append("<h2>Processes</h2>")
    pk = ["cpu_percent_mean", "cpu_percent_max", "cpu_seconds", "ctx_voluntary", "ctx_involuntary",
          "samples"]
    parts.append(_table(
        ["process", "CPU % mean (100 = one core)", "CPU % max", "CPU seconds", "memory max (MiB)",
         "voluntary context switches", "involuntary context switches", "samples"],
        [[process(n), *(p.get(k) for k in pk[:3]), _mib(p.get("rss_max_bytes")),
          *(p.get(k) for k in pk[3:])]
         for n, p in (summary.get("processes") or {}).items()]))
    for title in ("CPU", "Memory"):
        if title in images:
            parts.append(_img(title, images[title]))

    parts.append("<details><summary>summary.json</summary><pre>"
                 + html.escape(json.dumps(summary, indent=1)) + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
