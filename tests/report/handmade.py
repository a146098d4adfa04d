"""A small hand-made trace and the answers worked out by hand (see EXPECTED).

The story, on one host (T = 10 s of the monotonic clock, times in ns):

* worker0 (pid 200) publishes 13 messages, worker1 (pid 201) 4, then worker1 "crashes" while
  writing a last batch of 2 more publishes: its message file is cut inside that batch, so those
  2 are lost and must not be counted.
* queue q1 — consumers c1 "a" (worker1, id 1), c2 "b" (worker1, id 2), c3 "c" (worker0, id 3) and
  c4 "idle" (worker0, id 4, subscribed, never gets anything); the supervisor writes *partial*
  enqueue / notify / pull rows and a settle row without timestamps:
    - entries 1..10 (msg e, published at T + e ms by worker0): 1..5 → c1, 6..8 → c2, 9..10 → c3;
    - entry 3 is requeued by the client after its first delivery and redelivered to c1;
    - entry 8 is rejected by the client (final: rejected);
    - entry 15 expires undelivered; entry 16 goes to c3, is rejected by the client and the
      supervisor dead-letters it (final: dead-lettered, the supervisor wins);
    - message 17 is unroutable (a publish row, no entry).
* queue q2 — consumers c5 "hi" (worker0, id 5, priority 10) and c6 "lo" (worker1, id 6,
  priority 0); the supervisor writes one *wide* settle row with stamped enqueue / notify / pull
  times; entries 11..14 (published by worker1 at T + 1 s + e ms): 11..13 → c5, 14 → c6.

Per entry e: enqueued = published + 10e µs, notified = enqueued + 5 µs (entries 1..5, 11, 12),
pulled = enqueued + 20 µs, delivered = pulled + 30 µs, client ack = delivered + 100 µs,
settled = ack + 7 µs. Entry 3: requeue 50 µs after its first delivery, redelivered 200 µs after
its first delivery, acked 100 µs after that.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from perf.trace_writers import ClientTraceWriter, ProcSampleWriter
from tracing import schema as ts
from tracing.writer import ArrowTraceWriter

T = 10_000_000_000
US = 1_000
MS = 1_000_000
SUP_PID, W0_PID, W1_PID = 100, 200, 201

# consumer -> (worker, id, tag, queue, priority)
CONSUMERS = {
    "c1": (1, 1, "a", "q1", 0), "c2": (1, 2, "b", "q1", 0), "c3": (0, 3, "c", "q1", 0),
    "c4": (0, 4, "idle", "q1", 0), "c5": (0, 5, "hi", "q2", 10), "c6": (1, 6, "lo", "q2", 0),
}
ASSIGN = {**{e: "c1" for e in range(1, 6)}, **{e: "c2" for e in (6, 7, 8)},
          **{e: "c3" for e in (9, 10, 16)}, **{e: "c5" for e in (11, 12, 13)}, 14: "c6"}
NOTIFIED = {1, 2, 3, 4, 5, 11, 12}

EXPECTED: dict[str, Any] = {
    "published": 17,   # 13 by worker0 + 4 by worker1 (2 more lost in the cut batch)
    "delivered": 16,   # entries 1..14 and 16, plus entry 3's redelivery
    "acked": 13,       # 1..7, 9..14
    "rejected": 1,     # 8
    "requeued": 1,     # 3
    "redelivered": 1,  # 3
    "expired": 1,      # 15
    "dead_lettered": 1,  # 16
    "dropped": 0,
    "unsettled": 0,
    "unrouted": 1,     # 17
    "entries": 16,
    "join_mismatches": 1,  # entry 10's settle row disagrees with its publish row
    # deliveries: q1 c1 6 (3 twice), c2 3, c3 3, c4 0 -> (12)^2 / (4 * (36+9+9+0)) = 2/3
    #             q2 c5 3, c6 1 -> 16 / (2 * 10) = 0.8
    "jain": {"q1": 144 / 216, "q2": 0.8},
    "jain_by_priority": {"q1": {"0": 144 / 216}, "q2": {"10": 1.0, "0": 1.0}},
    "share": {"q1": {"w1.c1": 0.5, "w1.c2": 0.25, "w0.c3": 0.25, "w0.c4": 0.0},
              "q2": {"w0.c5": 0.75, "w1.c6": 0.25}},
    # 8 notifies; 8 pulls that followed a notify, 2 of which found nothing; 3 further pulls
    "notifies": 8, "notified_pulls": 8, "spurious_pulls": 2, "pulls": 11,
    "spurious_wakeup_share": 2 / 8,
    "wakeups_per_delivered": 8 / 16,
    "throughput": {"published": [13, 4], "delivered": [12, 4], "acked": [9, 4]},
}


def published_ns(e: int) -> int:
    return T + e * MS + (1_000 * MS if 11 <= e <= 14 else 0)


def _times(e: int) -> dict[str, int]:
    p = published_ns(e)
    t = {"published": p, "enqueued": p + 10 * e * US}
    t["notified"] = t["enqueued"] + 5 * US
    t["pulled"] = t["enqueued"] + 20 * US
    t["delivered"] = t["pulled"] + 30 * US
    t["acked"] = t["delivered"] + 100 * US
    if e == 3:
        t["requeued"] = t["delivered"] + 50 * US
        t["pulled2"] = t["delivered"] + 190 * US
        t["redelivered"] = t["delivered"] + 200 * US
        t["acked"] = t["redelivered"] + 100 * US
    t["settled"] = t["acked"] + 7 * US
    return t


def _sorted_values(values: list[int]) -> list[float]:
    return sorted(v / US for v in values)


def expected_latencies() -> dict[str, list[float]]:
    """Every stage's values in µs, computed straight from the story."""
    acked = [e for e in range(1, 15) if e != 8]
    delivered = [e for e in range(1, 17) if e != 15]
    t = {e: _times(e) for e in range(1, 17)}
    return {
        "publish_to_enqueue": _sorted_values([t[e]["enqueued"] - t[e]["published"] for e in range(1, 17)]),
        "enqueue_to_notify": _sorted_values([t[e]["notified"] - t[e]["enqueued"] for e in NOTIFIED]),
        "pull_to_deliver": _sorted_values([t[e]["delivered"] - t[e]["pulled"] for e in delivered]),
        "deliver_to_ack": _sorted_values(
            [t[e]["acked"] - t[e].get("redelivered", t[e]["delivered"]) for e in acked]),
        "end_to_end": _sorted_values([t[e]["acked"] - t[e]["published"] for e in acked]),
        "client_end_to_end": [250.0, 500.0, 750.0],
    }


