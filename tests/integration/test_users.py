"""`shoal serve --user NAME:PASSWORD` (and $SHOAL_USERS): who may log in. Each test has its own
broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import psutil
import pytest

from tests.integration.harness import Broker, finish, start_broker


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
