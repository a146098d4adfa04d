"""Vhost and user limits as RabbitMQ 3.10.8 enforces them (issue 37): max-connections and
max-queues per vhost, max-connections and max-channels per user, their replies and texts, and
shoal ctl, the management API and definitions round trips. One broker (two workers) for the
module; each test clears what it set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands

from broker.passwords import hashed
from tests.integration.ctl_helpers import control, ctl
from tests.integration.harness import Broker, finish, start_broker, wait_until
from tests.integration.management_helpers import HTTP, managed
from tests.integration.rawclient import RawClient, method_frame
from tests.integration.test_permissions import raw_login

__all__ = ["managed"]  # the fixture: one broker with the management API, for the HTTP tests


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("limits") / "broker", workers=2)
    try:
        control(b, command="put_user", name="lim", password="pw")
        control(b, command="set_permissions", user="lim", vhost="/", configure=".*",
                write=".*", read=".*")
        yield b
    finally:
        finish(b)


def raw_open(broker: Broker, user: str = "guest", password: str = "guest") -> RawClient:
    """A raw client that sent connection.open (the answer is left to read)."""
    return raw_login(broker, user, password=password)


def opened(broker: Broker, user: str = "guest", password: str = "guest") -> RawClient:
    client = raw_open(broker, user, password)
    client.read_until(commands.Connection.OpenOk)
    return client


def counted(broker: Broker, kind: str, key: str, n: int) -> None:
    """Wait (bounded) until the supervisor has heard of ``n`` open of ``key`` (limit_usage)."""
    wait_until(lambda: control(broker, command="limit_usage")[kind].get(key, 0) == n, 10.0,
               f"{kind} of {key!r} reported as {n}")


def test_a_connection_over_the_vhost_limit_gets_530_and_after_clear_it_opens(
        broker: Broker) -> None:
    """connection.open over the vhost's max-connections: connection.close 530 NOT_ALLOWED,
    RabbitMQ's text; 0 allows none; once cleared, the same connection opens."""
    assert control(broker, command="set_vhost_limits", vhost="/",
                   limits={"max-connections": 1})["value"] == {"max-connections": 1}
    first = opened(broker)
    try:
        counted(broker, "vhost_connections", "/", 1)
        for _ in range(2):  # whichever worker the next one lands on
            with raw_open(broker) as refused:
                close = refused.expect_connection_close()
                assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
                assert close.reply_text == ("NOT_ALLOWED - access to vhost '/' refused for user "
                                            "'guest': connection limit (1) is reached")
        control(broker, command="set_vhost_limits", vhost="/", limits={"max-connections": 0})
        with raw_open(broker) as refused:
            assert "connection limit (0) is reached" in refused.expect_connection_close().reply_text
        control(broker, command="clear_vhost_limits", vhost="/")
        with raw_open(broker) as accepted:
            accepted.read_until(commands.Connection.OpenOk)
    finally:
        control(broker, command="clear_vhost_limits", vhost="/")
        first.close()


def test_a_users_connection_limit_counts_its_connections_on_every_worker(broker: Broker) -> None:
    """The user's max-connections counts across workers; a negative value is no limit."""
    control(broker, command="set_user_limits", user="lim", limits={"max-connections": 2})
    clients = [opened(broker, "lim", "pw"), opened(broker, "lim", "pw")]
    try:
        counted(broker, "user_connections", "lim", 2)
        for _ in range(2):
            with raw_open(broker, "lim", "pw") as refused:
                close = refused.expect_connection_close()
                assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
                assert close.reply_text == ("NOT_ALLOWED - connection refused for user 'lim': "
                                            "user connection limit (2) is reached")
        with raw_open(broker) as other_user:  # guest has no limit
            other_user.read_until(commands.Connection.OpenOk)
        control(broker, command="set_user_limits", user="lim", limits={"max-connections": -1})
        with raw_open(broker, "lim", "pw") as accepted:
            accepted.read_until(commands.Connection.OpenOk)
    finally:
        control(broker, command="clear_user_limits", user="lim", name="all")
        for client in clients:
            client.close()


def test_a_channel_over_the_users_max_channels_closes_the_connection_with_530(
        broker: Broker) -> None:
    """channel.open past the user's max-channels is a connection error, as rabbit_reader's
    create_channel: 530 NOT_ALLOWED, class and method 0."""
    control(broker, command="set_user_limits", user="lim", limits={"max-channels": 2})
    try:
        client = opened(broker, "lim", "pw")
        client.open_channel(1)
        client.open_channel(2)
        client.send(method_frame(3, commands.Channel.Open()))
        close = client.expect_connection_close()
        assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
        assert close.reply_text == ("NOT_ALLOWED - number of channels opened for user 'lim' has "
                                    "reached the maximum allowed user limit of (2)")
        client.close()
        with pika.BlockingConnection(broker.connection_parameters(
                credentials=pika.PlainCredentials("lim", "pw"))) as conn:
            conn.channel()
            conn.channel()  # the closed connection's channels no longer count
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
                conn.channel()
            assert caught.value.reply_code == 530
    finally:
        control(broker, command="clear_user_limits", user="lim", name="max-channels")


