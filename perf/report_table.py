"""Markdown tables of `python -m perf` results (pure functions of the result dicts)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return "–"
    return f"{a / b:.2f}"


def _get(result: dict[str, Any] | None, *path: str) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def integrity(result: dict[str, Any] | None) -> str:
    """'lost/duplicated/reordered', with '!' when anything is off or the run had errors."""
    if not result:
        return "–"
    if result.get("failed"):
        return "failed"
    i = result.get("integrity") or {}
    text = f"{i.get('lost', '?')}/{i.get('duplicates', '?')}/{i.get('reordered', '?')}"
    bad = any(i.get(k) for k in ("lost", "duplicates", "reordered", "foreign")) or bool(result.get("errors"))
    return text + (" !" if bad else "")


def gen_flag(result: dict[str, Any] | None) -> str:
    if not result or result.get("generator_max_cpu_fraction") is None:
        return "–"
    pct = f"{result['generator_max_cpu_fraction'] * 100:.0f}%"
    return f"**yes** ({pct})" if result.get("generator_bound") else f"no ({pct})"


def _latency(result: dict[str, Any] | None) -> str:
    p50, p99 = _get(result, "latency", "p50_ms"), _get(result, "latency", "p99_ms")
    if p50 is None:
        return "–"
    return f"{p50:.2f} / {p99:.2f}"


def comparison_table(rows: Sequence[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]) -> str:
    """rows: (scenario key, Shoal result, RabbitMQ result or None) for S1-S7."""
    header = (
        "| scenario | Shoal msg/s | RabbitMQ msg/s | ratio | Shoal msg/CPU-s | RabbitMQ msg/CPU-s | ratio "
        "| broker cores S / R | p50 / p99 ms Shoal | p50 / p99 ms RabbitMQ | p99 ratio "
        "| lost/dup/reord S; R | generator-bound S; R | other load, cores S; R |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|---|---|"
    )
    lines = [header]
    for key, shoal, rabbit in rows:
        s_rate, r_rate = _get(shoal, "delivered_per_s"), _get(rabbit, "delivered_per_s")
        s_eff, r_eff = _get(shoal, "delivered_per_broker_cpu_s"), _get(rabbit, "delivered_per_broker_cpu_s")
        s_p99, r_p99 = _get(shoal, "latency", "p99_ms"), _get(rabbit, "latency", "p99_ms")
        cores = (f"{num(_get(shoal, 'broker_cpu', 'cores_used'), 2)} / "
                 f"{num(_get(rabbit, 'broker_cpu', 'cores_used'), 2)}")
        lines.append(
            f"| {key} | {num(s_rate)} | {num(r_rate)} | {ratio(s_rate, r_rate)} | {num(s_eff)} | {num(r_eff)} "
            f"| {ratio(s_eff, r_eff)} | {cores} | {_latency(shoal)} | {_latency(rabbit)} | {ratio(s_p99, r_p99)} "
            f"| {integrity(shoal)}; {integrity(rabbit)} | {gen_flag(shoal)}; {gen_flag(rabbit)} "
            f"| {num(_get(shoal, 'other_load_cores'), 2)}; {num(_get(rabbit, 'other_load_cores'), 2)} |"
        )
    return "\n".join(lines)


def _clients_on(result: dict[str, Any] | None, label: str) -> str:
    """``worker0`` with the clients it holds: ``worker0 (pub)``, ``worker1 (con 8)``."""
    index = label.removeprefix("worker")
    if not index.isdigit():
        return label
    held = []
    for key, count in sorted((_get(result, "connections_on_workers") or {}).items()):
        role, _, worker = key.partition("@w")
        if worker == index:
            held.append(role[:3] + (f" {count}" if count > 1 else ""))
    return f"{label} ({', '.join(held)})" if held else label


def _split(cpu: float | None, sys: float | None, delivered: float | None) -> str:
    """µs of CPU a delivered message, user + system: ``40 + 55``."""
    if cpu is None or sys is None or not delivered:
        return "–"
    return f"{(cpu - sys) / delivered * 1e6:.0f} + {sys / delivered * 1e6:.0f}"


def cpu_split_table(rows: Sequence[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]) -> str:
    """Where each broker's CPU goes, in µs a delivered message, user + system (the kernel's part:
    socket copies, wake-ups), in all and per Shoal process; rows as ``comparison_table``'s."""
    lines = [
        "| scenario | Shoal user + sys µs/msg | RabbitMQ user + sys µs/msg | Shoal per process, user + sys µs/msg |",
        "|---|---:|---:|---|",
    ]
    for key, shoal, rabbit in rows:
        cells = []
        for result in (shoal, rabbit):
            cpu = _get(result, "broker_cpu")
            cells.append(_split(_get(cpu, "cpu_s"), _get(cpu, "sys_s"), _get(result, "delivered")))
        per = []
        for label, process in (_get(shoal, "broker_cpu", "processes") or {}).items():
            split = _split(process.get("cpu_s"), process.get("sys_s"), _get(shoal, "delivered"))
            if split != "–" and (process.get("cpu_s") or 0) > 0.005:
                per.append(f"{_clients_on(shoal, label)} {split}")
        lines.append(f"| {key} | {cells[0]} | {cells[1]} | {'; '.join(per) or '–'} |")
    return "\n".join(lines)


