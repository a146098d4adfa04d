"""`shoal serve --user NAME:PASSWORD` (and $SHOAL_USERS): who may log in. Each test has its own
broker."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import psutil
import pytest

from tests.integration.harness import REPO_ROOT, Broker, finish, start_broker


def _login(broker: Broker, user: str, password: str) -> pika.BlockingConnection:
    return broker.connect(credentials=pika.PlainCredentials(user, password))


@pytest.fixture
def two_users(tmp_path: Path) -> Iterator[Broker]:
    broker = start_broker(tmp_path / "broker", extra_args=["--user", "alice:s3cret:x", "--user", "bob:"])
    try:
        yield broker
    finally:
        finish(broker)


def test_configured_users_log_in_and_guest_is_gone(two_users: Broker) -> None:
    """The password is everything after the first ':' (here 's3cret:x'; bob's is empty); with
    --user given, guest/guest is refused with 403 ACCESS_REFUSED, as when RabbitMQ's
    default_user replaces guest."""
    channel = _login(two_users, "alice", "s3cret:x").channel()
    channel.queue_declare("", exclusive=True)
    assert _login(two_users, "bob", "").is_open
    for user, password in (("guest", "guest"), ("alice", "s3cret"), ("carol", "")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
            _login(two_users, user, password)
        assert "(403) 'ACCESS_REFUSED" in str(caught.value)


def test_passwords_are_not_on_any_command_line(two_users: Broker) -> None:
    """The workers get their users through a pipe, not argv (which `ps` shows)."""
    for process in two_users.worker_processes():
        assert "s3cret" not in " ".join(process.cmdline())


def test_passwords_on_the_command_line_get_a_warning(two_users: Broker) -> None:
    assert "warning: passwords given with --user can be read by every user" in two_users.log_tail()


def test_users_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_USERS", "svc:pw1 other:pw2")
    broker = start_broker(tmp_path / "broker")
    try:
        assert _login(broker, "svc", "pw1").is_open
        assert _login(broker, "other", "pw2").is_open
        assert "pw1" not in " ".join(psutil.Process(broker.pid).cmdline())
        for process in broker.worker_processes():  # /proc/PID/environ of the workers
            assert all("pw1" not in value for value in process.environ().values())
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _login(broker, "guest", "guest")
        assert "warning: passwords given with --user" not in broker.log_tail()
    finally:
        finish(broker)


def test_users_from_a_file(tmp_path: Path) -> None:
    """--users-file: NAME:PASSWORD per line, comments and blank lines skipped; the password is
    in no process's command line or environment."""
    users = tmp_path / "users"
    users.write_text("# the service accounts\nsvc:file-pw-1:x\n\nops:file-pw-2\n")
    users.chmod(0o600)
    broker = start_broker(tmp_path / "broker", extra_args=["--users-file", str(users)])
    try:
        assert _login(broker, "svc", "file-pw-1:x").is_open
        assert _login(broker, "ops", "file-pw-2").is_open
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            _login(broker, "guest", "guest")
        for process in [psutil.Process(broker.pid), *broker.worker_processes()]:
            assert "file-pw-1" not in " ".join(process.cmdline())
            assert all("file-pw-1" not in value for value in process.environ().values())
        assert "warning" not in broker.log_tail()
    finally:
        finish(broker)


def _refused(broker: Broker, user: str, password: str) -> bool:
    try:
        _login(broker, user, password).close()
    except pika.exceptions.ProbableAuthenticationError:
        return True
    return False


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=REPO_ROOT)


def test_users_are_kept_in_the_data_directory_across_restarts(tmp_path: Path) -> None:
    """RabbitMQ keeps users in its database: a user given once still logs in after a restart
    without --user; --user again with another password changes it; guest, never created on a
    data directory that started with a user, stays refused. The data directory holds no
    password, only RabbitMQ's salted SHA-256; `shoal list-users` / `delete-user` work on it
    while the broker is stopped, and refuse while it runs."""
    data = ["--data-dir", str(tmp_path / "data")]
    first = start_broker(tmp_path / "first", extra_args=[*data, "--user", "alice:one-pw"])
    try:
        assert _refused(first, "guest", "guest")
        refused = _shoal("delete-user", "alice", *data)
        assert refused.returncode == 1 and "in use by another broker" in refused.stderr
    finally:
        finish(first)
    assert b"one-pw" not in (tmp_path / "data" / "definitions.db").read_bytes()
    second = start_broker(tmp_path / "second", extra_args=data)  # no --user this time
    try:
        _login(second, "alice", "one-pw").close()
        assert _refused(second, "guest", "guest")
    finally:
        finish(second)
    third = start_broker(tmp_path / "third", extra_args=[*data, "--user", "alice:two-pw",
                                                        "--user", "bob:b-pw"])
    try:
        assert _refused(third, "alice", "one-pw")
        _login(third, "alice", "two-pw").close()
        _login(third, "bob", "b-pw").close()
        assert "user 'alice' has a new password" in third.log_tail()
    finally:
        finish(third)
    assert _shoal("list-users", *data).stdout.split() == ["alice", "bob"]
    assert _shoal("delete-user", "bob", *data).returncode == 0
    assert _shoal("list-users", *data).stdout.split() == ["alice"]
    gone = _shoal("delete-user", "bob", *data)
    assert gone.returncode == 1 and "no such user: bob" in gone.stderr
    fourth = start_broker(tmp_path / "fourth", extra_args=data)
    try:
        assert _refused(fourth, "bob", "b-pw")
        _login(fourth, "alice", "two-pw").close()
    finally:
        finish(fourth)


def test_a_new_data_directory_without_users_given_creates_guest(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    broker = start_broker(tmp_path / "broker", extra_args=data)
    try:
        _login(broker, "guest", "guest").close()
    finally:
        finish(broker)
    assert _shoal("list-users", *data).stdout.split() == ["guest"]
