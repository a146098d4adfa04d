"""`shoal ctl`'s output, pure: rabbitmqctl 3.10's tables, values and JSON, from made-up answers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import ctl, ctl_format, ctl_group

SNAPSHOT = {
    "vhost": "/",
    "queues": [["q1", True, False, None, {}, 1, 0, 0, 1],
               ["q2", False, False, None, {"x-max-length": 10}, 0, 2, 1, 5],
               ["ex", False, True, [0, 3], {}, 0, 0, 0, 0]],
    "exchanges": [["", "direct", True, False, False, {}], ["amq.topic", "topic", True, False, False, {}],
                  ["ex1", "topic", False, False, False, {"alternate-exchange": "ae"}]],
    "bindings": [["ex1", "q1", "queue", "a.#", {}], ["ex1", "ex", "queue", "k", {}]],
    "consumers": [["q2", "ctag1", 0, 3, 1, False, True, 0, True]],
    "channels": [[0, 3, 1, 1, 2]],
}
USERS = [{"name": "guest", "tags": ["administrator"], "password_hash": "h",
          "hashing_algorithm": "rabbit_password_hashing_sha256"},
         {"name": "u1", "tags": [], "password_hash": "h1",
          "hashing_algorithm": "rabbit_password_hashing_sha256"}]


def test_values_are_written_as_rabbitmqctl_writes_them() -> None:
    assert ctl_format.format_value("durable", True) == "true"
    assert ctl_format.format_value("arguments", {}) == "[]"
    assert ctl_format.format_value("arguments", {"x-max-length": 10}) == '[{"x-max-length",10}]'
    assert ctl_format.format_value("arguments", {"x-dead-letter-exchange": "dlx", "x-q": True}) == \
        '[{"x-dead-letter-exchange","dlx"},{"x-q",true}]'
    assert ctl_format.format_value("tags", ["administrator", "monitoring"]) == "[administrator, monitoring]"
    assert ctl_format.format_value("tags", []) == "[]"
    assert ctl_format.format_value("policy", None) == ""
    assert ctl_format.format_value("definition", {"max-length": 2, "dead-letter-exchange": "d"}) == \
        '{"dead-letter-exchange":"d","max-length":2}'


def test_list_queues_rows_and_table() -> None:
    rows = ctl_format.queue_rows(SNAPSHOT)
    assert ctl_format.table(("name", "messages"), rows) == ["name\tmessages", "q1\t1", "q2\t2", "ex\t0"]
    cols = ("name", "messages_ready", "messages_unacknowledged", "consumers", "durable",
            "auto_delete", "arguments", "exclusive", "state", "type", "policy")
    assert ctl_format.table(cols, rows)[2] == \
        "q2\t0\t2\t1\tfalse\tfalse\t[{\"x-max-length\",10}]\tfalse\trunning\tclassic\t"
    assert ctl_format.table(("name",), rows, headers=False) == ["q1", "q2", "ex"]


def test_the_policy_column_names_the_policy_that_applies() -> None:
    applied = {"queue": {"q2": ["cap", None, {"max-length": 3}], "q1": [None, "op", {"expires": 9}]},
               "exchange": {"ex1": ["ae", None, {"alternate-exchange": "ae2"}]}}
    snapshot = {**SNAPSHOT, "policies": {"policies": [], "operator_policies": [], "applied": applied}}
    assert ctl_format.table(("name", "policy"), ctl_format.queue_rows(snapshot), headers=False) == \
        ["q1\t", "q2\tcap", "ex\t"]
    assert ctl_format.table(("name", "policy"), ctl_format.exchange_rows(snapshot), headers=False) == \
        ["\t", "amq.topic\t", "ex1\tae"]


def test_json_formatter_is_one_object_a_line() -> None:
    rows = ctl_format.queue_rows(SNAPSHOT)[:2]
    text = ctl_format.json_rows(("name", "messages"), rows)
    assert text == '[\n{"name":"q1","messages":1}\n,{"name":"q2","messages":2}\n]'
    assert ctl_format.json_rows(("name",), []) == "[\n]"
    args = ctl_format.json_rows(("arguments",), ctl_format.queue_rows(SNAPSHOT)[1:2])
    assert json.loads(args) == [{"arguments": [["x-max-length", "signedint", 10]]}]


def test_bindings_list_the_default_exchange_first() -> None:
    lines = ctl_format.table(ctl_format.DEFAULTS["bindings"], ctl_format.binding_rows(SNAPSHOT))
    assert lines[0] == "source_name\tsource_kind\tdestination_name\tdestination_kind\trouting_key\targuments"
    assert lines[1] == "\texchange\tq1\tqueue\tq1\t[]"
    assert lines[-1] == "ex1\texchange\tex\tqueue\tk\t[]"


def test_connections_channels_consumers_users() -> None:
    conns = [{"worker": 0, "conn": 3, "peer": "127.0.0.1:5000", "name": "127.0.0.1:5000 -> 127.0.0.1:5672",
              "user": "guest", "vhost": "/", "state": "running", "channels": 1}]
    rows = ctl_format.connection_rows(conns)
    assert ctl_format.table(ctl_format.DEFAULTS["connections"], rows)[1] == "guest\t127.0.0.1\t5000\trunning"
    channels = ctl_format.channel_rows(SNAPSHOT, conns)
    assert ctl_format.table(ctl_format.DEFAULTS["channels"], channels)[1] == "<shoal.0.3.1>\tguest\t1\t2"
    consumers = ctl_format.table(ctl_format.DEFAULTS["consumers"], ctl_format.consumer_rows(SNAPSHOT))
    assert consumers[1] == "q2\t<shoal.0.3.1>\tctag1\ttrue\t\ttrue\t[]"
    assert ctl_format.table(ctl_format.USER_COLUMNS, ctl_format.user_rows(USERS)) == \
        ["user\ttags", "guest\t[administrator]", "u1\t[]"]


def test_export_leaves_out_what_rabbitmq_leaves_out() -> None:
    out = ctl_format.export_definitions(SNAPSHOT, USERS, "1.0")
    assert [q["name"] for q in out["queues"]] == ["q1", "q2"]  # not the exclusive one
    assert [x["name"] for x in out["exchanges"]] == ["ex1"]
    assert out["bindings"] == [{"arguments": {}, "destination": "q1", "destination_type": "queue",
                                "routing_key": "a.#", "source": "ex1", "vhost": "/"}]
    assert out["users"][1] == {"hashing_algorithm": "rabbit_password_hashing_sha256", "limits": {},
                               "name": "u1", "password_hash": "h1", "tags": []}
    assert out["permissions"][0] == {"configure": ".*", "read": ".*", "user": "guest", "vhost": "/",
                                     "write": ".*"}


def _run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(ctl.ctl, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Control requests are recorded and answered from SNAPSHOT and USERS."""
    sent: list[dict[str, object]] = []

    def ask(path: str, request: dict[str, object], timeout: float = 10.0) -> dict[str, object]:
        sent.append(request)
        command = request["command"]
        if command == "snapshot":
            return SNAPSHOT
        if command == "list_users":
            return {"users": USERS}
        if command == "list_permissions":
            return {"permissions": [{"user": u["name"], "vhost": "/", "configure": ".*", "write": ".*",
                                     "read": ".*"} for u in USERS]}
        if command == "add_user" and request["name"] == "guest":
            return {"error": 'User "guest" already exists', "code": "exists"}
        if command in ("delete_user", "change_password") and request["name"] == "nobody":
            return {"error": 'User "nobody" does not exist', "code": "missing"}
        return {"name": request.get("name"), "tags": [], "password_hash": "x"}

    monkeypatch.setattr(ctl_group, "ask", ask)
    return sent


