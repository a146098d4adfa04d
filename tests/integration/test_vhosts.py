"""Virtual hosts as RabbitMQ 3.10 has them (issue 37): each its own exchanges, queues, bindings and
exclusive queues; made and deleted with shoal ctl, the control socket and the management API;
kept in the data directory; deleting one takes everything in it and closes its connections."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.ctl_helpers import control, ctl
from tests.integration.harness import (
    Broker,
    finish,
    start_broker,
    wait_until,
    worker_of,
)
from tests.integration.management_helpers import HTTP, start_with_management
from tests.integration.rawclient import PROTOCOL_HEADER, RawClient, method_frame, start_ok


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("vhosts") / "broker", workers=2)
    try:
        yield b
    finally:
        finish(b)


def add_vhost(broker: Broker, name: str, user: str = "guest") -> None:
    """A vhost, and full permissions there for ``user`` (a new vhost has none)."""
    assert "error" not in control(broker, command="add_vhost", name=name)
    assert "error" not in control(broker, command="set_permissions", user=user, vhost=name,
                                  configure=".*", write=".*", read=".*")


def connect(broker: Broker, vhost: str, **overrides: Any) -> pika.BlockingConnection:
    return broker.connect(virtual_host=vhost, **overrides)


def open_refused(broker: Broker, vhost: str, user: str = "guest",
                 password: str = "guest") -> tuple[int, str]:
    """connection.open to ``vhost`` in raw frames: the code and text of the broker's close."""
    client = RawClient(broker.port)
    try:
        client.send(PROTOCOL_HEADER)
        client.read_until(commands.Connection.Start)
        client.send(start_ok(user, password))
        tune = client.read_until(commands.Connection.Tune)
        client.send(method_frame(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=131072, heartbeat=0)))
        client.send(method_frame(0, commands.Connection.Open(virtual_host=vhost)))
        close = client.read_until(commands.Connection.Close)
        return close.reply_code, close.reply_text
    finally:
        client.close()


def closed_by_broker(connection: pika.BlockingConnection) -> tuple[int, str]:
    """Wait (bounded) for the broker to close ``connection``; its code and text."""
    caught: list[pika.exceptions.ConnectionClosedByBroker] = []

    def closed() -> bool:
        try:
            connection.process_data_events(time_limit=0.1)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            caught.append(exc)
            return True
        return False

    wait_until(closed, 15.0, "the broker closes the connection")
    return caught[0].reply_code, caught[0].reply_text


def count(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_a_queue_of_one_vhost_is_not_the_same_named_queue_of_another(broker: Broker) -> None:
    """rabbit_amqqueue: a queue is named by vhost and name; a publish stays in its vhost."""
    add_vhost(broker, "iso-a")
    add_vhost(broker, "iso-b")
    a, b = connect(broker, "iso-a").channel(), connect(broker, "iso-b").channel()
    for ch in (a, b):
        ch.queue_declare("q", arguments={"x-max-length": 10})
    a.basic_publish("", "q", b"to a")
    a.basic_publish("", "q", b"to a again")
    b.basic_publish("", "q", b"to b")
    assert (count(a, "q"), count(b, "q")) == (2, 1)
    assert b.basic_get("q", auto_ack=True)[2] == b"to b"
    # Not declared in "/": a 404 there.
    root = broker.connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        root.queue_declare("q", passive=True)
    assert caught.value.reply_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    # Purge and delete in one leave the other's alone.
    a.queue_purge("q")
    b.basic_publish("", "q", b"b stays")
    assert (count(a, "q"), count(b, "q")) == (0, 1)
    a.queue_delete("q")
    assert count(b, "q") == 1


def test_each_vhost_has_its_own_amq_exchanges_and_bindings(broker: Broker) -> None:
    """AMQP 0-9-1 §3.1.3: the standard exchanges are per vhost; a binding lives in one."""
    add_vhost(broker, "amq-a")
    add_vhost(broker, "amq-b")
    a, b = connect(broker, "amq-a").channel(), connect(broker, "amq-b").channel()
    for ch in (a, b):
        ch.exchange_declare("amq.topic", "topic", passive=True)
        ch.queue_declare("fan")
    a.queue_bind("fan", "amq.fanout")
    b.basic_publish("amq.fanout", "", b"nowhere: no binding in amq-b")
    a.basic_publish("amq.fanout", "", b"a's binding")
    assert (count(a, "fan"), count(b, "fan")) == (1, 0)
    # An exchange declared in one is not there in the other.
    a.exchange_declare("only-a", "direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        b.exchange_declare("only-a", "direct", passive=True)
    assert caught.value.reply_text == "NOT_FOUND - no exchange 'only-a' in vhost 'amq-b'"


def test_dead_letters_and_alternate_exchanges_stay_in_the_vhost(broker: Broker) -> None:
    """x-dead-letter-exchange and alternate-exchange name exchanges of the queue's vhost."""
    add_vhost(broker, "dl-a")
    add_vhost(broker, "dl-b")
    a, b = connect(broker, "dl-a").channel(), connect(broker, "dl-b").channel()
    for ch in (a, b):
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("dead")
        ch.queue_bind("dead", "dlx")
        ch.exchange_declare("ae", "fanout")
        ch.queue_declare("unrouted")
        ch.queue_bind("unrouted", "ae")
        ch.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})
    a.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    a.basic_publish("", "work", b"rejected")
    method, _, _ = a.basic_get("work")
    a.basic_reject(method.delivery_tag, requeue=False)
    a.basic_publish("main", "no-such-key", b"to the alternate")
    wait_until(lambda: count(a, "dead") == 1, 10.0, "the dead letter reaches dl-a's queue")
    assert (count(a, "unrouted"), count(b, "dead"), count(b, "unrouted")) == (1, 0, 0)