def test_max_queues_refuses_only_new_queues(broker: Broker) -> None:
    """queue.declare of a new queue past max-queues: channel.close 406 PRECONDITION_FAILED with
    rabbit_amqqueue's text; redeclaring an existing queue is fine."""
    with pika.BlockingConnection(broker.connection_parameters()) as conn:
        ch = conn.channel()
        ch.queue_declare("lim-q1")
        existing = len(control(broker, command="snapshot")["queues"])
        control(broker, command="set_vhost_limits", vhost="/", limits={"max-queues": existing})
        try:
            ch.queue_declare("lim-q1")  # exists: no new queue
            ch.queue_declare("lim-q1", passive=True)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                ch.queue_declare("lim-q2")
            assert caught.value.reply_code == 406
            assert caught.value.reply_text == (
                f"PRECONDITION_FAILED - cannot declare queue 'lim-q2': queue limit in vhost '/' "
                f"({existing}) is reached")
            ch = conn.channel()
            control(broker, command="set_vhost_limits", vhost="/",
                    limits={"max-queues": existing + 1})
            ch.queue_declare("lim-q2")
        finally:
            control(broker, command="clear_vhost_limits", vhost="/")
        ch.queue_delete("lim-q1")
        ch.queue_delete("lim-q2")


def test_a_vhosts_limits_hold_in_that_vhost_only_and_go_with_it(broker: Broker) -> None:
    """Limits are per vhost: another vhost's max-connections and max-queues leave "/" alone;
    deleting the vhost deletes its limits (rabbit_vhost:delete)."""
    assert "error" not in control(broker, command="add_vhost", name="lim-v", grant_to="guest")
    try:
        control(broker, command="set_vhost_limits", vhost="lim-v",
                limits={"max-connections": 1, "max-queues": 0})
        with pika.BlockingConnection(broker.connection_parameters(virtual_host="lim-v")) as conn:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                conn.channel().queue_declare("lim-vq")
            assert caught.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue "
                                               "'lim-vq': queue limit in vhost 'lim-v' (0) is reached")
            counted(broker, "vhost_connections", "lim-v", 1)
            with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
                pika.BlockingConnection(broker.connection_parameters(virtual_host="lim-v"))
            assert "access to vhost 'lim-v' refused for user 'guest'" in str(refused.value)
            with pika.BlockingConnection(broker.connection_parameters()) as root:
                root.channel().queue_declare("lim-vq", auto_delete=True)  # "/" has no limit
        exported = json.loads(ctl(broker, "export_definitions", "-").stdout)
        assert {"value": {"max-connections": 1, "max-queues": 0}, "vhost": "lim-v",
                "component": "vhost-limits", "name": "limits"} in exported["parameters"]
    finally:
        control(broker, command="delete_vhost", name="lim-v")
    assert control(broker, command="list_vhost_limits")["limits"] == []