def write_trace(directory: Path) -> dict[str, Any]:
    """Write the story into ``directory``; returns facts the tests need (the cut file)."""
    sup = ArrowTraceWriter(directory, "supervisor", pid=SUP_PID)
    w = {0: ArrowTraceWriter(directory, "worker0", worker=0, pid=W0_PID),
         1: ArrowTraceWriter(directory, "worker1", worker=1, pid=W1_PID)}
    publisher = {e: 1 if 11 <= e <= 14 else 0 for e in range(1, 18)}
    pub_pid = {0: W0_PID, 1: W1_PID}
    seq: dict[int, int] = {}

    for wk, cid, tag, queue, prio in CONSUMERS.values():
        sup.consume_event(T - MS, queue, wk, cid, tag, prio, False)

    for e in sorted(publisher, key=published_ns):
        seq[e] = w[publisher[e]].published(published_ns(e), 7, 1, "", "q2" if 11 <= e <= 14 else "q1", 100)

    for e in range(1, 17):
        t, queue = _times(e), ("q2" if 11 <= e <= 14 else "q1")
        pw = publisher[e]
        consumer = ASSIGN.get(e)
        cw, cid, tag, _, _ = CONSUMERS[consumer] if consumer else (None, None, None, None, None)
        if queue == "q1":
            sup.enqueued(t["enqueued"], e, e, queue, pw, pub_pid[pw], seq[e], "", queue, 100)
            if e in NOTIFIED:
                sup.notified(t["notified"], e, cw, cid)
            if consumer:
                sup.pulled(t["pulled"], e, cw, cid)
        if consumer:
            w[cw].delivered(t["delivered"], e, queue, cid, tag, False)
        if e == 3:
            w[cw].acked(t["requeued"], e, ts.REQUEUED)
            sup.requeue_event(t["requeued"] + US, queue, e, cw, cid)
            sup.pulled(t["pulled2"], e, cw, cid)
            w[cw].delivered(t["redelivered"], e, queue, cid, tag, True)
        if e == 15:
            sup.settled(t["settled"], ts.EXPIRED, e, e, queue, pw, pub_pid[pw], seq[e],
                        exchange="", routing_key=queue, body_size=100)
            continue
        client_outcome = ts.REJECTED if e in (8, 16) else ts.ACKED
        if client_outcome == ts.ACKED:
            w[cw].acked_many(t["acked"], [e], ts.ACKED)
        else:
            w[cw].acked(t["acked"], e, client_outcome)
        final = {8: ts.REJECTED, 16: ts.DEAD_LETTERED}.get(e, ts.ACKED)
        if queue == "q1":
            # entry 10's row names another routing key than its publish: a join mismatch
            sup.settled(t["settled"], final, e, e, queue, pw, pub_pid[pw], seq[e], cw, cid,
                        1 if e == 3 else 0, exchange="", routing_key="other" if e == 10 else queue,
                        body_size=100)
        else:  # q2: the wide row with stamped times, no exchange / key / size
            sup.settled(t["settled"], final, e, e, queue, pw, pub_pid[pw], seq[e], cw, cid, 0,
                        t["enqueued"], t["notified"] if e in NOTIFIED else None, t["pulled"])

    # wake-ups: q1 6 notifies (4 pulls found work, 2 spurious) + 3 pulls without a notify;
    # q2 2 notifies, both pulls found work
    for i, found in enumerate([True, True, False, True, False, True]):
        sup.notify_event(T + i * MS, "q1", 1, 1)
        sup.pull_event(T + i * MS + US, "q1", 1, 1, 1 if found else 0, found)
    for i in range(3):
        sup.pull_event(T + 50 * MS + i * MS, "q1", 1, 2, 1, None)
    for i in range(2):
        sup.notify_event(T + 1_000 * MS + i * MS, "q2", 0, 5)
        sup.pull_event(T + 1_000 * MS + i * MS + US, "q2", 0, 5, 2, True)

    sup.close()
    w[0].close()
    # worker1: everything so far is one complete flush; the next batch is cut by the "crash"
    w[1].flush()
    msg_file = w[1].paths[0]
    whole = os.path.getsize(msg_file)
    w[1].published(T + 1_500 * MS, 7, 1, "", "q2", 100)
    w[1].published(T + 1_501 * MS, 7, 1, "", "q2", 100)
    w[1].close()
    size = os.path.getsize(msg_file)
    with open(msg_file, "r+b") as f:
        f.truncate(whole + (size - whole) // 2)

    # psutil samples: supervisor at T, T+0.5 s, T+1 s, T+1.5 s
    samples = ProcSampleWriter(directory, "sampler", pid=300)
    for i, cpu in enumerate([10.0, 20.0, 30.0, 40.0]):
        samples.sample(T + i * 500 * MS, SUP_PID, "supervisor", cpu, (i + 1) << 20,
                       1.0 + 0.1 * i, 0.1 * i, 10 * i, i)
    # worker0 without psutil's cpu_percent: the report derives it from the cumulative CPU times
    for i, cpu_s in enumerate([0.0, 0.25, 0.5, 1.0]):
        samples.sample(T + i * 500 * MS, W0_PID, "worker0", None, 1 << 20, cpu_s, 0.0, 0, 0)
    samples.close()

    # the load generator: 13 + 4 sent, 3 received with known latencies
    pub = ClientTraceWriter(directory, "publisher0", pid=400)
    pub.sent(T, 0, 0, 13, "q1")
    pub.sent(T + 1_000 * MS, 0, 13, 4, "q2")
    pub.close()
    con = ClientTraceWriter(directory, "consumer0", pid=401)
    for i, lat in enumerate([250, 500, 750]):
        con.received(T + 2 * MS + lat * US, 0, i, T + 2 * MS, "q1", False)
    con.close()
    return {"cut_file": msg_file.name}
