"""`shoal serve --config rabbitmq.conf`: a real broker started from RabbitMQ's config file, and
driven with pika."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pika
import pika.exceptions
import pytest

from perf.brokers import free_port
from tests.integration.harness import HOST, REPO_ROOT, Broker, finish, serve_command
from tests.integration.test_client_behaviour import _non_loopback_address
from tests.integration.test_vhosts import open_refused


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rabbitmq.conf"
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def test_listener_default_user_and_heartbeat_come_from_the_file(tmp_path: Path) -> None:
    """listeners.tcp.default chooses the port, default_user/default_pass replace guest on a new
    data directory (as RabbitMQ's do), and heartbeat is what the broker offers in Tune."""
    port = free_port()
    conf = _config(tmp_path, f"""\
# rabbitmq.conf
listeners.tcp.default = {HOST}:{port}
default_user = alice
default_pass = s3cret#not-part-of-it
heartbeat = 7
""")
    broker = Broker(tmp_path / "broker", extra_args=["--config", str(conf)], port=None)
    try:
        assert broker.port == port
        connection = broker.connect(credentials=pika.PlainCredentials("alice", "s3cret"))
        assert connection._impl.params.heartbeat == 7
        assert connection.channel().queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            broker.connect(credentials=pika.PlainCredentials("guest", "guest"))
        for process in broker.worker_processes():
            assert "s3cret" not in " ".join(process.cmdline())
        assert "s3cret" not in broker.log_tail()
    finally:
        finish(broker)


def test_a_bad_file_stops_the_start_with_file_and_line(tmp_path: Path) -> None:
    """A second AMQP listener: `FILE:LINE: key: reason` and exit code 1, before anything starts."""
    conf = _config(tmp_path, "heartbeat = 7\nlisteners.tcp.local = 127.0.0.1:5999\n"
                             "listeners.tcp.other = 127.0.0.1:5998\n")
    result = subprocess.run(
        [*serve_command(), "serve", "--config", str(conf), "--data-dir", str(tmp_path / "data")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"{conf}:3: listeners.tcp.other: a second tcp listener")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_loopback_users_from_the_file_reach_the_workers(tmp_path: Path) -> None:
    """loopback_users.guest = false lets guest in from a non-loopback address;
    loopback_users.alice = true keeps alice to loopback, with RabbitMQ's generic refusal."""
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to itself through")
    conf = _config(tmp_path, "loopback_users.guest = false\nloopback_users.alice = true\n")
    broker = Broker(tmp_path / "broker", 1, extra_args=[
        "--config", str(conf), "--host", "0.0.0.0", "--user", "guest:guest",
        "--user", "alice:secret-1"])
    try:
        broker.connect(host=address).channel().queue_declare("", exclusive=True)
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
            broker.connect(host=address, credentials=pika.PlainCredentials("alice", "secret-1"))
        assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For " \
            "details see the broker logfile." in str(refused.value), str(refused.value)
        broker.connect(credentials=pika.PlainCredentials("alice", "secret-1"))
    finally:
        finish(broker)


def test_default_vhost_is_the_vhost_a_new_data_directory_starts_with(tmp_path: Path) -> None:
    """default_vhost = app: a new node makes "app" (not "/") and gives the default user full
    permissions there; a restart keeps the vhosts the data directory has (rabbit_vhost)."""
    conf = _config(tmp_path, "default_vhost = app\n")
    broker = Broker(tmp_path / "broker", 1, extra_args=["--config", str(conf)])
    try:
        channel = broker.connect(virtual_host="app").channel()
        channel.queue_declare("kept", durable=True)
        channel.basic_publish("", "kept", b"in app", pika.BasicProperties(delivery_mode=2))
        assert open_refused(broker, "/") == (530, "NOT_ALLOWED - vhost / not found")
        broker.stop()
        broker = Broker(tmp_path / "broker", 1)  # no config now: the directory keeps "app"
        method, _, body = broker.connect(virtual_host="app").channel().basic_get("kept")
        assert method is not None and body == b"in app"
        assert open_refused(broker, "/") == (530, "NOT_ALLOWED - vhost / not found")
    finally:
        finish(broker)


def test_default_vhost_does_not_change_an_initialised_data_directory(tmp_path: Path) -> None:
    """default_vhost matters at the first start only: a data directory made with "/" keeps it,
    and no vhost of the file's name is added later."""
    Broker(tmp_path / "broker", 1).stop()
    conf = _config(tmp_path, "default_vhost = later\n")
    broker = Broker(tmp_path / "broker", 1, extra_args=["--config", str(conf)])
    try:
        broker.connect(virtual_host="/").channel().queue_declare("", exclusive=True)
        assert open_refused(broker, "later") == (530, "NOT_ALLOWED - vhost later not found")
    finally:
        finish(broker)


def test_default_permissions_are_what_the_default_user_gets(tmp_path: Path) -> None:
    """default_permissions.configure = ^mine\\. : guest may declare mine.q in the default vhost,
    and is refused other names (403 ACCESS_REFUSED), as RabbitMQ's default user would be."""
    conf = _config(tmp_path, "default_vhost = app\ndefault_permissions.configure = ^mine\\.\n")
    broker = Broker(tmp_path / "broker", 1, extra_args=["--config", str(conf)])
    try:
        channel = broker.connect(virtual_host="app").channel()
        channel.queue_declare("mine.q")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("theirs")
        assert refused.value.reply_code == 403
    finally:
        finish(broker)
