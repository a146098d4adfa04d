"""psutil sampling of broker processes: CPU, RSS, context switches at a fixed interval.

`Sampler(source, interval)` runs a thread that, every `interval` seconds, asks `source()` for the
broker's current processes ({label: psutil.Process}; Shoal's supervisor and workers, RabbitMQ's
beam.smp and its children) and records each one's cumulative CPU time (user + system, and of it
the system part), RSS and voluntary/involuntary context switches. `mark()` takes an extra sample
at once (the start and end of a measured window are marked, so the window does not depend on the
interval), and `summary(t0, t1)` reduces the samples between two marks to per-process and total figures.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass
class Sample:
    t: float
    cpu_s: float
    rss: int
    ctx_voluntary: int
    ctx_involuntary: int
    sys_s: float = 0.0  # the kernel's part of cpu_s


@dataclass
class Series:
    label: str
    pid: int
    samples: list[Sample] = field(default_factory=list)


def take(process: psutil.Process, now: float) -> Sample | None:
    try:
        with process.oneshot():
            times = process.cpu_times()
            memory = process.memory_info()
            ctx = process.num_ctx_switches()
    except psutil.Error:
        return None
    return Sample(now, times.user + times.system, memory.rss, ctx.voluntary, ctx.involuntary, times.system)


class Sampler:
    def __init__(self, source: Callable[[], dict[str, psutil.Process]], interval: float = 0.5):
        self.source = source
        self.interval = interval
        self.series: dict[int, Series] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.host: list[tuple[float, float]] = []  # (t, busy CPU-seconds of the whole host)

    def start(self) -> None:
        self.mark()
        self._thread = threading.Thread(target=self._run, name="perf-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.mark()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.mark()

    def mark(self) -> float:
        """Sample every process now; return the sample time."""
        now = time.monotonic()
        try:
            processes = self.source()
        except Exception:  # noqa: BLE001 - a dying broker must not kill the sampler
            processes = {}
        host = psutil.cpu_times()
        busy = sum(host) - host.idle - getattr(host, "iowait", 0.0)
        with self._lock:
            self.host.append((now, busy))
            for label, process in processes.items():
                sample = take(process, now)
                if sample is None:
                    continue
                series = self.series.get(process.pid)
                if series is None:
                    series = self.series[process.pid] = Series(label, process.pid)
                series.samples.append(sample)
        return now

    def latest_cpu_percent(self) -> float | None:
        """Broker CPU% (all processes, 100 = one core) over the last two samples."""
        with self._lock:
            total = 0.0
            span = None
            for series in self.series.values():
                if len(series.samples) >= 2:
                    a, b = series.samples[-2], series.samples[-1]
                    if b.t > a.t:
                        total += b.cpu_s - a.cpu_s
                        span = max(span or 0.0, b.t - a.t)
            return round(total / span * 100, 1) if span else None

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """Per process and in total over [t0, t1] (both should be `mark()` times)."""
        per: dict[str, Any] = {}
        total_cpu = total_sys = 0.0
        total_vol = total_inv = 0
        rss_peak_sum: dict[float, int] = {}
        with self._lock:
            for series in self.series.values():
                window = [s for s in series.samples if t0 - 1e-9 <= s.t <= t1 + 1e-9]
                if not window:
                    continue
                first, last = window[0], window[-1]
                cpu = last.cpu_s - first.cpu_s
                span = last.t - first.t
                rates = [
                    (b.cpu_s - a.cpu_s) / (b.t - a.t) * 100
                    for a, b in itertools.pairwise(window)
                    if b.t - a.t >= self.interval * 0.5
                ]
                per[f"{series.label}"] = {
                    "pid": series.pid,
                    "cpu_s": round(cpu, 3),
                    "sys_s": round(last.sys_s - first.sys_s, 3),
                    "cpu_percent_mean": round(cpu / span * 100, 1) if span > 0 else None,
                    "cpu_percent_max": round(max(rates), 1) if rates else None,
                    "rss_max_mb": round(max(s.rss for s in window) / 2**20, 1),
                    "rss_end_mb": round(last.rss / 2**20, 1),
                    "ctx_voluntary": last.ctx_voluntary - first.ctx_voluntary,
                    "ctx_involuntary": last.ctx_involuntary - first.ctx_involuntary,
                    "samples": len(window),
                }
                total_cpu += cpu
                total_sys += last.sys_s - first.sys_s
                total_vol += last.ctx_voluntary - first.ctx_voluntary
                total_inv += last.ctx_involuntary - first.ctx_involuntary
                for s in window:
                    rss_peak_sum[s.t] = rss_peak_sum.get(s.t, 0) + s.rss
        span = t1 - t0
        host = [busy for t, busy in self.host if t0 - 1e-9 <= t <= t1 + 1e-9]
        host_busy = host[-1] - host[0] if len(host) >= 2 else None
        return {
            "processes": per,
            "host_busy_cores": round(host_busy / span, 2) if host_busy is not None and span > 0 else None,
            "cpu_s": round(total_cpu, 3),
            "sys_s": round(total_sys, 3),
            "cores_used": round(total_cpu / span, 2) if span > 0 else None,
            "rss_max_mb": round(max(rss_peak_sum.values()) / 2**20, 1) if rss_peak_sum else None,
            "ctx_voluntary": total_vol,
            "ctx_involuntary": total_inv,
            "ctx_per_s": round((total_vol + total_inv) / span, 1) if span > 0 else None,
        }


def memory_snapshot(processes: dict[str, psutil.Process]) -> dict[str, Any]:
    """RSS, PSS and USS of each process and summed (MB). PSS splits shared pages (the Python
    interpreter's text, Shoal's /dev/shm regions mapped by several processes) between the
    processes sharing them, so its sum counts them once; RSS summed counts them in each."""
    per: dict[str, Any] = {}
    rss = pss = uss = 0
    for label, process in processes.items():
        with contextlib.suppress(psutil.Error):
            info = process.memory_full_info()
            per[label] = {
                "rss_mb": round(info.rss / 2**20, 2),
                "pss_mb": round(getattr(info, "pss", info.rss) / 2**20, 2),
                "uss_mb": round(info.uss / 2**20, 2),
            }
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
            uss += info.uss
    return {
        "processes": per,
        "rss_bytes": rss,
        "pss_bytes": pss,
        "uss_bytes": uss,
        "rss_mb": round(rss / 2**20, 1),
        "pss_mb": round(pss / 2**20, 1),
        "uss_mb": round(uss / 2**20, 1),
    }