def memory_table(shoal: dict[str, Any] | None, rabbit: dict[str, Any] | None) -> str:
    """S8: broker memory with queued messages and with idle connections."""
    messages = _get(shoal, "queued", "queued") or _get(rabbit, "queued", "queued")
    conns = _get(shoal, "idle", "opened") or _get(rabbit, "idle", "opened")
    figures = [
        (f"{num(messages)} queued 128 B messages: RSS of all broker processes, MB", ("queued", "rss_mb"), 0),
        (f"{num(messages)} queued 128 B messages: PSS of all broker processes, MB", ("queued", "pss_mb"), 0),
        ("queued messages: broker PSS growth per message, bytes", ("queued", "bytes_per_message_pss"), 0),
        ("RabbitMQ's own count of what it uses (Erlang allocated), MB", ("queued", "own_allocated_mb"), 0),
        ("time to queue them, s", ("queued", "fill_seconds"), 1),
        ("--s8-drain: peak RSS while one consumer takes them all, MB", ("drained", "peak_rss_mb"), 0),
        ("--s8-drain: delivered msg/s (prefetch 1,000, an ack per 100)", ("drained", "rate"), 0),
        (f"{num(conns)} idle connections: RSS growth per connection, KB", ("idle", "per_connection_kb_rss"), 1),
        (f"{num(conns)} idle connections: PSS growth per connection, KB", ("idle", "per_connection_kb_pss"), 1),
        ("baseline (idle broker) RSS, MB", ("idle", "baseline", "rss_mb"), 0),
    ]
    lines = ["| S8 memory | Shoal | RabbitMQ | ratio |", "|---|---:|---:|---:|"]
    for label, path, digits in figures:
        a, b = _get(shoal, *path), _get(rabbit, *path)
        lines.append(f"| {label} | {num(a, digits)} | {num(b, digits)} | {ratio(a, b)} |")
    return "\n".join(lines)


SATURATED = 0.90  # a process at this share of one core, or the host at this share of its CPUs


def busiest(result: dict[str, Any] | None) -> tuple[str, float] | None:
    """The broker process that used the most CPU in ``result`` and its mean share of one core (%)."""
    best: tuple[str, float] | None = None
    for label, process in (_get(result, "broker_cpu", "processes") or {}).items():
        pct = process.get("cpu_percent_mean")
        if pct is not None and (best is None or pct > best[1]):
            best = (label, pct)
    return best


def _share(process: tuple[str, float]) -> str:
    return f"{process[0]} {process[1]:.0f}%"