def test_connection_open_to_a_missing_vhost_is_530(broker: Broker) -> None:
    """rabbit_access_control:check_vhost_access: 530 NOT_ALLOWED - vhost V not found."""
    assert open_refused(broker, "nope") == (530, "NOT_ALLOWED - vhost nope not found")


def test_a_user_with_permissions_in_one_vhost_only_may_open_that_one(broker: Broker) -> None:
    """A new vhost has no permissions; a user granted in ``a`` only is refused in "/"."""
    control(broker, command="put_user", name="alice", password="pw")
    add_vhost(broker, "perm-a", user="alice")
    alice = pika.PlainCredentials("alice", "pw")
    connect(broker, "perm-a", credentials=alice).channel().queue_declare("mine")
    assert open_refused(broker, "/", "alice", "pw") == (
        530, "NOT_ALLOWED - access to vhost '/' refused for user 'alice'")
    assert "error" not in control(broker, command="add_vhost", name="perm-b")  # nobody may enter
    assert open_refused(broker, "perm-b") == (
        530, "NOT_ALLOWED - access to vhost 'perm-b' refused for user 'guest'")


def test_exclusive_queues_of_the_same_name_in_two_vhosts(broker: Broker) -> None:
    """Exclusivity is per queue, and a queue per vhost: no 405 across vhosts."""
    add_vhost(broker, "ex-a")
    add_vhost(broker, "ex-b")
    a, b = connect(broker, "ex-a").channel(), connect(broker, "ex-b").channel()
    a.queue_declare("mine", exclusive=True)
    b.queue_declare("mine", exclusive=True)
    other = connect(broker, "ex-a").channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        other.queue_declare("mine", passive=True)
    assert caught.value.reply_code == 405


def test_deleting_a_vhost_closes_its_connections_with_320_and_takes_its_queues(
        broker: Broker) -> None:
    """rabbit_vhost:delete: 320 CONNECTION_FORCED - vhost 'V' is deleted; the rest stay."""
    add_vhost(broker, "doomed")
    doomed = connect(broker, "doomed")
    doomed.channel().queue_declare("q", durable=True)
    root = broker.connect()
    root.channel().queue_declare("root-q")
    assert control(broker, command="delete_vhost", name="doomed") == {"deleted": "doomed"}
    assert closed_by_broker(doomed) == (320, "CONNECTION_FORCED - vhost 'doomed' is deleted")
    assert root.is_open and count(root.channel(), "root-q") == 0
    assert open_refused(broker, "doomed") == (530, "NOT_ALLOWED - vhost doomed not found")
    # Made again, it is empty: the queue went with it.
    add_vhost(broker, "doomed")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        connect(broker, "doomed").channel().queue_declare("q", passive=True)
    assert caught.value.reply_code == 404
    assert control(broker, command="delete_vhost", name="never") == {
        "error": "Virtual host 'never' does not exist", "code": "missing"}