def test_ctl_sets_lists_and_clears_limits_as_rabbitmqctl(broker: Broker) -> None:
    """shoal ctl's limit verbs: rabbitmqctl's lines, JSON and exit codes."""
    done = ctl(broker, "set_vhost_limits", "-p", "/", '{"max-connections": 10, "max-queues": 5}')
    assert done.returncode == 0, done.stderr
    assert done.stdout == ('Setting vhost limits to "{"max-connections": 10, "max-queues": 5}" '
                           'for vhost "/" ...\n')
    assert ctl(broker, "-q", "list_vhost_limits").stdout == '{"max-connections":10,"max-queues":5}\n'
    assert ctl(broker, "-s", "list_vhost_limits", "--global").stdout.splitlines() == [
        '/\t{"max-connections":10,"max-queues":5}']
    bad = ctl(broker, "set_vhost_limits", '{"bogus": 1}')
    assert bad.returncode == 69 and 'Unrecognised terms [{<<"bogus">>,1}] in limits' in bad.stderr
    assert ctl(broker, "set_vhost_limits", "notjson").returncode == 69
    missing = ctl(broker, "set_vhost_limits", "-p", "nosuch", '{"max-queues": 1}')
    assert missing.returncode == 65 and "Virtual host 'nosuch' does not exist" in missing.stderr
    assert ctl(broker, "clear_vhost_limits").returncode == 0
    assert ctl(broker, "-q", "list_vhost_limits").stdout == "{}\n"

    assert ctl(broker, "set_user_limits", "lim", '{"max-channels": 5}').returncode == 0
    assert ctl(broker, "set_user_limits", "lim", '{"max-connections": 3}').returncode == 0  # merged
    assert ctl(broker, "-q", "list_user_limits", "--user", "lim").stdout == (
        '{"max-channels":5,"max-connections":3}\n')
    assert ctl(broker, "list_user_limits", "--global").stdout.splitlines() == [
        "Listing limits for all users ...", "user\tlimits",
        'lim\t{"max-channels":5,"max-connections":3}']
    done = ctl(broker, "clear_user_limits", "lim", "max-channels")
    assert done.stdout == 'Clearing "max-channels" limit for user "lim" ...\n'
    assert ctl(broker, "-q", "list_user_limits", "--user", "lim").stdout == '{"max-connections":3}\n'
    assert ctl(broker, "clear_user_limits", "lim", "all").returncode == 0
    assert ctl(broker, "-q", "list_user_limits", "--user", "lim").stdout == "{}\n"
    nobody = ctl(broker, "set_user_limits", "nosuch", '{"max-channels": 1}')
    assert nobody.returncode == 69 and '{:no_such_user, "nosuch"}' in nobody.stderr


def test_the_management_api_reads_and_changes_limits(managed: tuple[Broker, int]) -> None:
    """/api/vhost-limits and /api/user-limits as RabbitMQ's management API answers them."""
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="lim", password="pw")
    assert http.get("/api/vhost-limits") == []
    assert http.request("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 9})[0] == 204
    assert http.request("PUT", "/api/vhost-limits/%2F/max-connections", {"value": 3})[0] == 204
    assert http.get("/api/vhost-limits") == [
        {"vhost": "/", "value": {"max-connections": 3, "max-queues": 9}}]
    assert http.get("/api/vhost-limits/%2F") == http.get("/api/vhost-limits")
    assert http.request("GET", "/api/vhost-limits/nosuch")[0] == 404
    status, _, body = http.request("PUT", "/api/vhost-limits/%2F/bogus", {"value": 9})
    assert status == 400 and "Unrecognised terms" in body["reason"]
    status, _, body = http.request("PUT", "/api/vhost-limits/%2F/max-queues", {})
    assert (status, body["reason"]) == (400, "[{key_missing,value}]")
    assert http.request("PUT", "/api/vhost-limits/nosuch/max-queues", {"value": 1})[0] == 404
    assert http.request("DELETE", "/api/vhost-limits/%2F/max-queues")[0] == 204
    assert http.get("/api/vhost-limits/%2F") == [{"vhost": "/", "value": {"max-connections": 3}}]
    assert http.request("DELETE", "/api/vhost-limits/%2F/max-connections")[0] == 204
    assert http.get("/api/vhost-limits") == []

    assert http.request("PUT", "/api/user-limits/lim/max-channels", {"value": 4})[0] == 204
    assert http.get("/api/user-limits") == [{"user": "lim", "value": {"max-channels": 4}}]
    assert http.get("/api/user-limits/lim") == [{"user": "lim", "value": {"max-channels": 4}}]
    assert http.get("/api/user-limits/guest") == []
    assert http.request("GET", "/api/user-limits/nosuch")[0] == 404
    status, _, body = http.request("PUT", "/api/user-limits/nosuch/max-channels", {"value": 4})
    assert (status, body["reason"]) == (400, ["no_such_user", "nosuch"])
    assert http.request("DELETE", "/api/user-limits/lim/max-channels")[0] == 204
    assert http.get("/api/user-limits") == []


def test_get_api_users_shows_each_users_limits(managed: tuple[Broker, int]) -> None:
    """rabbit_mgmt_format:internal_user: GET /api/users and /api/users/NAME carry the user's
    ``limits`` (``{}`` when none is set), as they change."""
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="lim", password="pw")
    control(broker, command="set_user_limits", user="lim",
            limits={"max-channels": 5, "max-connections": 2})

    def limits_of(name: str) -> Any:
        return next(u for u in http.get("/api/users") if u["name"] == name)["limits"]

    wanted = {"max-channels": 5, "max-connections": 2}
    wait_until(lambda: limits_of("lim") == wanted, 10.0, "lim's limits in /api/users")
    assert http.get("/api/users/lim")["limits"] == wanted
    assert limits_of("guest") == {}
    control(broker, command="clear_user_limits", user="lim", name="max-channels")
    wait_until(lambda: limits_of("lim") == {"max-connections": 2}, 10.0, "one limit cleared")
    control(broker, command="clear_user_limits", user="lim", name="all")
    wait_until(lambda: http.get("/api/users/lim")["limits"] == {}, 10.0, "all cleared")


