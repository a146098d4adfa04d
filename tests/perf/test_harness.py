"""Smoke tests of the perf harness pieces (no brokers, no timing assertions).

The load generator's hot paths are hand-written against the AMQP wire format, so they are checked
against pamqp: publish frames it pre-encodes must unmarshal to what was meant, and the delivery
parser must read what pamqp marshals, however the bytes are split across reads.
"""

from __future__ import annotations

import random
import struct
from array import array
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.heartbeat import Heartbeat

from perf import brokers
from perf.__main__ import default_scaling_workers, parse_args
from perf.accounting import latency_summary, merge_group, percentile
from perf.at_rest import line, schedstat, window
from perf.brokers import child_role, rabbitmq_wanted
from perf.idle_cost import _trace_args, per_process_table, stage_table
from perf.report_table import (
    comparison_table,
    cpu_split_table,
    integrity,
    memory_table,
    ratio,
    round_ratios,
    rounds_table,
    saturates_first,
    scaling_table,
)
from perf.sampler import Sample, Sampler, Series
from perf.wire import (
    MAGIC,
    PAYLOAD,
    DeliveryParser,
    PublishBatch,
    ack_frame,
    publish_template,
    split_frames,
)


def unmarshal_all(data: bytes) -> list[Any]:
    out: list[Any] = []
    while data:
        used, _channel, value = frame.unmarshal(data)
        out.append(value)
        data = data[used:]
    return out


def delivery(tag: int, body: bytes, frame_max: int = 131072, redelivered: bool = False) -> bytes:
    parts = [
        frame.marshal(
            commands.Basic.Deliver(
                consumer_tag="ctag", delivery_tag=tag, redelivered=redelivered, exchange="", routing_key="q"
            ),
            1,
        ),
        frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties()), 1),
    ]
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        parts.append(frame.marshal(ContentBody(body[start : start + chunk]), 1))
    return b"".join(parts)


def payload_body(pub: int, seq: int, ts: int, size: int = 128) -> bytes:
    return PAYLOAD.pack(MAGIC, pub, seq, ts) + b"x" * (size - PAYLOAD.size)


# --------------------------------------------------------------------------- publish frames