def saturated(result: dict[str, Any] | None, cpus: int | None) -> list[str]:
    """What ran out of CPU in ``result``, busiest first: a broker process at SATURATED of one core
    or more, a client process (the scenario's generator) likewise, or the host's CPUs all busy."""
    found: list[tuple[float, str]] = []
    top = busiest(result)
    if top is not None and top[1] >= SATURATED * 100:
        found.append((top[1] / 100, _share(top)))
    gen = _get(result, "generator_max_cpu_fraction")
    if gen is not None and gen >= SATURATED:
        found.append((gen, f"a client process {gen * 100:.0f}%"))
    host = _get(result, "broker_cpu", "host_busy_cores")
    if cpus and host is not None and host >= SATURATED * cpus:
        found.append((host / cpus, f"the host's {cpus} CPUs ({host:.2f} busy)"))
    return [text for _, text in sorted(found, reverse=True)]


def saturates_first(results: dict[int, dict[str, Any] | None], cpus: int | None) -> str:
    """The fewest workers at which something ran out of CPU, and what; else the busiest broker
    process at the most workers."""
    for workers in sorted(results):
        found = saturated(results[workers], cpus)
        if found:
            return f"w={workers}: " + ", ".join(found)
    most = max(results, default=None)
    top = busiest(results[most]) if most is not None else None
    return f"none (w={most}: {_share(top)})" if top is not None else "–"


