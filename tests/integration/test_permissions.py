"""Permissions as RabbitMQ 3.10 enforces them on the vhost "/" (issue 37): the regexes per user,
the table of which method needs which, the texts, topic permissions, changes on open
connections, and logins. One broker for the module (alice and bob added at runtime)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.ctl_helpers import control
from tests.integration.harness import Broker, finish, start_broker
from tests.integration.management_helpers import HTTP, managed
from tests.integration.rawclient import (
    PROTOCOL_HEADER,
    RawClient,
    method_frame,
    publish_frames,
    start_ok,
)

__all__ = ["managed"]  # the fixture: one broker with the management API, for the HTTP tests


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("perm") / "broker", workers=2)
    try:
        yield b
    finally:
        finish(b)


def user(broker: Broker, name: str, conf: str = ".*", write: str = ".*", read: str = ".*") -> None:
    control(broker, command="put_user", name=name, password="pw")
    if conf is not None:
        assert "error" not in control(broker, command="set_permissions", user=name, vhost="/",
                                      configure=conf, write=write, read=read)


def login(broker: Broker, name: str) -> pika.adapters.blocking_connection.BlockingChannel:
    password = "guest" if name == "guest" else "pw"
    return broker.connect(credentials=pika.PlainCredentials(name, password)).channel()


def refused(call: Any, text: str) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        call()
    assert caught.value.reply_code == 403, caught.value
    assert caught.value.reply_text == f"ACCESS_REFUSED - {text}"


def raw_login(broker: Broker, name: str, vhost: str = "/", password: str = "pw") -> RawClient:
    client = RawClient(broker.port)
    client.send(PROTOCOL_HEADER)
    client.read_until(commands.Connection.Start)
    client.send(start_ok(name, password))
    tune = client.read_until(commands.Connection.Tune)
    client.send(method_frame(0, commands.Connection.TuneOk(
        channel_max=tune.channel_max, frame_max=131072, heartbeat=0)))
    client.send(method_frame(0, commands.Connection.Open(virtual_host=vhost)))
    return client


def test_guest_has_full_permissions_and_new_users_none(broker: Broker) -> None:
    rows = control(broker, command="list_permissions", vhost="/")["permissions"]
    assert {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} in rows
    control(broker, command="put_user", name="nobody", password="pw")
    assert control(broker, command="list_permissions", user="nobody")["permissions"] == []
    client = raw_login(broker, "nobody")
    close = client.read_until(commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - access to vhost '/' refused for user 'nobody'")
    assert (close.class_id, close.method_id) == (10, 40)
    client.close()


def test_unknown_vhost(broker: Broker) -> None:
    client = raw_login(broker, "guest", "other", password="guest")
    close = client.read_until(commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - vhost other not found")
    client.close()


def test_configure(broker: Broker) -> None:
    user(broker, "cfg", conf="^cfg-", write=".*", read=".*")
    ch = login(broker, "cfg")
    ch.queue_declare("cfg-q")
    ch.exchange_declare("cfg-x", "direct")
    refused(lambda: ch.queue_declare("other-q"),
            "access to queue 'other-q' in vhost '/' refused for user 'cfg'")
    ch = login(broker, "cfg")
    refused(lambda: ch.exchange_declare("other-x", "direct"),
            "access to exchange 'other-x' in vhost '/' refused for user 'cfg'")
    ch = login(broker, "cfg")
    # server-named: checked on the amq.gen-... name, which ^cfg- does not match
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare("")
    assert caught.value.reply_code == 403 and "'amq.gen-" in caught.value.reply_text
    ch = login(broker, "guest")
    ch.queue_declare("other-q")
    ch = login(broker, "cfg")
    ch.queue_declare("other-q", passive=True)  # passive: nothing checked
    refused(lambda: ch.queue_delete("other-q"),
            "access to queue 'other-q' in vhost '/' refused for user 'cfg'")
    login(broker, "guest").queue_declare("other-q", passive=True)  # still there


def test_regex_is_searched_and_empty_matches_nothing(broker: Broker) -> None:
    user(broker, "srch", conf="mid", write="", read="")
    ch = login(broker, "srch")
    ch.queue_declare("a-mid-z", auto_delete=True)  # not anchored
    refused(lambda: ch.basic_get("a-mid-z"),
            "access to queue 'a-mid-z' in vhost '/' refused for user 'srch'")
    ch = login(broker, "srch")
    refused(lambda: (ch.basic_publish("", "a-mid-z", b"x"), ch.queue_declare("a-mid-z", passive=True)),
            "access to exchange 'amq.default' in vhost '/' refused for user 'srch'")


def test_write_and_read(broker: Broker) -> None:
    g = login(broker, "guest")
    g.queue_declare("wr-q")
    g.exchange_declare("wr-x", "fanout")
    g.exchange_declare("wr-y", "fanout")
    user(broker, "wr", conf="", write="^wr-q$|^amq.default$", read="^wr-x$")
    ch = login(broker, "wr")
    ch.queue_bind("wr-q", "wr-x")  # write on queue, read on exchange
    ch.basic_publish("", "wr-q", b"m")
    refused(lambda: ch.queue_bind("wr-q", "wr-y"),
            "access to exchange 'wr-y' in vhost '/' refused for user 'wr'")
    ch = login(broker, "wr")
    refused(lambda: ch.basic_get("wr-q"),
            "access to queue 'wr-q' in vhost '/' refused for user 'wr'")
    ch = login(broker, "wr")
    refused(lambda: ch.queue_purge("wr-q"),
            "access to queue 'wr-q' in vhost '/' refused for user 'wr'")
    ch = login(broker, "wr")
    refused(lambda: ch.basic_consume("wr-q", lambda *a: None),
            "access to queue 'wr-q' in vhost '/' refused for user 'wr'")
    ch = login(broker, "wr")
    refused(lambda: ch.exchange_bind("wr-y", "wr-x"),  # write on the destination
            "access to exchange 'wr-y' in vhost '/' refused for user 'wr'")
    ch = login(broker, "wr")
    # publish: write checked before existence (then 404)
    refused(lambda: (ch.basic_publish("missing-x", "k", b"m"), ch.queue_declare("wr-q", passive=True)),
            "access to exchange 'missing-x' in vhost '/' refused for user 'wr'")
    assert login(broker, "guest").queue_declare("wr-q", passive=True).method.message_count == 1


def test_alternate_and_dead_letter_exchanges(broker: Broker) -> None:
    user(broker, "ae", conf=".*", write="^ae-ok", read=".*")
    ch = login(broker, "ae")
    ch.exchange_declare("ae-a", "fanout", arguments={"alternate-exchange": "ae-ok"})
    refused(lambda: ch.exchange_declare("ae-b", "fanout", arguments={"alternate-exchange": "ae-no"}),
            "access to exchange 'ae-no' in vhost '/' refused for user 'ae'")
    ch = login(broker, "ae")
    refused(lambda: ch.queue_declare("ae-q", arguments={"x-dead-letter-exchange": "ae-no"}),
            "access to exchange 'ae-no' in vhost '/' refused for user 'ae'")
    ch = login(broker, "ae")
    ch.queue_declare("ae-q2", arguments={"x-dead-letter-exchange": "ae-ok"})


def test_revocation_on_an_open_connection(broker: Broker) -> None:
    user(broker, "rev")
    ch = login(broker, "rev")
    ch.queue_declare("rev-q1")
    ch.basic_publish("", "rev-q1", b"m")
    control(broker, command="set_permissions", user="rev", vhost="/", configure="^rev-q1$",
            write="", read="")
    time.sleep(0.3)  # the change reaches the workers on their rings, after the control answer
    refused(lambda: ch.queue_declare("rev-q2"),
            "access to queue 'rev-q2' in vhost '/' refused for user 'rev'")
    ch = login(broker, "rev")
    refused(lambda: (ch.basic_publish("", "rev-q1", b"m"), ch.queue_declare("rev-q1", passive=True)),
            "access to exchange 'amq.default' in vhost '/' refused for user 'rev'")
    control(broker, command="clear_permissions", user="rev", vhost="/")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as caught:
        login(broker, "rev")
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'rev'\"" in str(caught.value)


def test_ctl_verbs(broker: Broker) -> None:
    import subprocess
    import sys

    from tests.integration.harness import REPO_ROOT
    control(broker, command="put_user", name="ctlu", password="pw")

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "ctl", "--control-socket",
                               str(broker.control_dir / "control.sock"), *args],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert ctl("set_permissions", "-p", "/", "ctlu", "^c", "^w", "^r").returncode == 0
    out = ctl("-q", "list_user_permissions", "ctlu").stdout.splitlines()
    assert out[-1] == "/\t^c\t^w\t^r"
    assert ctl("set_topic_permissions", "ctlu", "amq.topic", "^a", "^b").returncode == 0
    assert "ctlu\tamq.topic\t^a\t^b" in ctl("-q", "list_topic_permissions").stdout
    assert ctl("clear_topic_permissions", "ctlu").returncode == 0
    assert ctl("clear_permissions", "ctlu").returncode == 0
    listed = ctl("-q", "list_user_permissions", "ctlu").stdout.strip().splitlines()
    assert listed[-1:] in ([], ["vhost\tconfigure\twrite\tread"])
    assert ctl("set_permissions", "nosuch", ".*", ".*", ".*").returncode != 0


def topic_user(broker: Broker, name: str, write: str, read: str,
               exchange: str = "amq.topic") -> None:
    user(broker, name)
    assert "error" not in control(broker, command="set_topic_permissions", user=name, vhost="/",
                                  exchange=exchange, write=write, read=read)


def test_topic_publish_key(broker: Broker) -> None:
    topic_user(broker, "tp", write="^tp\\.ok", read=".*")
    ch = login(broker, "tp")
    ch.queue_declare("tp-q")
    ch.queue_bind("tp-q", "amq.topic", "tp.#")
    ch.basic_publish("amq.topic", "tp.ok.1", b"m")
    refused(lambda: (ch.basic_publish("amq.topic", "tp.no", b"m"),
                     ch.queue_declare("tp-q", passive=True)),
            "access to topic 'tp.no' in exchange 'amq.topic' in vhost '/' refused for user 'tp'")
    ch = login(broker, "tp")
    ch.exchange_declare("tp-direct", "direct")  # not a topic exchange: no topic check
    ch.basic_publish("tp-direct", "tp.no", b"m")
    ch.exchange_declare("tp-other", "topic")  # a topic exchange without an entry: allowed
    ch.basic_publish("tp-other", "tp.no", b"m")
    assert ch.queue_declare("tp-q", passive=True).method.message_count == 1
    # another user without topic permissions is not affected
    g = login(broker, "guest")
    g.basic_publish("amq.topic", "tp.no", b"m")
    assert g.queue_declare("tp-q", passive=True).method.message_count == 2


def test_a_change_applies_to_open_connections_after_caching(broker: Broker) -> None:
    """The supervisor keeps its topic verdicts per (user, vhost, exchange, routing key) until a
    permission changes: a connection open across a topic permission change, a permission change
    and a topic permission cleared publishes under the rules of the moment each time."""
    topic_user(broker, "tc", write="^tc\\.a$", read=".*")
    connection = broker.connect(credentials=pika.PlainCredentials("tc", "pw"))

    def channel() -> pika.adapters.blocking_connection.BlockingChannel:
        ch = connection.channel()
        ch.confirm_delivery()
        return ch

    def no(key: str) -> str:
        return f"access to topic '{key}' in exchange 'amq.topic' in vhost '/' refused for user 'tc'"

    ch = channel()
    ch.queue_declare("tc-q")
    ch.queue_bind("tc-q", "amq.topic", "tc.*")
    for _ in range(3):  # the first verdict is kept, the others come from it
        ch.basic_publish("amq.topic", "tc.a", b"m")
    refused(lambda: ch.basic_publish("amq.topic", "tc.b", b"m"), no("tc.b"))
    ch = channel()
    refused(lambda: ch.basic_publish("amq.topic", "tc.b", b"m"), no("tc.b"))
    assert "error" not in control(broker, command="set_topic_permissions", user="tc", vhost="/",
                                  exchange="amq.topic", write="^tc\\.b$", read=".*")
    ch = channel()
    ch.basic_publish("amq.topic", "tc.b", b"m")
    refused(lambda: ch.basic_publish("amq.topic", "tc.a", b"m"), no("tc.a"))
    control(broker, command="set_permissions", user="tc", vhost="/", configure=".*",
            write="^amq\\.topic$|^amq\\.default$", read=".*")
    ch = channel()
    ch.basic_publish("amq.topic", "tc.b", b"m")
    control(broker, command="clear_topic_permissions", user="tc", vhost="/")
    ch = channel()
    ch.basic_publish("amq.topic", "tc.a", b"m")
    ch.basic_publish("amq.topic", "tc.c", b"m")
    assert ch.queue_declare("tc-q", passive=True).method.message_count == 7
    connection.close()


def test_topic_publish_refusal_frame(broker: Broker) -> None:
    topic_user(broker, "tpraw", write="^ok$", read=".*")
    client = raw_login(broker, "tpraw")
    client.read_until(commands.Connection.OpenOk)
    client.open_channel(1)
    client.send(*publish_frames(1, "amq.topic", "no", b"m"))
    close = client.read_until(commands.Channel.Close, channel=1)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        403, "ACCESS_REFUSED - access to topic 'no' in exchange 'amq.topic' in vhost '/' "
             "refused for user 'tpraw'", 60, 40)
    client.close()


def test_topic_binding_key_and_expansion(broker: Broker) -> None:
    topic_user(broker, "tb", write="^{username}\\.", read="^{username}\\.|^{vhost}$")
    ch = login(broker, "tb")
    ch.queue_declare("tb-q")
    ch.queue_bind("tb-q", "amq.topic", "tb.#")  # {username} expanded
    ch.queue_bind("tb-q", "amq.topic", "/")  # {vhost} expanded
    refused(lambda: ch.queue_bind("tb-q", "amq.topic", "other.#"),
            "access to topic 'other.#' in exchange 'amq.topic' in vhost '/' refused for user 'tb'")
    ch = login(broker, "tb")
    refused(lambda: ch.queue_unbind("tb-q", "amq.topic", "other.#"),
            "access to topic 'other.#' in exchange 'amq.topic' in vhost '/' refused for user 'tb'")
    ch = login(broker, "tb")
    ch.exchange_declare("tb-dest", "fanout")
    refused(lambda: ch.exchange_bind("tb-dest", "amq.topic", "zz"),  # the source's read key
            "access to topic 'zz' in exchange 'amq.topic' in vhost '/' refused for user 'tb'")
    ch = login(broker, "tb")
    ch.exchange_bind("tb-dest", "amq.topic", "tb.x")
    ch.basic_publish("amq.topic", "tb.x", b"m")
    refused(lambda: (ch.basic_publish("amq.topic", "x.tb", b"m"),
                     ch.queue_declare("tb-q", passive=True)),
            "access to topic 'x.tb' in exchange 'amq.topic' in vhost '/' refused for user 'tb'")
    control(broker, command="clear_topic_permissions", user="tb", vhost="/")
    time.sleep(0.3)
    ch = login(broker, "tb")
    ch.queue_bind("tb-q", "amq.topic", "other.#")  # cleared: allowed again


def test_user_id(broker: Broker) -> None:
    user(broker, "uid")
    ch = login(broker, "uid")
    ch.queue_declare("uid-q")
    ch.basic_publish("", "uid-q", b"m", pika.BasicProperties(user_id="uid"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.basic_publish("", "uid-q", b"m", pika.BasicProperties(user_id="someone"))
        ch.queue_declare("uid-q", passive=True)
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == ("PRECONDITION_FAILED - user_id property set to 'someone' "
                                       "but authenticated user was 'uid'")
    control(broker, command="put_user", name="imp", password="pw", tags=["impersonator"])
    user(broker, "imp")
    time.sleep(0.3)
    ch = login(broker, "imp")
    ch.basic_publish("", "uid-q", b"m", pika.BasicProperties(user_id="someone"))
    assert ch.queue_declare("uid-q", passive=True).method.message_count == 2


# --------------------------------------------------------------------------- management API


def test_http_permissions(managed: tuple[Broker, int]) -> None:
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="hp", password="pw")
    assert http.request("GET", "/api/permissions/%2F/hp")[0] == 404
    body = {"configure": "^hp-", "write": ".*", "read": ""}
    assert http.request("PUT", "/api/permissions/%2F/hp", body)[0] == 201
    assert http.request("PUT", "/api/permissions/%2F/hp", dict(body, read="^x"))[0] == 204
    mine = {"user": "hp", "vhost": "/", "configure": "^hp-", "write": ".*", "read": "^x"}
    assert http.get("/api/permissions/%2F/hp") == mine
    assert mine in http.get("/api/permissions")
    assert http.get("/api/users/hp/permissions") == [mine]
    assert mine in http.get("/api/vhosts/%2F/permissions")
    assert control(broker, command="list_permissions", user="hp")["permissions"] == [mine]
    status, _, answer = http.request("PUT", "/api/permissions/%2F/hp", {"configure": ".*"})
    assert status == 400, answer
    assert http.request("PUT", "/api/permissions/%2F/hp", dict(body, write="("))[0] == 400
    # not an administrator: refused, reads too (as RabbitMQ)
    control(broker, command="put_user", name="hpmon", password="pw", tags=["monitoring"])
    status, _, answer = HTTP(port, "hpmon", "pw").request("PUT", "/api/permissions/%2F/hp", body)
    assert status == 403 and answer["error"] == "not_authorised", answer
    assert HTTP(port, "hpmon", "pw").request("GET", "/api/permissions")[0] == 403
    assert http.request("DELETE", "/api/permissions/%2F/hp")[0] == 204
    assert http.request("DELETE", "/api/permissions/%2F/hp")[0] == 404
    assert http.get("/api/users/hp/permissions") == []


def test_http_topic_permissions(managed: tuple[Broker, int]) -> None:
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="ht", password="pw")
    body = {"exchange": "amq.topic", "write": "^ht\\.", "read": ".*"}
    assert http.request("PUT", "/api/topic-permissions/%2F/ht", body)[0] == 201
    assert http.request("PUT", "/api/topic-permissions/%2F/ht", body)[0] == 204
    mine = {"user": "ht", "vhost": "/", **body}
    assert http.get("/api/topic-permissions/%2F/ht") == [mine]
    assert mine in http.get("/api/topic-permissions")
    assert http.get("/api/users/ht/topic-permissions") == [mine]
    assert mine in http.get("/api/vhosts/%2F/topic-permissions")
    assert http.request("PUT", "/api/topic-permissions/%2F/ht", {"write": ".*"})[0] == 400
    assert http.request("DELETE", "/api/topic-permissions/%2F/ht")[0] == 204
    assert http.request("GET", "/api/topic-permissions/%2F/ht")[0] == 404
    assert http.get("/api/users/ht/topic-permissions") == []


def test_definitions_round_trip_with_permissions(managed: tuple[Broker, int],
                                                 tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    from tests.integration.harness import REPO_ROOT
    broker, port = managed
    http = HTTP(port)
    control(broker, command="put_user", name="dr", password="pw")
    control(broker, command="set_permissions", user="dr", vhost="/", configure="^dr-",
            write="^w", read="^r")
    control(broker, command="set_topic_permissions", user="dr", vhost="/",
            exchange="amq.topic", write="^{username}", read="x")
    perm = {"user": "dr", "vhost": "/", "configure": "^dr-", "write": "^w", "read": "^r"}
    topic = {"user": "dr", "vhost": "/", "exchange": "amq.topic", "write": "^{username}",
             "read": "x"}
    exported = http.get("/api/definitions")
    assert perm in exported["permissions"] and topic in exported["topic_permissions"]
    path = tmp_path / "defs.json"
    done = subprocess.run([sys.executable, "-m", "cli.main", "ctl", "--control-socket",
                           str(broker.control_dir / "control.sock"), "export_definitions",
                           str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    from_ctl = json.loads(path.read_text())
    assert perm in from_ctl["permissions"] and topic in from_ctl["topic_permissions"]
    # cleared, then imported again: through the management API, then shoal ctl
    control(broker, command="clear_permissions", user="dr", vhost="/")
    control(broker, command="clear_topic_permissions", user="dr", vhost="/")
    status, _, answer = http.request("POST", "/api/definitions", exported)
    assert status in (201, 204), (status, answer)
    assert control(broker, command="list_permissions", user="dr")["permissions"] == [perm]
    assert control(broker, command="list_topic_permissions", user="dr")["topic_permissions"] == [topic]
    control(broker, command="clear_permissions", user="dr", vhost="/")
    control(broker, command="clear_topic_permissions", user="dr", vhost="/")
    done = subprocess.run([sys.executable, "-m", "cli.main", "ctl", "--control-socket",
                           str(broker.control_dir / "control.sock"), "import_definitions",
                           str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert control(broker, command="list_permissions", user="dr")["permissions"] == [perm]
    assert control(broker, command="list_topic_permissions", user="dr")["topic_permissions"] == [topic]