@pytest.mark.parametrize("body_size", [20, 128, 4096, 256 * 1024])
def test_publish_batch_round_trips_through_pamqp(body_size: int) -> None:
    frame_max = 131072
    template, patch_at = publish_template("ex", "rk", body_size, publisher=3, frame_max=frame_max)
    batch = PublishBatch(template, patch_at, capacity=4)
    data = bytes(batch.fill(3, first_seq=41, timestamp_ns=123456789))
    frames = unmarshal_all(data)
    bodies_per_message = -(-body_size // (frame_max - 8))
    assert len(frames) == 3 * (2 + bodies_per_message)
    for n in range(3):
        group = frames[n * (2 + bodies_per_message) : (n + 1) * (2 + bodies_per_message)]
        publish, content_header, *bodies = group
        assert isinstance(publish, commands.Basic.Publish)
        assert (publish.exchange, publish.routing_key) == ("ex", "rk")
        assert isinstance(content_header, header.ContentHeader)
        assert content_header.body_size == body_size
        body = b"".join(b.value for b in bodies)
        assert len(body) == body_size
        assert all(len(b.value) <= frame_max - 8 for b in bodies)
        assert PAYLOAD.unpack_from(body) == (MAGIC, 3, 41 + n, 123456789)


def test_publish_template_rejects_bodies_too_small_for_the_payload() -> None:
    with pytest.raises(ValueError):
        publish_template("", "q", PAYLOAD.size - 1, publisher=0, frame_max=131072)


def test_ack_frame_matches_pamqp() -> None:
    assert ack_frame(1, 77) == frame.marshal(commands.Basic.Ack(delivery_tag=77, multiple=True), 1)
    assert ack_frame(5, 2**40, multiple=False) == frame.marshal(commands.Basic.Ack(delivery_tag=2**40), 5)


def test_split_frames_keeps_incomplete_tail() -> None:
    a = frame.marshal(commands.Basic.QosOk(), 1)
    b = frame.marshal(commands.Basic.ConsumeOk(consumer_tag="t"), 1)
    frames, used = split_frames(a + b[:-3])
    assert [raw for _ch, raw in frames] == [a]
    assert used == len(a)


# --------------------------------------------------------------------------- the delivery parser


def feed(parser: DeliveryParser, data: bytes, cuts: list[int], now_ns: int) -> None:
    """Feed `data` to the parser split at `cuts`, like a socket delivering it in pieces."""
    buf = bytearray()
    pos = 0
    edges = [*sorted(set(cuts)), len(data)]
    start = 0
    for edge in edges:
        buf += data[start:edge]
        start = edge
        used = parser.parse(buf, pos, len(buf), now_ns)
        del buf[:used]
    assert not buf


@pytest.mark.parametrize("body_size", [128, 300_000])
def test_parser_reads_pamqp_deliveries_split_anywhere(body_size: int) -> None:
    rng = random.Random(body_size)
    stream = b"".join(delivery(tag, payload_body(0, tag - 1, 1_000_000, body_size)) for tag in range(1, 51))
    stream += frame.marshal(Heartbeat(), 0) + frame.marshal(commands.Basic.CancelOk(consumer_tag="c"), 1)
    parser = DeliveryParser([100])
    feed(parser, stream, [rng.randrange(len(stream)) for _ in range(200)], now_ns=3_000_000)
    assert parser.received == 50
    assert parser.last_tag == 50
    assert (parser.duplicates, parser.reordered, parser.foreign, parser.redelivered) == (0, 0, 0, 0)
    assert sum(parser.seen[0]) == 50 and parser.seen[0][:50] == b"\x01" * 50
    assert list(parser.latencies_us) == [2000] * 50
    assert len(parser.other) == 1 and isinstance(parser.other[0], commands.Basic.CancelOk)


def test_parser_counts_a_message_once_its_last_body_frame_is_in() -> None:
    """What the consumer may ack (`received`, `last_tag`) is whole messages, as a client library
    hands them over: not a delivery whose first body frame is in and the rest still coming."""
    stream = delivery(1, payload_body(0, 0, 1_000_000, 300_000)) + delivery(2, payload_body(0, 1, 1_000_000, 300_000))
    second_starts = len(delivery(1, payload_body(0, 0, 1_000_000, 300_000)))
    parser = DeliveryParser([10])
    buf = bytearray(stream[: second_starts + 200_000])  # message 2's first body frame and part of its second
    used = parser.parse(buf, 0, len(buf), 2_000_000)
    assert (parser.received, parser.last_tag) == (1, 1)
    buf = buf[used:] + stream[second_starts + 200_000 :]
    parser.parse(buf, 0, len(buf), 2_000_000)
    assert (parser.received, parser.last_tag) == (2, 2)
    assert list(parser.latencies_us) == [1000, 1000]


def test_parser_keeps_the_longest_pause_between_completed_messages() -> None:
    """`longest_gap_ns`: the longest time between two parse calls that completed a message.
    A call that only brings part of a message, and the time before the first message, do
    not count; nor does a pause after the last one."""
    body = 300_000
    messages = [delivery(tag, payload_body(0, tag - 1, 0, body)) for tag in range(1, 5)]
    parser = DeliveryParser([10])
    assert parser.parse(bytearray(), 0, 0, 5_000_000_000) == 0  # nothing yet: no arrival
    parser.parse(bytearray(messages[0]), 0, len(messages[0]), 10_000_000)
    assert parser.longest_gap_ns == 0  # one arrival: no pause yet
    half = bytearray(messages[1][: len(messages[1]) // 2])
    used = parser.parse(half, 0, len(half), 13_000_000)  # part of message 2: not an arrival
    rest = half[used:] + messages[1][len(messages[1]) // 2 :]
    parser.parse(rest, 0, len(rest), 14_000_000)
    assert parser.longest_gap_ns == 4_000_000
    both = bytearray(messages[2] + messages[3])
    parser.parse(both, 0, len(both), 15_000_000)  # two in one call: one arrival, 1 ms after
    assert (parser.received, parser.longest_gap_ns) == (4, 4_000_000)
    parser.parse(bytearray(), 0, 0, 900_000_000)  # a quiet socket after the last: no pause
    assert parser.longest_gap_ns == 4_000_000


def test_parser_counts_duplicates_reordering_redelivery_and_foreign_bodies() -> None:
    order = [(0, 0), (0, 2), (0, 1), (0, 2), (1, 0), (1, 1)]  # 1 reordered, 1 duplicate
    stream = b"".join(delivery(i + 1, payload_body(pub, seq, 0)) for i, (pub, seq) in enumerate(order))
    stream += delivery(7, b"not one of ours, long enough to parse", redelivered=True)
    stream += delivery(8, payload_body(1, 99, 0))  # beyond publisher 1's capacity
    parser = DeliveryParser([10, 5])
    feed(parser, stream, [], now_ns=0)
    assert parser.received == 8
    assert parser.duplicates == 1
    assert parser.reordered == 1
    assert parser.redelivered == 1
    assert parser.foreign == 2
    assert parser.last_tag == 8


# --------------------------------------------------------------------------- accounting


def marks(seqs: list[int], size: int) -> bytes:
    out = bytearray(size)
    for s in seqs:
        out[s] = 1
    return bytes(out)


def test_merge_group_competing_consumers() -> None:
    a = {"seen": [marks([0, 2, 4], 8)], "received": 3, "duplicates": 0, "reordered": 0}
    b = {"seen": [marks([1, 3], 8)], "received": 2, "duplicates": 0, "reordered": 1}
    merged = merge_group([a, b], {0: 6})
    assert merged["expected"] == 6
    assert merged["distinct"] == 5
    assert merged["lost"] == 1
    assert merged["duplicates"] == 0
    assert merged["reordered"] == 1

    c = {"seen": [marks([4, 5], 8)], "received": 2, "duplicates": 1}
    merged = merge_group([a, b, c], {0: 6})
    assert (merged["lost"], merged["duplicates"]) == (0, 2)  # seq 4 twice + c's own duplicate


def test_merge_group_ignores_publishers_not_routed_here() -> None:
    a = {"seen": [b"", marks([0, 1, 2], 3)], "received": 3}
    assert merge_group([a], {1: 3})["lost"] == 0
    assert merge_group([a], {1: 4})["lost"] == 1


def test_percentiles_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([], 0.5) is None
    summary = latency_summary([array("q", [1000] * 98 + [5000, 9000]).tobytes()])
    assert summary["count"] == 100
    assert (summary["p50_ms"], summary["p99_ms"], summary["max_ms"]) == (1.0, 5.0, 9.0)


# --------------------------------------------------------------------------- sampler


def test_sampler_summary_from_synthetic_samples() -> None:
    sampler = Sampler(dict, interval=0.5)
    series = Series("worker0", 42)
    for i in range(5):
        series.samples.append(Sample(10.0 + i * 0.5, 1.0 + i * 0.25, (100 + i) * 2**20, 10 * i, i, 0.5 + i * 0.1))
    sampler.series[42] = series
    sampler.host = [(10.0, 0.0), (12.0, 3.0)]
    summary = sampler.summary(10.0, 12.0)
    worker = summary["processes"]["worker0"]
    assert worker["cpu_s"] == 1.0
    assert worker["sys_s"] == 0.4
    assert summary["sys_s"] == 0.4
    assert worker["cpu_percent_mean"] == 50.0
    assert worker["rss_max_mb"] == 104.0
    assert worker["ctx_voluntary"] == 40
    assert summary["cores_used"] == 0.5
    assert summary["host_busy_cores"] == 1.5


# --------------------------------------------------------------------------- tables


def flow_result(rate: float, p99: float, lost: int = 0, bound: bool = False) -> dict:
    return {
        "scenario": "S1", "delivered_per_s": rate, "delivered_per_broker_cpu_s": rate / 2,
        "broker_cpu": {"cores_used": 1.5}, "latency": {"p50_ms": p99 / 2, "p99_ms": p99},
        "integrity": {"lost": lost, "duplicates": 0, "reordered": 0, "foreign": 0}, "errors": [],
        "generator_max_cpu_fraction": 0.9 if bound else 0.1, "generator_bound": bound,
    }  # fmt: skip


def test_comparison_table_ratios_and_flags() -> None:
    table = comparison_table([("S1", flow_result(30000, 2.0), flow_result(20000, 1.0, lost=3, bound=True))])
    lines = table.splitlines()
    assert len(lines) == 3
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    row = lines[2]
    assert "| 1.50 |" in row  # msg/s ratio
    assert "| 2.00 |" in row  # p99 ratio
    assert "0/0/0; 3/0/0 !" in row
    assert "**yes** (90%)" in row


def test_cpu_split_table_gives_user_and_kernel_microseconds_a_message() -> None:
    shoal = {
        "delivered": 10_000,
        "broker_cpu": {"cpu_s": 2.5, "sys_s": 1.0, "processes": {
            "supervisor": {"cpu_s": 0.5, "sys_s": 0.1},
            "worker0": {"cpu_s": 1.2, "sys_s": 0.5},
            "worker1": {"cpu_s": 0.8, "sys_s": 0.4},
            "management": {"cpu_s": 0.001, "sys_s": 0.0},  # too little to list
        }},
        "connections_on_workers": {"publisher@w0": 1, "consumer@w1": 8},
    }  # fmt: skip
    rabbit = {"delivered": 10_000, "broker_cpu": {"cpu_s": 2.0, "sys_s": 1.5, "processes": {}}}
    table = cpu_split_table([("S6", shoal, rabbit), ("S1", shoal, None)])
    lines = table.splitlines()
    assert lines[2] == ("| S6 | 150 + 100 | 50 + 150 | supervisor 40 + 10; worker0 (pub) 70 + 50; "
                        "worker1 (con 8) 40 + 40 |")
    assert lines[3].startswith("| S1 | 150 + 100 | – |")


def test_idle_cost_table_takes_medians_of_cpu_kernel_and_switches() -> None:
    def result(label: str, us: float, sys_us: float, cs: float, involuntary: float) -> dict[str, Any]:
        process = "supervisor" if label == "shoal" else "beam.smp"
        per = {process: (us, cs, sys_us, involuntary)}
        return {"label": label, "per_message": per, "us_per_msg": us, "cs_per_msg": cs}

    results = [result("shoal", 100, 10, 1.0, 0.2), result("shoal", 140, 30, 2.0, 0.6),
               result("rabbitmq", 40, 5, 0, 0), result("rabbitmq", 60, 5, 0, 0)]
    lines = per_process_table(results, ["shoal", "rabbitmq"]).splitlines()
    assert lines[1] == "| broker | supervisor | beam.smp | broker | / RabbitMQ |"
    # the median of two rounds is their mean (not the upper one): 120 µs against 50
    assert lines[3] == "| shoal | 120 (20) / 1.50 (0.40) |  | 120 / 1.50 | 2.40 |"
    assert lines[4] == "| rabbitmq |  | 50 (5) / 0.00 (0.00) | 50 |  |"


def test_idle_cost_stage_table_puts_each_stage_beside_the_clients_figures() -> None:
    latency = {"shoal": {"publish_to_enqueue": {"p50": 86.2, "p99": 8652.6},
                         "enqueue_to_deliver": {"p50": 140.1, "p99": 4890.2},
                         "publish_to_deliver": {"p50": 252.9, "p99": 13416.7},
                         "deliver_to_ack": {"p50": 109.2, "p99": 2201.0}},
               "shoal@base": {"publish_to_enqueue": {"p50": 90.0, "p99": 900.0}}}
    lines = stage_table(latency, {"shoal": (0.465, 14.9)}).splitlines()
    assert lines[0].startswith("| µs, p50 / p99 | publish parsed -> enqueued | enqueued -> delivered |")
    assert lines[2] == "| shoal | 86 / 8653 | 140 / 4890 | 253 / 13417 | 109 / 2201 | 465 / 14900 |"
    # a stage the report could not measure (or a broker without clients' figures) stays empty
    assert lines[3] == "| shoal@base | 90 / 900 |  |  |  |  |"


def test_idle_cost_traces_each_shoal_into_a_directory_of_its_own(tmp_path: Path) -> None:
    traces: dict[str, Path] = {}
    assert _trace_args(None, "shoal", traces) == [] and traces == {}
    assert _trace_args(tmp_path, "shoal@base", traces) == ["--trace", str(tmp_path / "shoal-base")]
    assert traces == {"shoal@base": tmp_path / "shoal-base"}
    (tmp_path / "shoal-base" / "old.arrows").write_bytes(b"")
    with pytest.raises(SystemExit, match="not empty"):  # another run's rows would be read too
        _trace_args(tmp_path, "shoal@base", {})


def test_rabbitmq_is_wanted_only_when_asked_and_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The perf tools' one test for a side-by-side run: skipped on request silently; not
    installed, skipped with the reason on stderr; installed (a script and epmd), wanted."""
    missing = tmp_path / "no-rabbitmq-server"
    monkeypatch.setenv("PERF_RABBITMQ_SERVER", str(missing))
    assert rabbitmq_wanted(skip=True) is False
    assert capsys.readouterr().err == ""
    assert rabbitmq_wanted() is False
    why = f"{brokers.RABBITMQ_SCRIPT} not found (apt-get install rabbitmq-server)"
    assert capsys.readouterr().err == f"RabbitMQ skipped: {why}\n"
    script = tmp_path / "rabbitmq-server"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PERF_RABBITMQ_SERVER", str(script))
    monkeypatch.setattr(brokers, "_epmd_binary", lambda: "/usr/bin/epmd")
    assert rabbitmq_wanted() is True
    monkeypatch.setattr(brokers, "_epmd_binary", lambda: None)
    assert rabbitmq_wanted() is False
    assert "epmd not found" in capsys.readouterr().err


def test_a_supervisors_other_children_are_named_by_their_module() -> None:
    python = "/x/.venv/bin/python"
    assert child_role([python, "-m", "management.process", "{}"], "python", 7) == "management"
    assert child_role([python, "-m", "links.process", "{}"], "python", 8) == "links"
    # anything else keeps its process name and PID
    assert child_role([python, "-m", "workers.main", "{}"], "python", 9) == "python:9"
    assert child_role([python, "-m"], "python", 10) == "python:10"
    assert child_role([], "sh", 11) == "sh:11"


def test_comparison_table_without_rabbitmq() -> None:
    row = comparison_table([("S2", flow_result(1000, 1.0), None)]).splitlines()[2]
    assert "| – |" in row


def test_memory_and_scaling_tables() -> None:
    shoal = {"queued": {"queued": 1000, "rss_mb": 100.0, "pss_mb": 80.0}, "idle": {"opened": 10}}
    rabbit = {"queued": {"queued": 1000, "rss_mb": 200.0, "pss_mb": 160.0}, "idle": {"opened": 10}}
    table = memory_table(shoal, rabbit)
    assert "| 0.50 |" in table
    scaling = scaling_table({1: {"S1": flow_result(100, 1)}, 2: {"S1": flow_result(180, 1)}})
    lines = scaling.splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| 1.80 |" in lines[2]


def scaled(rate: float, host: float, gen: float = 0.1, **processes: float) -> dict:
    result = flow_result(rate, 1)
    result["broker_cpu"] = {"cores_used": sum(processes.values()) / 100, "host_busy_cores": host,
                            "processes": {k: {"cpu_percent_mean": v} for k, v in processes.items()}}
    result["generator_max_cpu_fraction"] = gen
    return result


def test_scaling_table_names_the_busiest_process_and_what_saturates_first() -> None:
    """--workers-scaling: each worker count's busiest broker process, and the fewest workers at
    which a process (or a client, or the host) ran out of CPU."""
    results = {
        1: {"S1": scaled(100, 1.5, supervisor=60.0, worker0=85.0)},
        2: {"S1": scaled(150, 2.2, supervisor=93.0, worker0=50.0, worker1=48.0)},
        4: {"S1": scaled(150, 2.4, gen=0.95, supervisor=97.0, worker0=30.0, worker1=31.0)},
    }
    lines = scaling_table(results, cpus=16).splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| worker0 85% | supervisor 93% | supervisor 97% | w=2: supervisor 93% |" in lines[2]
    # A client past the mark at the same count comes after the busier process; none at all:
    # the busiest process at the most workers.
    assert saturates_first({4: results[4]["S1"]}, 16) == "w=4: supervisor 97%, a client process 95%"
    assert saturates_first({1: results[1]["S1"]}, 16) == "none (w=1: worker0 85%)"
    # On a small host the CPUs run out before any one process does.
    assert saturates_first({1: results[1]["S1"], 2: results[2]["S1"]}, 2) == (
        "w=2: the host's 2 CPUs (2.20 busy), supervisor 93%")
    assert saturates_first({1: None}, 2) == "–"


def test_scaling_worker_counts_follow_the_host() -> None:
    assert default_scaling_workers(16) == (1, 2, 4, 8)
    assert default_scaling_workers(2) == (1, 2, 4)
    assert parse_args(["--workers-scaling", "--scaling-workers", "8,1,2"]).scaling_workers == (1, 2, 8)
    with pytest.raises(SystemExit):
        parse_args(["--scaling-workers", "0,2"])


def test_rounds_table_gives_each_rounds_ratio_and_their_median() -> None:
    """``--rounds``: Shoal / RabbitMQ per round, the median of them, and a round where one side
    has no figure (a failed run) left out rather than counted."""
    pairs = [(flow_result(90, 1), flow_result(100, 1)), (flow_result(120, 1), flow_result(100, 1)),
             (flow_result(100, 1), flow_result(80, 1)), (None, flow_result(100, 1))]
    ratios = round_ratios(pairs)
    assert ratios["delivered_per_s"] == pytest.approx([0.9, 1.2, 1.25])
    assert ratios["delivered_per_broker_cpu_s"] == pytest.approx([0.9, 1.2, 1.25])
    lines = rounds_table([("S3", ratios)]).splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert lines[2] == "| S3 | 0.90, 1.20, 1.25 | **1.20** | 0.90, 1.20, 1.25 | **1.20** |"


def test_small_formatters() -> None:
    assert ratio(3, 2) == "1.50"
    assert ratio(1, 0) == "–" and ratio(None, 1) == "–"
    assert integrity({"failed": True}) == "failed"
    assert integrity(None) == "–"


def test_payload_layout_is_what_the_parser_expects() -> None:
    assert PAYLOAD.size == 20
    assert struct.unpack_from("<H", PAYLOAD.pack(MAGIC, 0, 0, 0))[0] == 0x5348


def test_at_rest_sums_a_process_threads_schedstat(tmp_path: Path) -> None:
    for tid, text in (("10", "2000000 5 7\n"), ("11", "500 1 3\n")):
        (tmp_path / "10" / "task" / tid).mkdir(parents=True)
        (tmp_path / "10" / "task" / tid / "schedstat").write_text(text)
    assert schedstat(10, str(tmp_path)) == (2_000_500, 10)
    assert schedstat(99, str(tmp_path)) == (0, 0)  # gone: nothing to count


def test_at_rest_window_gives_cores_and_wakeups_a_second() -> None:
    reads = iter([(0, 0), (1_000_000, 100)])  # before and after the window

    class Proc:
        pid = 1

    per = window({"supervisor": Proc()}, 0.01, lambda pid: next(reads))
    cores, wakes = per["supervisor"]
    assert 0 < cores <= 1_000_000 / 0.01 / 1e9  # 1 ms of CPU over at least 10 ms
    assert 0 < wakes <= 100 / 0.01
    text = line("shoal", per)
    assert text.startswith("shoal") and "cores at rest" in text and "supervisor" in text
