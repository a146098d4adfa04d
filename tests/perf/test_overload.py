"""The pure parts of the overload scenarios and the C generator's driver (no brokers, no timing).

What is checked: `--scenarios` parsing (keys, groups, case, order, unknown names) and the new
flags; the choice between the C generator and the Python fallback, with builders that succeed
or fail as told (and `build` against fake compilers: what it names a missing rabbitmq-c, that
it does not rebuild an unchanged source); shoalgen's command lines and its JSON lines; the
latency histogram (bucket bounds, percentiles within a bucket, merging); the figures of a run
from synthetic generator results; the tables. Only the last test runs the real C generator, and
only when it can be built here (it is skipped otherwise).
"""

from __future__ import annotations

import math
import os
import random
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from perf import cgen, report_table
from perf.__main__ import parse_args, resolve_keys
from perf.cgen import (
    Build,
    bucket_of,
    bucket_range,
    choose_generator,
    consumer_argv,
    histogram_of,
    histogram_summary,
    merge_histograms,
    parse_event,
    publisher_argv,
)
from perf.overload import (
    OVERLOAD_SCENARIOS,
    _normalise_python,
    count_cap,
    publisher_processes,
    summarise,
)
from perf.scenario_table import SCENARIOS

# --------------------------------------------------------------------------- arguments


def test_default_selection_is_the_classic_set() -> None:
    assert resolve_keys("") == list(SCENARIOS)
    assert resolve_keys("  ") == list(SCENARIOS)


def test_keys_are_case_insensitive_in_the_order_given_and_once_each() -> None:
    assert resolve_keys("s4u,S1u,s1U, S1 ,") == ["S4u", "S1u", "S1"]


def test_groups_expand() -> None:
    assert resolve_keys("overload") == list(OVERLOAD_SCENARIOS)
    assert resolve_keys("classic") == list(SCENARIOS)
    assert resolve_keys("all") == [*SCENARIOS, *OVERLOAD_SCENARIOS]
    assert resolve_keys("S3u,overload") == ["S3u", *[k for k in OVERLOAD_SCENARIOS if k != "S3u"]]


def test_unknown_scenarios_are_named() -> None:
    with pytest.raises(SystemExit, match="S99u"):
        resolve_keys("S1u,S99u")


def test_overload_flags_and_defaults() -> None:
    args = parse_args(["--scenarios", "S3u,S4u", "--no-rabbitmq"])
    assert (args.seconds, args.generator, args.python_publishers) == (10.0, "auto", 2)
    assert (args.steady_rate, args.ping_pong_seconds, args.ping_pong_rate) == (1000.0, 5.0, 1000.0)
    args = parse_args(
        ["--generator", "python", "--python-publishers", "3", "--seconds", "4", "--ping-pong-seconds", "2"]
    )
    assert (args.generator, args.python_publishers, args.seconds, args.ping_pong_seconds) == ("python", 3, 4.0, 2.0)


@pytest.mark.parametrize("argv", [["--generator", "java"], ["--python-publishers", "0"]])
def test_bad_overload_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


# --------------------------------------------------------------------------- the generator choice


class Builder:
    def __init__(self, outcome: Build):
        self.outcome = outcome
        self.calls = 0

    def __call__(self) -> Build:
        self.calls += 1
        return self.outcome


def test_python_when_asked_never_builds() -> None:
    builder = Builder(Build(Path("/x/shoalgen-1")))
    choice = choose_generator("python", builder, 3)
    assert (choice.kind, choice.binary, builder.calls) == ("python", None, 0)
    assert "3 publisher processes" in choice.note


def test_auto_takes_the_c_generator_when_it_builds() -> None:
    choice = choose_generator("auto", Builder(Build(Path("/x/shoalgen-1"))), 2)
    assert (choice.kind, choice.binary) == ("c", Path("/x/shoalgen-1"))


def test_auto_falls_back_to_python_and_says_why() -> None:
    choice = choose_generator("auto", Builder(Build(None, "no C compiler (gcc) on PATH")), 2)
    assert (choice.kind, choice.binary) == ("python", None)
    assert "no C compiler" in choice.note and "falling back to 2 Python publisher processes" in choice.note


