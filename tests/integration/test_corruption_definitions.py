"""Damage to the definitions between two runs of `shoal serve --data-dir DIR`: definitions.db,
its WAL and the marker node.json, truncated or with bytes flipped in their head, middle or tail.
The broker either refuses in one line naming the damaged file (exit status 1, nothing in the
directory changed) or starts with every definition, user and message intact; it never takes an
initialised directory for a new one and never turns guest back on."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest

from broker.storage.definition_store import DefinitionStore
from broker.topology.definitions import QueueDef
from tests.integration.harness import (
    HOST,
    REPO_ROOT,
    Broker,
    finish,
    kill_whole_broker,
    serve_command,
    shm_segments,
    start_broker,
    wait_until,
)
from tests.integration.pika_helpers import queue_exists

PERSISTENT = pika.BasicProperties(delivery_mode=2)
MESSAGES = 200
ADMIN = ("admin", "S3cret")
LATE = "late"  # a queue whose declare a crash caught between its commit and its checkpoint


def first_run(tmp_path: Path) -> Path:
    """`--user admin:S3cret`, a durable exchange, queue and binding, MESSAGES persistent
    messages confirmed, then a SIGKILL of the whole broker. Returns the data directory."""
    data = tmp_path / "data"
    first = start_broker(tmp_path / "first", extra_args=["--data-dir", str(data),
                                                         "--user", ":".join(ADMIN)])
    try:
        channel = first.connect(credentials=pika.PlainCredentials(*ADMIN)).channel()
        channel.confirm_delivery()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("jobs", durable=True)
        channel.queue_bind("jobs", "orders", "job")
        for i in range(MESSAGES):
            channel.basic_publish("orders", "job", b"%05d" % i, PERSISTENT)
        kill_whole_broker(first)
        for segment in shm_segments(first.instance):  # what the next start would sweep
            segment.unlink()
    finally:
        finish(first)
    return data


def commit_without_checkpoint(data: Path) -> None:
    """What a crash right after a commit leaves: the batch in the WAL only (the files are copied
    while the connection is open, as a SIGKILL leaves them)."""
    store = DefinitionStore(data / "definitions.db", generation_file=data / "definitions.gen")
    store.checkpoints = False
    store.apply([QueueDef(LATE, False, {})])
    saved = data.parent / "saved"
    saved.mkdir()
    for name in ("definitions.db", "definitions.db-wal"):
        shutil.copy(data / name, saved / name)
    store.close()
    for name in ("definitions.db", "definitions.db-wal"):
        shutil.copy(saved / name, data / name)
    (data / "definitions.db-shm").unlink(missing_ok=True)
    assert (data / "definitions.db-wal").stat().st_size > 32


def damage(path: Path, how: str, rng: random.Random | None = None) -> None:
    raw = bytearray(path.read_bytes())
    assert raw, f"{path} is empty: nothing to damage"
    if how == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
        return
    width = min(16, len(raw))
    at = {"head": 0, "middle": (len(raw) - width) // 2, "tail": len(raw) - width}.get(how)
    if at is None:
        assert rng is not None
        at = rng.randrange(len(raw) - width + 1)
    raw[at:at + width] = bytes(b ^ 0xA5 for b in raw[at:at + width])
    path.write_bytes(bytes(raw))


def snapshot(data: Path) -> dict[str, bytes]:
    """Every file of the data directory (but the lock's PID and SQLite's -shm, derived)."""
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*"))
            if p.is_file() and p.name != "lock" and not p.name.endswith("-shm")}


def serve(data: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`shoal serve --data-dir DATA` with no --user, expected to refuse."""
    return subprocess.run(
        [*serve_command(), "serve", "--management-port", "0", "--host", HOST, "--port", "0", "--workers", "1",
         "--data-dir", str(data), "--control-socket", str(tmp_path / "refused.sock")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)


def start_or_refusal(data: Path, directory: Path) -> Broker | list[str]:
    """`shoal serve --data-dir DATA` with no --user: the running broker, or, when it exited
    before it was ready, the lines it wrote."""
    broker = Broker(directory, extra_args=["--data-dir", str(data)], wait_ready=False)
    wait_until(lambda: broker.popen.poll() is not None or broker.ready_file.exists(), 30,
               "the broker to start or refuse")
    if broker.popen.poll() is None:
        broker.await_ready()
        return broker
    assert broker.popen.returncode == 1, broker.log_tail()
    broker.stop()  # its exit was the point: what stop() says about it is expected
    return refusal_lines(broker.log_path.read_text())


def refusal_lines(output: str) -> list[str]:
    """What a refused start wrote, less the build's notice that it runs pure Python."""
    return [line for line in output.strip().splitlines()
            if not line.startswith("compiled modules are older than their sources")]


def login(broker: Broker, user: str, password: str) -> pika.BlockingConnection | None:
    try:
        return broker.connect(credentials=pika.PlainCredentials(user, password))
    except pika.exceptions.ProbableAuthenticationError:
        return None


def check_intact(broker: Broker, late: bool) -> None:
    """admin logs in, guest does not; the exchange, queue, binding and every message are there."""
    assert login(broker, "guest", "guest") is None, "guest was turned on"
    connection = login(broker, *ADMIN)
    assert connection is not None, "admin was refused"
    channel = connection.channel()
    assert channel.queue_declare("jobs", passive=True).method.message_count == MESSAGES
    channel.exchange_declare("orders", passive=True)
    channel.confirm_delivery()
    channel.basic_publish("orders", "job", b"routed", PERSISTENT)
    assert channel.queue_declare("jobs", passive=True).method.message_count == MESSAGES + 1
    log = broker.log_tail()
    assert "ADDED USER" not in log.upper().replace("USER 'ADMIN'", "")
    if not queue_exists(connection, LATE) and late:
        assert "1 change batch(es) behind" in log and " ERROR " in log, log


def restart_after(tmp_path: Path, target: str, how: str, rng: random.Random | None = None) -> None:
    data = first_run(tmp_path)
    late = target == "definitions.db-wal"
    if late:
        commit_without_checkpoint(data)
    damage(data / target, how, rng)
    before = snapshot(data)
    outcome = start_or_refusal(data, tmp_path / "second")
    if isinstance(outcome, list):
        assert len(outcome) == 1, outcome
        assert f"cannot start: {data}/" in outcome[0], outcome
        named = outcome[0].split("cannot start: ", 1)[1].split(":", 1)[0]
        assert named in (str(data / target), str(data / "definitions.db")), outcome
        assert snapshot(data) == before, "a refused start changed the data directory"
        return
    try:
        check_intact(outcome, late)
    finally:
        finish(outcome)


CASES = [(target, how) for target in ("definitions.db", "definitions.db-wal", "node.json")
         for how in ("truncate", "head", "middle", "tail")]


@pytest.mark.deadline(180)
@pytest.mark.parametrize(("target", "how"), CASES)
def test_damaged_definitions_refuse_in_one_line_or_keep_everything(
        tmp_path: Path, target: str, how: str) -> None:
    """A damaged definitions file either stops the start, naming it, with nothing changed, or
    costs nothing; guest never comes back."""
    restart_after(tmp_path, target, how)


SOAK = [pytest.param(target, seed, marks=pytest.mark.soak)
        for target in ("definitions.db", "definitions.db-wal", "node.json") for seed in range(15)]


@pytest.mark.deadline(180)
@pytest.mark.parametrize(("target", "seed"), SOAK)
def test_damage_anywhere_in_the_definitions_refuses_or_costs_nothing(
        tmp_path: Path, target: str, seed: int) -> None:
    """As above, sixteen bytes flipped at a random offset (`pytest -m soak`)."""
    restart_after(tmp_path, target, "random", random.Random(seed))


@pytest.mark.deadline(180)
def test_a_flipped_wal_after_a_sigkill_costs_nothing(tmp_path: Path) -> None:
    """The reported case: the definitions reach the main file at each commit, so the WAL a
    SIGKILL leaves holds nothing to lose; the restart without --user keeps admin, refuses guest
    and keeps every confirmed message."""
    data = first_run(tmp_path)
    wal = data / "definitions.db-wal"
    if wal.exists() and wal.stat().st_size:
        damage(wal, "middle")
    assert not wal.exists() or wal.stat().st_size == 0, "definitions left in the WAL"
    broker = start_broker(tmp_path / "second", extra_args=["--data-dir", str(data)])
    try:
        check_intact(broker, late=False)
    finally:
        finish(broker)


@pytest.mark.deadline(180)
def test_definitions_only_a_damaged_wal_held_are_refused_and_nothing_is_deleted(
        tmp_path: Path) -> None:
    """The reported case on a directory a Shoal that never checkpointed left (no marker, every
    definition in the WAL), 16 bytes flipped in the WAL's middle: the start refuses, naming
    it, and every file stays (the messages are not dropped)."""
    data = first_run(tmp_path)
    # Rebuild the definitions as that Shoal kept them: one transaction per statement, none
    # checkpointed, then copied as a SIGKILL leaves them.
    (data / "node.json").unlink()
    (data / "definitions.gen").unlink()
    old = data.parent / "old.db"
    live = sqlite3.connect(old, isolation_level=None)
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("ATTACH ? AS cur", (str(data / "definitions.db"),))
    for table in ("exchanges", "queues", "users", "bindings"):
        sql = live.execute("SELECT sql FROM cur.sqlite_master WHERE name=?", (table,)).fetchone()[0]
        live.execute(sql)
        for row in live.execute(f"SELECT * FROM cur.{table}").fetchall():
            live.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
    live.execute("DETACH cur")
    live.execute("PRAGMA user_version=1")
    shutil.copy(old, data / "definitions.db")
    shutil.copy(f"{old}-wal", data / "definitions.db-wal")
    live.close()
    (data / "definitions.db-shm").unlink(missing_ok=True)
    damage(data / "definitions.db-wal", "middle")
    before = snapshot(data)
    assert any(name.startswith("index/") for name in before)
    done = serve(data, tmp_path)
    lines = refusal_lines(done.stdout + done.stderr)
    assert done.returncode == 1 and len(lines) == 1, lines
    assert f"cannot start: {data / 'definitions.db-wal'}: damaged" in lines[0]
    assert snapshot(data) == before, "a refused start changed the data directory"


@pytest.mark.deadline(180)
def test_a_deleted_guest_stays_deleted(tmp_path: Path) -> None:
    """RabbitMQ creates its default user on first boot only: `shoal delete-user guest` holds
    across restarts, even when no user is left."""
    data = tmp_path / "data"
    first = start_broker(tmp_path / "first", extra_args=["--data-dir", str(data)])
    try:
        assert login(first, "guest", "guest") is not None
    finally:
        finish(first)
    deleted = subprocess.run([sys.executable, "-m", "cli.main", "delete-user", "guest",
                              "--data-dir", str(data)], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60, check=False)
    assert deleted.returncode == 0, deleted.stderr
    second = start_broker(tmp_path / "second", extra_args=["--data-dir", str(data)])
    try:
        assert login(second, "guest", "guest") is None
        assert "nobody can log in" in second.log_tail()
    finally:
        finish(second)