def test_ctl_adds_lists_and_deletes_vhosts(broker: Broker) -> None:
    """rabbitmqctl add_vhost / list_vhosts / delete_vhost, and -p for list_queues."""
    done = ctl(broker, "add_vhost", "ctl-v", "--description", "made by ctl", "--tags", "x,y")
    assert done.returncode == 0, done.stderr
    assert 'Adding vhost "ctl-v" ...' in done.stdout
    listed = ctl(broker, "list_vhosts", "name", "description", "tags")
    assert "ctl-v\tmade by ctl\t[x, y]" in listed.stdout.splitlines()
    assert "/\tDefault virtual host\t[]" in listed.stdout.splitlines()
    add_vhost(broker, "ctl-v")
    connect(broker, "ctl-v").channel().queue_declare("only-in-ctl-v")
    assert "only-in-ctl-v" in ctl(broker, "list_queues", "-p", "ctl-v", "-q").stdout
    assert "only-in-ctl-v" not in ctl(broker, "list_queues", "-q").stdout
    deleted = ctl(broker, "delete_vhost", "ctl-v")
    assert deleted.returncode == 0 and 'Deleting vhost "ctl-v" ...' in deleted.stdout
    assert "ctl-v" not in ctl(broker, "list_vhosts").stdout.split()
    missing = ctl(broker, "delete_vhost", "ctl-v")  # rabbitmqctl 3.10.8: 65 and this text
    assert missing.returncode == 65 and "Virtual host 'ctl-v' does not exist" in missing.stderr
    again = ctl(broker, "add_vhost", "twice")
    assert (again.returncode, ctl(broker, "add_vhost", "twice").returncode) == (0, 0)
    listed = ctl(broker, "list_vhosts", "name", "default_queue_type", "tracing", "-q")
    assert "twice\tundefined\tfalse" in listed.stdout.splitlines()


def test_vhosts_and_their_messages_survive_a_restart(tmp_path: Path) -> None:
    """Durable queues of the same name in two vhosts come back with their persistent messages;
    a deleted vhost's do not (its index records and definitions went with it)."""
    persistent = pika.BasicProperties(delivery_mode=2)
    b = start_broker(tmp_path / "broker", workers=1)
    try:
        for name in ("keep-a", "keep-b", "gone"):
            add_vhost(b, name)
            ch = connect(b, name).channel()
            ch.confirm_delivery()
            ch.queue_declare("orders", durable=True)
            ch.basic_publish("", "orders", f"in {name}".encode(), persistent)
        connect(b, "keep-a").channel().basic_publish("", "orders", b"second in keep-a", persistent)
        b.close_clients()
        assert control(b, command="delete_vhost", name="gone") == {"deleted": "gone"}
        b.stop()
        b = start_broker(tmp_path / "broker", workers=1)
        assert [v["name"] for v in control(b, command="list_vhosts")["vhosts"]] == [
            "/", "keep-a", "keep-b"]
        a, bb = connect(b, "keep-a").channel(), connect(b, "keep-b").channel()
        assert [a.basic_get("orders", auto_ack=True)[2] for _ in range(2)] == [
            b"in keep-a", b"second in keep-a"]
        assert bb.basic_get("orders", auto_ack=True)[2] == b"in keep-b"
        assert open_refused(b, "gone") == (530, "NOT_ALLOWED - vhost gone not found")
    finally:
        finish(b)


def test_management_api_makes_lists_and_deletes_vhosts(tmp_path: Path) -> None:
    """rabbit_mgmt_wm_vhost: PUT 201 (the maker gets full permissions), GET, DELETE 204, 404;
    the per-vhost listings show each vhost's objects with their vhost."""
    b, port = start_with_management(tmp_path / "managed")
    http = HTTP(port)
    try:
        status, _, _ = http.request("PUT", "/api/vhosts/web", {"description": "from the API",
                                                               "tags": "a,b"})
        assert status == 201
        assert http.request("PUT", "/api/vhosts/web", {"description": "again"})[0] == 204
        one = http.get("/api/vhosts/web")
        assert (one["name"], one["description"], one["tags"]) == ("web", "again", ["a", "b"])
        assert {v["name"] for v in http.get("/api/vhosts")} == {"/", "web"}
        # guest made it: guest may use it at once.
        ch = connect(b, "web").channel()
        ch.queue_declare("web-q")
        ch.basic_publish("", "web-q", b"x")
        broker_root = b.connect().channel()
        broker_root.queue_declare("web-q")
        wait_until(lambda: http.get("/api/queues/web"), 10.0, "the sample shows the queue")
        queues = http.get("/api/queues/web")
        assert [(q["name"], q["vhost"]) for q in queues] == [("web-q", "web")]
        assert http.get("/api/queues/web/web-q")["vhost"] == "web"
        assert {x["vhost"] for x in http.get("/api/exchanges/web")} == {"web"}
        assert {(q["name"], q["vhost"]) for q in http.get("/api/queues")} >= {
            ("web-q", "web"), ("web-q", "/")}
        assert http.request("PUT", "/api/queues/web/made-by-api", {"durable": True})[0] == 201
        assert count(ch, "made-by-api") == 0
        assert http.request("DELETE", "/api/vhosts/web")[0] == 204
        assert http.request("GET", "/api/vhosts/web")[0] == 404
        assert http.request("GET", "/api/queues/web")[0] == 404
        assert http.request("DELETE", "/api/vhosts/web")[0] == 404
    finally:
        finish(b)