def test_definitions_round_trip_with_limits(managed: tuple[Broker, int], tmp_path: Any) -> None:
    """Exported as RabbitMQ 3.10 exports them (the user's ``limits``, a ``vhost-limits``
    parameter), imported back through the management API and shoal ctl."""
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="lim", password="pw")
    control(broker, command="set_vhost_limits", vhost="/", limits={"max-queues": 100})
    control(broker, command="set_user_limits", user="lim", limits={"max-channels": 7})
    exported = http.get("/api/definitions")
    vhost_param = {"value": {"max-queues": 100}, "vhost": "/", "component": "vhost-limits",
                   "name": "limits"}
    assert vhost_param in exported["parameters"]
    assert next(u for u in exported["users"] if u["name"] == "lim")["limits"] == {"max-channels": 7}
    path = tmp_path / "defs.json"
    assert ctl(broker, "export_definitions", str(path)).returncode == 0
    from_ctl = json.loads(path.read_text())
    assert vhost_param in from_ctl["parameters"]
    assert next(u for u in from_ctl["users"] if u["name"] == "lim")["limits"] == {"max-channels": 7}
    for how in ("http", "ctl"):
        control(broker, command="clear_vhost_limits", vhost="/")
        control(broker, command="clear_user_limits", user="lim", name="all")
        if how == "http":
            status, _, answer = http.request("POST", "/api/definitions", exported)
            assert status in (201, 204), (status, answer)
        else:
            done = ctl(broker, "import_definitions", str(path))
            assert done.returncode == 0, done.stderr
        assert control(broker, command="list_vhost_limits")["limits"] == [
            {"vhost": "/", "value": {"max-queues": 100}}]
        assert control(broker, command="list_user_limits")["limits"] == [
            {"user": "lim", "value": {"max-channels": 7}}]
    again = control(broker, command="import_definitions", definitions=exported)
    assert again["unchanged"]["limits"] == 2 and again["imported"]["limits"] == 0
    control(broker, command="clear_vhost_limits", vhost="/")
    control(broker, command="clear_user_limits", user="lim", name="all")


def test_an_import_takes_the_vhost_and_user_limits_of_each_shape(broker: Broker) -> None:
    """A vhost's ``limits`` (older exports), a ``vhost-limits`` parameter and a user's
    ``limits`` are imported; a vhost that is not here is added, with the limits the file gives
    it."""
    try:
        report = control(broker, command="import_definitions", definitions={
            "vhosts": [{"name": "/", "limits": {"max-connections": 50}},
                       {"name": "elsewhere", "limits": {"max-queues": 4}}],
            "users": [{"name": "lim2", "password_hash": hashed({"lim2": "pw"})["lim2"], "tags": [],
                       "limits": {"max-channels": 9}}],
            "parameters": [{"value": {"max-queues": 70}, "vhost": "/",
                            "component": "vhost-limits", "name": "limits"}]})
        assert report["imported"]["limits"] == 4, report
        assert control(broker, command="list_vhost_limits")["limits"] == [
            {"vhost": "/", "value": {"max-queues": 70}},  # the parameter is the vhost's whole set
            {"vhost": "elsewhere", "value": {"max-queues": 4}}]
        assert control(broker, command="list_user_limits", user="lim2")["limits"] == [
            {"user": "lim2", "value": {"max-channels": 9}}]
    finally:
        control(broker, command="clear_vhost_limits", vhost="/")
        control(broker, command="delete_vhost", name="elsewhere")
        control(broker, command="delete_user", name="lim2")


def test_limits_are_kept_across_a_restart(tmp_path: Any) -> None:
    """Limits are definitions: stored in definitions.db and restored at start."""
    directory = tmp_path / "broker"
    broker = start_broker(directory, workers=1)
    try:
        control(broker, command="set_vhost_limits", vhost="/", limits={"max-connections": 0})
        control(broker, command="set_user_limits", user="guest", limits={"max-channels": 3})
    finally:
        finish(broker)
    broker = start_broker(directory, workers=1)
    try:
        assert control(broker, command="list_vhost_limits")["limits"] == [
            {"vhost": "/", "value": {"max-connections": 0}}]
        assert control(broker, command="list_user_limits")["limits"] == [
            {"user": "guest", "value": {"max-channels": 3}}]
        with raw_open(broker) as refused:  # the restored limit is enforced
            assert refused.expect_connection_close().reply_code == 530
    finally:
        finish(broker)