def test_c_insists() -> None:
    with pytest.raises(RuntimeError, match="librabbitmq-dev"):
        choose_generator("c", Builder(Build(None, "rabbitmq-c is not installed (apt-get install librabbitmq-dev)")), 2)
    with pytest.raises(ValueError):
        choose_generator("go", Builder(Build(None, "x")), 2)


def test_build_failure_reasons() -> None:
    missing = "shoalgen.c:38:10: fatal error: amqp.h: No such file or directory\ncompilation terminated.\n"
    assert "librabbitmq-dev" in cgen.build_failure_reason(missing)
    assert "librabbitmq-dev" in cgen.build_failure_reason("/usr/bin/ld: cannot find -lrabbitmq: No such file\n")
    other = "shoalgen.c:5:1: error: expected ';' before '}' token\n"
    assert cgen.build_failure_reason(other) == "build failed: shoalgen.c:5:1: error: expected ';' before '}' token"


def fake_compiler(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_build_without_a_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cgen, "compiler", lambda: None)
    outcome = cgen.build(build_dir=tmp_path)
    assert outcome.binary is None and "no C compiler" in (outcome.reason or "")


def test_build_with_rabbitmq_c_missing(tmp_path: Path) -> None:
    cc = fake_compiler(tmp_path / "cc", 'echo "x.c:1:10: fatal error: amqp.h: No such file or directory" >&2\nexit 1\n')
    outcome = cgen.build(build_dir=tmp_path / "out", cc=cc)
    assert outcome.binary is None and "librabbitmq-dev" in (outcome.reason or "")
    assert not list((tmp_path / "out").iterdir())  # no partial binary left