@pytest.mark.deadline(90)
def test_a_shovel_uri_with_a_vhost_path_reaches_that_vhost(broker: Broker) -> None:
    """A shovel's src-uri and dest-uri name their vhost (amqp://host/VHOST): here two of this
    broker's, its queue in one moved to the same-named queue in the other."""
    add_vhost(broker, "sh-src")
    add_vhost(broker, "sh-dst")
    src = connect(broker, "sh-src").channel()
    dst = connect(broker, "sh-dst").channel()
    for ch in (src, dst):
        ch.queue_declare("moved", durable=True)  # as the shovel declares its queues
    src.basic_publish("", "moved", b"across vhosts")
    answer = control(broker, command="set_parameter", vhost="sh-src", component="shovel",
                     name="between", value={"src-uri": "amqp:///sh-src", "src-queue": "moved",
                                            "dest-uri": "amqp:///sh-dst", "dest-queue": "moved"})
    assert "error" not in answer, answer
    try:
        wait_until(lambda: count(dst, "moved") == 1, 60.0, "the shovel moves the message")
        assert count(src, "moved") == 0
        assert dst.basic_get("moved", auto_ack=True)[2] == b"across vhosts"
    finally:
        # The shovel's vhost deleted: its parameter goes with it (and the shovel stops).
        assert control(broker, command="delete_vhost", name="sh-src") == {"deleted": "sh-src"}
    assert control(broker, command="list_parameters")["parameters"] == []


def test_a_replaced_worker_knows_the_vhosts(broker: Broker) -> None:
    """A worker started in place of a dead one is given the vhosts in its configuration, and
    learns those made later: connection.open to either succeeds on every worker."""
    add_vhost(broker, "before-kill")
    broker.close_clients()  # the workers balance by open connections: start even
    old = broker.worker_pids[0]
    os.kill(old, signal.SIGKILL)
    broker.wait_for_worker_replaced(0, old)
    add_vhost(broker, "after-kill")
    for vhost in ("before-kill", "after-kill"):
        opened = [connect(broker, vhost) for _ in range(6)]  # kept open: spread over the workers
        assert {worker_of(c) for c in opened} == {0, 1}
        for c in opened:
            c.channel().queue_declare("", exclusive=True)
            c.close()


def test_topic_permissions_are_per_vhost(broker: Broker) -> None:
    """A topic permission on amq.topic of one vhost does not reach amq.topic of another."""
    control(broker, command="put_user", name="topical", password="pw")
    for name in ("tp-a", "tp-b"):
        add_vhost(broker, name, user="topical")
    assert "error" not in control(broker, command="set_topic_permissions", user="topical",
                                  vhost="tp-a", exchange="amq.topic", write="^allowed$", read=".*")
    creds = pika.PlainCredentials("topical", "pw")
    a = connect(broker, "tp-a", credentials=creds).channel()
    b = connect(broker, "tp-b", credentials=creds).channel()
    b.basic_publish("amq.topic", "anything", b"no topic permission in tp-b: allowed")
    b.queue_declare("", exclusive=True)  # the channel is still open
    a.basic_publish("amq.topic", "allowed", b"ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        a.basic_publish("amq.topic", "refused", b"no")
        a.queue_declare("", exclusive=True)
    assert caught.value.reply_text == ("ACCESS_REFUSED - access to topic 'refused' in exchange "
                                       "'amq.topic' in vhost 'tp-a' refused for user 'topical'")


def test_slash_may_be_deleted_and_stays_deleted_across_a_restart(tmp_path: Path) -> None:
    """RabbitMQ lets "/" be deleted: connection.open to it is 530 until it is made again."""
    b = start_broker(tmp_path / "broker", workers=1)
    try:
        b.connect().channel().queue_declare("in-slash", durable=True)
        b.close_clients()
        assert control(b, command="delete_vhost", name="/") == {"deleted": "/"}
        assert open_refused(b, "/") == (530, "NOT_ALLOWED - vhost / not found")
        b.stop()
        b = start_broker(tmp_path / "broker", workers=1)
        assert control(b, command="list_vhosts")["vhosts"] == []
        assert open_refused(b, "/") == (530, "NOT_ALLOWED - vhost / not found")
        add_vhost(b, "/")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            b.connect().channel().queue_declare("in-slash", passive=True)
        assert caught.value.reply_code == 404  # made again, empty
    finally:
        finish(b)