def test_verbs_print_rabbitmqctls_lines(answers: list[dict[str, object]]) -> None:
    code, out, _ = _run("--control-socket", "/x", "list_queues")
    assert code == 0 and out.splitlines()[:3] == ["Timeout: 60.0 seconds ...",
                                                  "Listing queues for vhost / ...", "name\tmessages"]
    code, out, _ = _run("list_queues", "-q", "name,durable")  # options after the verb, comma columns
    assert out.splitlines()[:2] == ["name\tdurable", "q1\ttrue"]
    code, out, _ = _run("-s", "list_users")
    assert out.splitlines() == ["guest\t[administrator]", "u1\t[]"]
    code, out, _ = _run("list_exchanges", "--formatter", "json")
    assert json.loads(out)[2] == {"name": "ex1", "type": "topic"}
    code, out, _ = _run("list_permissions")
    assert out.splitlines() == ['Listing permissions for vhost "/" ...', "user\tconfigure\twrite\tread",
                                "guest\t.*\t.*\t.*", "u1\t.*\t.*\t.*"]


def test_users_verbs_and_their_exit_codes(answers: list[dict[str, object]]) -> None:
    code, out, err = _run("add_user", "guest", "pw")
    assert code == 70 and out == 'Adding user "guest" ...\n' and err == 'Error:\nUser "guest" already exists\n'
    code, _, err = _run("delete_user", "nobody")
    assert code == 67 and 'User "nobody" does not exist' in err
    code, out, _ = _run("add_user", "carol", input="s3cret\n")  # the password from stdin
    assert code == 0 and answers[-1] == {"command": "add_user", "name": "carol", "password": "s3cret"}
    code, _, err = _run("add_user", "dave", input="")
    assert code == 65 and "Password is not provided via argument or stdin" in err
    code, out, _ = _run("set_user_tags", "u1", "administrator", "monitoring")
    assert out == 'Setting tags for user "u1" to [administrator, monitoring] ...\n'
    assert answers[-1]["tags"] == ["administrator", "monitoring"]


def test_unknown_unsupported_and_bad_columns() -> None:
    code, _, err = _run("foo")
    assert code == 64 and err.startswith("Command 'foo' not found.")
    code, _, err = _run("restart_vhost", "v2")
    assert code == 69 and err == "restart_vhost: not supported by this Shoal yet\n"
    code, _, err = _run("list_queues", "nosuch")
    assert code == 64 and "Info key(s) nosuch are not supported" in err


def test_no_broker_is_unavailable(tmp_path: object) -> None:
    code, _, err = _run("--control-socket", "/nonexistent/shoal.sock", "list_users")
    assert code == 69 and "unable to perform an operation" in err