def scaling_table(results: dict[int, dict[str, dict[str, Any]]], cpus: int | None = None) -> str:
    """results: workers -> scenario key -> Shoal result; ``cpus``: the host's, for its saturation."""
    counts = sorted(results)
    keys: list[str] = []
    for per in results.values():
        keys.extend(k for k in per if k not in keys)
    base = counts[0] if counts else 1
    head = ["scenario"]
    head += [f"w={w} msg/s" for w in counts]
    head += [f"w={w}/w={base}" for w in counts[1:]]
    head += [f"w={w} msg/CPU-s" for w in counts]
    head += [f"w={w} cores" for w in counts]
    head += [f"w={w} busiest" for w in counts]
    head += ["saturates first", "lost/dup/reord", "generator-bound", "other load, cores"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 5 - len(counts))
             + "---|" * (len(counts) + 4)]
    for key in keys:
        row = [key]
        rates = {w: _get(results[w].get(key), "delivered_per_s") for w in counts}
        row += [num(rates[w]) for w in counts]
        row += [ratio(rates[w], rates[base]) for w in counts[1:]]
        row += [num(_get(results[w].get(key), "delivered_per_broker_cpu_s")) for w in counts]
        row += [num(_get(results[w].get(key), "broker_cpu", "cores_used"), 2) for w in counts]
        for w in counts:
            top = busiest(results[w].get(key))
            row.append(_share(top) if top is not None else "–")
        row.append(saturates_first({w: results[w].get(key) for w in counts}, cpus))
        row.append(", ".join(integrity(results[w].get(key)) for w in counts))
        row.append(", ".join(gen_flag(results[w].get(key)) for w in counts))
        row.append(", ".join(num(_get(results[w].get(key), "other_load_cores"), 2) for w in counts))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def errors_section(results: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        for item in (r, r.get("after")):  # an overload scenario's follow-up run has errors of its own
            if not isinstance(item, dict):
                continue
            for error in item.get("errors") or []:
                lines.append(f"- {item.get('broker') or r.get('broker')} {item.get('scenario')}: {error}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- overload scenarios


def _generator(result: dict[str, Any] | None) -> str:
    if not result or not result.get("generator"):
        return "–"
    kind = "C" if result["generator"] == "c" else f"Python ×{result.get('publisher_processes', '?')}"
    pct = f"{(result.get('generator_max_cpu_fraction') or 0) * 100:.0f}%"
    return f"{kind}, **bound** ({pct})" if result.get("generator_bound") else f"{kind} ({pct})"


def _side(result: dict[str, Any] | None, label: str) -> str:
    return f"{label} !" if (result or {}).get("errors") or (result or {}).get("failed") else label


def shares(counts: list[int] | None) -> str:
    """Each publisher's part of the deliveries, per cent ("24.8 / 25.3 / 24.9 / 25.0"); empty
    for one publisher or none delivered."""
    if not counts or len(counts) < 2 or not sum(counts):
        return ""
    total = sum(counts)
    return " / ".join(f"{100 * c / total:.1f}" for c in counts)


def clients_rates(result: dict[str, Any] | None) -> str:
    """Each publisher's rate and each consumer's ("publishers 2,998 / 3,001; consumers c0.0 50,
    c1.0 2,990"), when the scenario's publishers are paced (S10u: who held whom back); else empty."""
    if not result or not _get(result, "publisher_rates") or not (result.get("rate") or 0):
        return ""
    publishers = " / ".join(num(rate) for rate in result["publisher_rates"])
    consumers = ", ".join(f"{name} {num(rate)}" for name, rate in (result.get("consumer_rates") or {}).items())
    return f"publishers {publishers}; consumers {consumers}"


def overload_table(key: str, shoal: dict[str, Any] | None, rabbit: dict[str, Any] | None) -> str:
    """One overload scenario: a row per broker, then Shoal / RabbitMQ (deliver msg/s is the ratio
    that matters; the others are there to read it by). A `!` after a side: errors, listed below."""
    named = [(shoal, "shoal"), (rabbit, "rabbitmq")] if rabbit is not None else [(shoal, "shoal")]
    pair = [(result, (result or {}).get("broker") or name) for result, name in named]
    title = (shoal or rabbit or {}).get("title", "")
    if (shoal or rabbit or {}).get("kind") == "steady":
        lines = [
            f"{key}: {title}",
            "",
            "| side | deliver msg/s | broker cores | broker cores idle | p50 / p99 ms | generator "
            "| other load, cores |",
            "|---|---:|---:|---:|---|---|---:|",
        ]
        for result, name in pair:
            lines.append(
                f"| {_side(result, name)} | {num(_get(result, 'delivered_per_s'))} "
                f"| {num(_get(result, 'broker_cores'), 2)} "
                f"| {num(_get(result, 'idle_cores'), 2)} | {_latency(result)} | {_generator(result)} "
                f"| {num(_get(result, 'other_load_cores'), 2)} |"
            )
        if rabbit is not None:
            lines.append(
                f"| Shoal / RabbitMQ | {ratio(_get(shoal, 'delivered_per_s'), _get(rabbit, 'delivered_per_s'))} "
                f"| {ratio(_get(shoal, 'broker_cores'), _get(rabbit, 'broker_cores'))} "
                f"| {ratio(_get(shoal, 'idle_cores'), _get(rabbit, 'idle_cores'))} "
                f"| {ratio(_get(shoal, 'latency', 'p99_ms'), _get(rabbit, 'latency', 'p99_ms'))} (p99) | | |"
            )
        return "\n".join(lines)
    lines = [
        f"{key}: {title}",
        "",
        "| side | publish msg/s | deliver msg/s | backlog at end | broker cores | broker RSS max, MB "
        "| unaccounted | generator | other load, cores |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for result, name in pair:
        lines.append(
            f"| {_side(result, name)} | {num(_get(result, 'published_per_s'))} "
            f"| {num(_get(result, 'delivered_per_s'))} "
            f"| {num(_get(result, 'backlog_end'))} | {num(_get(result, 'broker_cores'), 2)} "
            f"| {num(_get(result, 'broker_rss_max_mb'))} | {num(_get(result, 'unaccounted'))} | {_generator(result)} "
            f"| {num(_get(result, 'other_load_cores'), 2)} |"
        )
    if rabbit is not None:
        lines.append(
            f"| Shoal / RabbitMQ | {ratio(_get(shoal, 'published_per_s'), _get(rabbit, 'published_per_s'))} "
            f"| **{ratio(_get(shoal, 'delivered_per_s'), _get(rabbit, 'delivered_per_s'))}** "
            f"| {ratio(_get(shoal, 'backlog_end'), _get(rabbit, 'backlog_end'))} "
            f"| {ratio(_get(shoal, 'broker_cores'), _get(rabbit, 'broker_cores'))} "
            f"| {ratio(_get(shoal, 'broker_rss_max_mb'), _get(rabbit, 'broker_rss_max_mb'))} | | | |"
        )
    rates = [(name, clients_rates(result)) for result, name in pair]
    if any(line for _name, line in rates):
        lines += ["", "Each client, msg/s: " + "; ".join(f"{name} {line}" for name, line in rates if line)]
    spreads = [(name, shares(_get(result, "delivered_by_publisher"))) for result, name in pair]
    if any(spread for _name, spread in spreads):
        lines += ["", "Deliveries by publisher (its own queue), per cent: " + "; ".join(
            f"{name} {spread}" for name, spread in spreads if spread)]
    afters = [(_get(result, "after"), name) for result, name in pair]
    if any(after for after, _name in afters):
        lines += [
            "",
            f"{key} then, on the same broker: {(afters[0][0] or {}).get('title') or 'ping-pong'}",
            "",
            "| side | deliver msg/s | p50 ms | p99 ms | broker cores | s after the overload |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for after, name in afters:
            lines.append(
                f"| {_side(after, name)} | {num(_get(after, 'delivered_per_s'))} "
                f"| {num(_get(after, 'latency', 'p50_ms'), 2)} | {num(_get(after, 'latency', 'p99_ms'), 2)} "
                f"| {num(_get(after, 'broker_cores'), 2)} | {num(_get(after, 'since_overload_s'), 1)} |"
            )
        if rabbit is not None:
            s_after, r_after = afters[0][0], afters[1][0]
            lines.append(
                f"| Shoal / RabbitMQ | {ratio(_get(s_after, 'delivered_per_s'), _get(r_after, 'delivered_per_s'))} "
                f"| {ratio(_get(s_after, 'latency', 'p50_ms'), _get(r_after, 'latency', 'p50_ms'))} "
                f"| {ratio(_get(s_after, 'latency', 'p99_ms'), _get(r_after, 'latency', 'p99_ms'))} "
                f"| {ratio(_get(s_after, 'broker_cores'), _get(r_after, 'broker_cores'))} | |"
            )
    return "\n".join(lines)


def round_ratios(pairs: Sequence[tuple[dict[str, Any] | None, dict[str, Any] | None]]) -> dict[str, list[float]]:
    """Shoal / RabbitMQ per round (``--rounds``): delivered msg/s and messages per broker
    CPU-second, for every round where both sides have the figure."""
    out: dict[str, list[float]] = {"delivered_per_s": [], "delivered_per_broker_cpu_s": []}
    for shoal, rabbit in pairs:
        for key, values in out.items():
            a, b = _get(shoal, key), _get(rabbit, key)
            if a and b:
                values.append(a / b)
    return out


def rounds_table(rows: Sequence[tuple[str, dict[str, list[float]]]]) -> str:
    """Per scenario: the ratio of each round and their median, for msg/s and per broker CPU-s."""
    lines = [
        "| scenario | msg/s ratio per round | median | per-CPU-s ratio per round | median |",
        "|---|---|---:|---|---:|",
    ]
    for key, ratios in rows:
        cells = []
        for name in ("delivered_per_s", "delivered_per_broker_cpu_s"):
            values = ratios.get(name, [])
            cells.append(", ".join(f"{v:.2f}" for v in values) or "–")
            cells.append(f"**{statistics.median(values):.2f}**" if values else "–")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