def test_build_names_the_binary_by_source_and_reuses_it(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    # The fake compiler writes its -o argument (the 3 flags come first, then -o PATH) and logs the call.
    cc = fake_compiler(tmp_path / "cc", f'echo x >> {log}\nprintf "#!/bin/sh\\n" > "$5"\nchmod +x "$5"\n')
    source = tmp_path / "gen.c"
    source.write_text("int main(void) { return 0; }\n")
    first = cgen.build(source=source, build_dir=tmp_path / "out", cc=cc)
    again = cgen.build(source=source, build_dir=tmp_path / "out", cc=cc)
    assert first.binary is not None and first.binary == again.binary
    assert first.binary.name.startswith("shoalgen-")
    assert log.read_text().count("x") == 1
    source.write_text("int main(void) { return 1; }\n")
    changed = cgen.build(source=source, build_dir=tmp_path / "out", cc=cc)
    assert changed.binary is not None and changed.binary != first.binary
    assert [p.name for p in (tmp_path / "out").iterdir()] == [changed.binary.name]  # the stale one is gone


# --------------------------------------------------------------------------- shoalgen's interface


def test_publisher_argv() -> None:
    argv = publisher_argv(Path("/b/g"), 5672, exchange="x", routing_key="", body_size=128, pub_id=0, count=10,
                          seconds=2.5)  # fmt: skip
    assert argv[:2] == ["/b/g", "publish"]
    pairs = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert pairs == {"--port": "5672", "--exchange": "x", "--routing-key": "", "--body-size": "128", "--id": "0",
                     "--count": "10", "--seconds": "2.5", "--grace": "20"}  # fmt: skip
    paced = publisher_argv(Path("/b/g"), 1, exchange="", routing_key="q", body_size=128, pub_id=1, count=5,
                           seconds=1, rate=1000.0)  # fmt: skip
    assert paced[-2:] == ["--rate", "1000"]


def test_consumer_argv() -> None:
    argv = consumer_argv(Path("/b/g"), 5672, queue="q", name="c0.1", prefetch=10, ack_every=1, seconds=10,
                         publishers=2, capacity=99)  # fmt: skip
    assert argv[:2] == ["/b/g", "consume"]
    pairs = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert pairs["--queue"] == "q" and pairs["--ack-every"] == "1" and pairs["--prefetch"] == "10"
    assert pairs["--publishers"] == "2" and pairs["--capacity"] == "99"
    assert pairs["--global"] == "0"  # basic.qos global=false unless asked
    assert "--host" not in pairs  # shoalgen only ever connects to 127.0.0.1
    several = consumer_argv(Path("/b/g"), 5672, queue="q1,q2", name="c", prefetch=40, ack_every=1, seconds=10,
                            publishers=4, capacity=9, global_qos=True)  # fmt: skip
    pairs = dict(zip(several[2::2], several[3::2], strict=True))
    assert pairs["--queue"] == "q1,q2" and pairs["--global"] == "1"


def test_parse_event() -> None:
    assert parse_event(b'{"event":"ready","role":"publisher","pid":7}\n') == {"event": "ready", "role": "publisher",
                                                                             "pid": 7}  # fmt: skip
    result = parse_event('{"event":"result","received":3,"hist":[[5,3]],"error":null}')
    assert result is not None and result["hist"] == [[5, 3]]
    for junk in ("", "hello", "{not json", '{"no_event": 1}', "[1, 2]", '{"event": 3}', b"\xff\xfe"):
        assert parse_event(junk) is None


# --------------------------------------------------------------------------- latency histograms


def test_buckets_cover_every_value_once_and_are_narrow() -> None:
    rng = random.Random(7)
    values = list(range(0, 5000)) + [rng.randrange(1, 1 << 40) for _ in range(5000)] + [(1 << 63) - 1]
    for value in values:
        low, high = bucket_range(bucket_of(value))
        assert low <= value < high
        assert high - low == 1 or (high - low) / low <= 1 / 32
    indices = [bucket_of(v) for v in sorted(values)]
    assert indices == sorted(indices)
    assert bucket_of(-5) == 0
    assert bucket_of((1 << 64) - 1) < 2048  # shoalgen's HIST_SIZE


def test_histogram_percentiles_within_a_bucket() -> None:
    rng = random.Random(11)
    latencies = sorted(int(rng.lognormvariate(7, 1.5)) for _ in range(20_000))
    summary = histogram_summary(histogram_of(latencies), max(latencies))
    assert summary["count"] == len(latencies)
    for label, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = latencies[math.ceil(fraction * len(latencies)) - 1]  # nearest rank
        low, high = bucket_range(bucket_of(exact))
        got = summary[f"{label}_ms"]
        assert isinstance(got, float)
        assert low / 1000 - 0.001 <= got <= high / 1000
    assert summary["max_ms"] == round(max(latencies) / 1000, 3)


def test_small_exact_latencies_and_empty() -> None:
    summary = histogram_summary({10: 98, 40: 2}, 40)
    assert (summary["p50_ms"], summary["p99_ms"], summary["max_ms"]) == (0.01, 0.04, 0.04)
    empty = histogram_summary({})
    assert empty == {"count": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}


def test_merge_histograms_from_both_forms() -> None:
    assert merge_histograms([{3: 1, 70: 2}, [[3, 4], [100, 1]], []]) == {3: 5, 70: 2, 100: 1}


# --------------------------------------------------------------------------- figures of a run


def test_count_caps_and_publisher_processes() -> None:
    assert count_cap("c", 1000.0, 5) == 5001
    assert count_cap("python", 1000.0, 5) == 5001
    assert count_cap("c", 0.0, 10) > count_cap("python", 0.0, 10) > 0
    assert publisher_processes("c", 0.0, 3) == 1
    assert publisher_processes("python", 0.0, 3) == 3
    assert publisher_processes("python", 1000.0, 3) == 1
    assert publisher_processes("c", 0.0, 3, publishers=4) == 4  # one C process a publisher
    assert publisher_processes("python", 0.0, 3, publishers=4) == 12


def test_celery_shape_is_one_consumer_on_every_queue_sharing_its_prefetch() -> None:
    s9u = OVERLOAD_SCENARIOS["S9u"]
    assert (s9u.publishers, s9u.queues, s9u.consumers) == (4, 4, 1)
    assert s9u.one_channel and s9u.global_qos and not s9u.fanout and s9u.ack_every == 1
    assert OVERLOAD_SCENARIOS["S3u"].consumers == 8 and not OVERLOAD_SCENARIOS["S3u"].global_qos


def consumer(received: int, in_window: int | None = None, hist: Any = None, **extra: Any) -> dict[str, Any]:
    return {"role": "consumer", "name": "c", "received": received,
            "in_window": received if in_window is None else in_window, "window_s": 10.0, "cpu_s": 1.0,
            "wall_s": 10.0, "hist": hist or [], "max_us": 0, **extra}  # fmt: skip


def test_summarise_fanout_run() -> None:
    scenario = OVERLOAD_SCENARIOS["S4u"]
    results = [{"role": "publisher", "id": 0, "published": 100_000, "wall_s": 10.0, "cpu_s": 9.0, "tcp_wait_s": 4.0}]
    results += [consumer(60_000, hist=[[100, 10]], max_us=110, duplicates=1) for _ in range(8)]
    broker = {"cpu_s": 15.0, "cores_used": 1.5, "host_busy_cores": 1.95, "rss_max_mb": 300.0}
    out = summarise(results, scenario, broker, 10.0, backlog_end=300_000)
    assert out["published_per_s"] == 10_000.0
    assert out["delivered_per_s"] == 48_000.0  # each of the 8 copies counts
    assert out["expected_deliveries"] == 800_000
    assert out["published_minus_delivered"] == 320_000
    assert out["unaccounted"] == 20_000  # written to the socket, neither delivered nor queued
    assert out["duplicates"] == 8
    assert out["broker_cores"] == 1.5 and out["broker_rss_max_mb"] == 300.0
    assert out["generator_bound"] is True and out["generator_max_cpu_fraction"] == 0.9  # the publisher at 90 %
    assert out["latency"]["count"] == 80
    assert out["other_load_cores"] == 0.0  # 1.95 - 1.5 - 1.7 generator cores, floored


def test_summarise_counts_only_the_window_for_the_rate() -> None:
    results = [
        {"role": "publisher", "id": 0, "published": 5_000, "wall_s": 5.0, "cpu_s": 0.1},
        consumer(5_000, in_window=4_000),
    ]
    out = summarise(results, OVERLOAD_SCENARIOS["S1u"], {"cpu_s": 1.0, "cores_used": 0.1}, 10.0, backlog_end=None)
    assert out["delivered_per_s"] == 400.0 and out["delivered"] == 5_000
    assert out["unaccounted"] is None and out["generator_bound"] is False


def test_summarise_counts_each_publishers_deliveries_and_the_table_gives_their_shares() -> None:
    results = [consumer(600, by_publisher=[300, 100, 200]), consumer(400, by_publisher=[100, 300])]
    out = summarise(results, OVERLOAD_SCENARIOS["S9u"], {"cpu_s": 1.0, "cores_used": 0.1}, 10.0, backlog_end=0)
    assert out["delivered_by_publisher"] == [400, 400, 200]
    assert report_table.shares(out["delivered_by_publisher"]) == "40.0 / 40.0 / 20.0"
    assert report_table.shares([5]) == report_table.shares([0, 0]) == report_table.shares(None) == ""
    shoal = unbounded("shoal(w=2)", 1.0, 2.0, delivered_by_publisher=[1, 1])
    rabbit = unbounded("rabbitmq", 1.0, 1.0, delivered_by_publisher=[3, 1])
    table = report_table.overload_table("S9u", shoal, rabbit)
    assert table.endswith("Deliveries by publisher (its own queue), per cent: shoal(w=2) 50.0 / 50.0; "
                          "rabbitmq 75.0 / 25.0")
    assert "Deliveries by publisher" not in report_table.overload_table("S1u", unbounded("shoal(w=2)", 1.0, 2.0), None)


def test_the_python_fallbacks_processes_count_as_the_publisher_they_stand_in_for() -> None:
    results = [consumer(36, by_publisher=[1, 2, 3, 4, 5, 6, 7, 8])]  # 2 processes a publisher
    out = summarise(results, OVERLOAD_SCENARIOS["S9u"], {"cpu_s": 1.0, "cores_used": 0.1}, 10.0, backlog_end=0)
    assert out["delivered_by_publisher"] == [3, 7, 11, 15]
    one = summarise([consumer(7, by_publisher=[3, 4])], OVERLOAD_SCENARIOS["S1u"], {"cpu_s": 1.0}, 10.0, 0)
    assert one["delivered_by_publisher"] == [7]  # one publisher: no shares line


def test_normalise_python_consumer() -> None:
    from array import array

    latencies = array("q", [5, 5, 70, 900]).tobytes()
    raw = {"role": "consumer", "name": "c0.0", "received": 4, "seen": [b"\x01\x01\x00", b"\x00\x01"],
           "latencies_us": latencies}  # fmt: skip
    out = _normalise_python(raw, window_count=3)
    assert "seen" not in out and "latencies_us" not in out
    assert out["by_publisher"] == [2, 1]  # the marks of each publisher's messages seen
    assert out["in_window"] == 3 and out["max_us"] == 900
    assert merge_histograms([out["hist"]]) == histogram_of([5, 5, 70, 900])
    publisher = _normalise_python({"role": "publisher", "id": 1, "published": 9}, None)
    assert publisher == {"role": "publisher", "id": 1, "published": 9}


# --------------------------------------------------------------------------- tables


def unbounded(broker: str, published: float, delivered: float, **extra: Any) -> dict[str, Any]:
    return {"scenario": "S3u", "title": "t", "broker": broker, "kind": "unbounded", "generator": "c",
            "publisher_processes": 1, "published_per_s": published, "delivered_per_s": delivered,
            "backlog_end": 1000, "broker_cores": 1.0, "broker_rss_max_mb": 100.0, "unaccounted": 0,
            "generator_max_cpu_fraction": 0.1, "generator_bound": False, "other_load_cores": 0.0,
            "errors": [], **extra}  # fmt: skip


def test_overload_table_with_ratio_and_ping_pong() -> None:
    after = {"scenario": "S3u+pp", "title": "pp", "broker": "x", "delivered_per_s": 1000.0,
             "latency": {"p50_ms": 2.0, "p99_ms": 8.0}, "broker_cores": 0.5, "since_overload_s": 3.2,
             "errors": []}  # fmt: skip
    shoal = unbounded("shoal(w=2)", 60_000, 30_000, after=after)
    rabbit = unbounded("rabbitmq", 40_000, 40_000, after={**after, "latency": {"p50_ms": 1.0, "p99_ms": 2.0}})
    text = report_table.overload_table("S3u", shoal, rabbit)
    assert "| shoal(w=2) | 60,000 | 30,000 | 1,000 | 1.00 | 100 | 0 | C (10%) | 0.00 |" in text
    assert "| Shoal / RabbitMQ | 1.50 | **0.75** |" in text
    assert "| shoal(w=2) | 1,000 | 2.00 | 8.00 | 0.50 | 3.2 |" in text
    assert "| Shoal / RabbitMQ | 1.00 | 2.00 | 4.00 | 1.00 | |" in text


def test_overload_table_shoal_only_and_flags() -> None:
    shoal = unbounded("shoal(w=2)", 1.0, 2.0, errors=["boom"], generator="python", publisher_processes=2,
                      generator_bound=True, generator_max_cpu_fraction=0.95)  # fmt: skip
    text = report_table.overload_table("S1u", shoal, None)
    assert "Shoal / RabbitMQ" not in text
    assert "| shoal(w=2) ! |" in text and "Python ×2, **bound** (95%)" in text


def test_steady_table() -> None:
    row = {"title": "steady", "kind": "steady", "delivered_per_s": 1000.0, "broker_cores": 0.3, "idle_cores": 0.01,
           "latency": {"p50_ms": 0.5, "p99_ms": 2.0}, "generator": "c", "errors": []}  # fmt: skip
    rabbit = {**row, "broker": "rabbitmq", "broker_cores": 0.15}
    text = report_table.overload_table("S7u", {**row, "broker": "shoal(w=2)"}, rabbit)
    assert "| shoal(w=2) | 1,000 | 0.30 | 0.01 | 0.50 / 2.00 |" in text
    assert "| Shoal / RabbitMQ | 1.00 | 2.00 | 1.00 | 1.00 (p99) |" in text


def test_errors_section_includes_the_follow_up_run() -> None:
    result = {"broker": "b", "scenario": "S3u", "errors": ["a"], "after": {"scenario": "S3u+pp", "errors": ["b"]}}
    assert report_table.errors_section([result]) == "- b S3u: a\n- b S3u+pp: b"


# --------------------------------------------------------------------------- the real generator, when it builds


def test_c_buckets_match_python_when_the_generator_builds() -> None:
    outcome = cgen.build()
    if outcome.binary is None:
        pytest.skip(f"C generator not available: {outcome.reason}")
    values = [0, 1, 63, 64, 65, 127, 128, 1000, 123_456, 10**9, 2**40 + 17]
    done = subprocess.run([str(outcome.binary), "buckets", *map(str, values)], capture_output=True, text=True,
                          timeout=30, check=True, env={**os.environ})  # fmt: skip
    assert [int(x) for x in done.stdout.split()] == [bucket_of(v) for v in values]


def test_slow_consumer_shape_paces_its_publishers_and_leaves_a_queue_without_consumer() -> None:
    """S10u: queue 0's consumer is slow, queue 1's acks each at once, queue 2 has none; the
    publishers are paced, so each one's rate says whether it was held back."""
    s10u = OVERLOAD_SCENARIOS["S10u"]
    assert (s10u.publishers, s10u.queues, s10u.idle_queues, s10u.consumers) == (3, 3, 1, 2)
    assert s10u.publisher_rate > 0 and s10u.slow_ack_rate > 0 and s10u.ack_every == 1
    argv = consumer_argv(Path("/b/g"), 5672, queue="q", name="c0.0", prefetch=10, ack_every=1, seconds=10,
                         publishers=3, capacity=9, ack_rate=50.0)  # fmt: skip
    assert dict(zip(argv[2::2], argv[3::2], strict=True))["--ack-rate"] == "50"
    assert "--ack-rate" not in consumer_argv(Path("/b/g"), 5672, queue="q", name="c", prefetch=10, ack_every=1,
                                             seconds=10, publishers=1, capacity=9)  # fmt: skip


def test_summarise_gives_each_publishers_and_consumers_rate_for_paced_publishers() -> None:
    results = [
        {**consumer(500), "name": "c0.0"}, {**consumer(29_000), "name": "c1.0"},
        *({"role": "publisher", "id": p, "published": n, "wall_s": 10.0, "cpu_s": 0.1}
          for p, n in enumerate([30_000, 29_500, 2_000])),
    ]  # fmt: skip
    out = summarise(results, OVERLOAD_SCENARIOS["S10u"], {"cpu_s": 1.0, "cores_used": 0.1}, 10.0, backlog_end=0)
    assert out["publisher_rates"] == [3_000.0, 2_950.0, 200.0]
    assert out["consumer_rates"] == {"c0.0": 50.0, "c1.0": 2_900.0}
    shoal = unbounded("shoal(w=2)", 1.0, 2.0, rate=3000.0, publisher_rates=out["publisher_rates"],
                      consumer_rates=out["consumer_rates"])
    table = report_table.overload_table("S10u", shoal, None)
    assert "Each client, msg/s: shoal(w=2) publishers 3,000 / 2,950 / 200; consumers c0.0 50, c1.0 2,900" in table
    assert "Each client" not in report_table.overload_table("S1u", unbounded("shoal(w=2)", 1.0, 2.0), None)
