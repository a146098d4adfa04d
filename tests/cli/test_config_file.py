"""`shoal serve --config FILE`: RabbitMQ's rabbitmq.conf, read by cli.config_file and handed to
`shoal serve`'s options as their defaults. Nothing is started."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli.main as cli_main
from cli.config_file import NOT_YET, ConfigFileError, parse

SERVE_OPTIONS = {p.name for p in cli_main.serve.params if p.name}


def _values(text: str, options: set[str] = SERVE_OPTIONS) -> dict[str, object]:
    return {name: setting.value for name, setting in parse(text, "rabbitmq.conf", options).items()}


def _refused(text: str, options: set[str] = SERVE_OPTIONS) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as caught:
        parse(text, "rabbitmq.conf", options)
    return caught.value


@pytest.mark.parametrize(("text", "values"), [
    ("listeners.tcp.default = 5673", {"port": 5673}),
    ("listeners.tcp.default = 0.0.0.0:5674", {"host": "0.0.0.0", "port": 5674}),
    ("listeners.tcp.local = 127.0.0.1:5675", {"host": "127.0.0.1", "port": 5675}),
    ("default_user = alice\ndefault_pass = pw", {"users": {"alice": "pw"}}),
    ("default_pass = pw", {"users": {"guest": "pw"}}),
    ("default_user = alice", {"users": {"alice": "guest"}}),
    ("default_vhost = /", {"default_vhost": "/"}),
    ("default_vhost = app", {"default_vhost": "app"}),
    ("default_permissions.read = ^amq\\.\ndefault_permissions.configure = ^$",
     {"default_permissions": ("^$", ".*", "^amq\\.")}),
    ("loopback_users = none", {"loopback_users": frozenset()}),
    ("loopback_users.guest = false", {"loopback_users": frozenset()}),
    ("loopback_users.admin = true", {"loopback_users": frozenset({"admin"})}),
    ("loopback_users.guest = true\nloopback_users.admin = true",
     {"loopback_users": frozenset({"guest", "admin"})}),
    ("vm_memory_high_watermark.absolute = 200MB", {"memory_high_watermark": 200_000_000}),
    ("vm_memory_high_watermark.absolute = 1GiB", {"memory_high_watermark": 1 << 30}),
    ("vm_memory_high_watermark.relative = 0.4", {"memory_high_watermark": 0.4}),
    ("vm_memory_high_watermark_paging_ratio = 0.75", {"memory_paging_ratio": 0.75}),
    ("disk_free_limit.absolute = 2GB", {"disk_free_limit": 2_000_000_000}),
    ("heartbeat = 30", {"heartbeat": 30}),
    ("frame_max = 131072", {"frame_max": 131072}),
    ("frame_max = 64KB", {"frame_max": 64 << 10}),
    ("channel_max = 100", {"channel_max": 100}),
    ("channel_max = 0", {"channel_max": 65535}),
    ("max_message_size = 134217728", {"max_message_size": 128 << 20}),
    ("max_message_size = 64MiB", {"max_message_size": 64 << 20}),
    ("log.console.level = debug", {"log_level": "debug"}),
    ("log.console.level = notice", {"log_level": "info"}),
    ("log.console.level = critical", {"log_level": "critical"}),
    ("log.console.level = none", {"log_level": "critical"}),
    ("log.console = true\nlog.console.level = error", {"log_level": "error"}),
    ("log.console.level = debug\nlog.console = false", {"log_level": "critical"}),
    ("log.file = false", {}),
])
def test_each_key_sets_its_option(text: str, values: dict[str, object]) -> None:
    """Each rabbitmq.conf key Shoal knows sets one `shoal serve` option, typed."""
    assert _values(text) == values


def test_comments_blank_lines_and_spacing() -> None:
    """cuttlefish: `#` starts a comment anywhere on a line; blank lines and spaces around '='
    do not count; a key given twice takes its last value."""
    text = "# a rabbitmq.conf\n\n   heartbeat=10   # ten seconds\n#heartbeat = 99\nheartbeat = 20\n\t\n"
    settings = parse(text, "f.conf", SERVE_OPTIONS)
    assert settings["heartbeat"].value == 20
    assert (settings["heartbeat"].key, settings["heartbeat"].line) == ("heartbeat", 5)


@pytest.mark.parametrize(("text", "line", "key", "reason"), [
    ("heartbeat = 1\nfoo.bar = 1", 2, "foo.bar", "unknown key"),
    ("heartbeat", 1, "heartbeat", "expected KEY = VALUE"),
    ("heartbeat =", 1, "heartbeat", "no value"),
    ("heartbeat = soon", 1, "heartbeat", "expected a whole number"),
    ("listeners.tcp.default = 5672\nlisteners.tcp.local = 127.0.0.1:5673", 2,
     "listeners.tcp.local", "a second tcp listener: Shoal has one"),
    ("listeners.tcp = none", 1, "listeners.tcp", "always has its one AMQP listener"),
    ("listeners.tcp.default = [::1]:5672", 1, "listeners.tcp.default", "IPv4 only"),
    ("listeners.tcp.default = ::1:5672", 1, "listeners.tcp.default", "IPv4 only"),
    ("listeners.tcp.default = localhost:5672", 1, "listeners.tcp.default", "not an IP address"),
    ("listeners.tcp.default = 99999", 1, "listeners.tcp.default", "over 65535"),
    ("default_user = a:b", 1, "default_user", "cannot hold ':'"),
    ("loopback_users = all", 1, "loopback_users", "expected none"),
    ("loopback_users.guest = yes", 1, "loopback_users.guest", "expected true or false"),
    ("vm_memory_high_watermark.relative = 1.5", 1, "vm_memory_high_watermark.relative",
     "at most 1"),
    ("vm_memory_high_watermark.absolute = 0", 1, "vm_memory_high_watermark.absolute",
     "block every publisher"),
    ("vm_memory_high_watermark.absolute = 2PB", 1, "vm_memory_high_watermark.absolute",
     "expected bytes"),
    ("vm_memory_high_watermark_paging_ratio = 2", 1, "vm_memory_high_watermark_paging_ratio",
     "expected 0 to 1"),
    ("disk_free_limit.relative = 1.5", 1, "disk_free_limit.relative", "not supported"),
    ("frame_max = 1.5MB", 1, "frame_max", "expected bytes"),
    ("log.console.level = loud", 1, "log.console.level", "expected one of"),
    ("log.console = maybe", 1, "log.console", "expected true or false"),
    ("log.file = /var/log/rabbitmq/rabbit.log", 1, "log.file", "stderr only"),
    ("log.file.level = info", 1, "log.file.level", "stderr only"),
])
def test_what_shoal_cannot_take_is_refused_with_file_and_line(
        text: str, line: int, key: str, reason: str) -> None:
    """An unknown key or a value Shoal cannot take: FILE:LINE: key: one-line reason."""
    error = _refused(text)
    assert (error.line, error.key) == (line, key)
    assert reason in error.reason
    assert str(error).startswith(f"rabbitmq.conf:{line}: {key}: ")
    assert "\n" not in str(error)


def test_a_refused_password_is_never_echoed() -> None:
    error = _refused("default_pass = hunter2\nno_such_key = 1")
    assert "hunter2" not in str(error)


@pytest.mark.parametrize(("key", "option"), [
    ("management.tcp.port", "management_port"), ("management.tcp.ip", "management_host"),
    ("prometheus.tcp.port", "prometheus_port"), ("load_definitions", "load_definitions"),
    ("ssl_options.depth", "ssl_depth"),
])
def test_features_being_built_map_only_onto_an_option_serve_has(key: str, option: str) -> None:
    """A key for a feature `shoal serve` may lack maps onto its option when there is one, and
    is refused as not supported yet when there is none."""
    assert _values(f"{key} = 15999", {option}) == {option: "15999"}
    assert NOT_YET in _refused(f"{key} = 15999", set()).reason


def test_tls_keys_map_onto_the_tls_options() -> None:
    """listeners.ssl.default and ssl_options.* set `shoal serve --tls-*` (issue 37)."""
    conf = ("listeners.ssl.default = 5671\nssl_options.certfile = /c.pem\n"
            "ssl_options.keyfile = /k.pem\nssl_options.cacertfile = /ca.pem\n"
            "ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n")
    assert _values(conf, set()) == {
        "tls_port": 5671, "tls_cert": "/c.pem", "tls_key": "/k.pem", "tls_ca": "/ca.pem",
        "tls_verify_peer": True, "tls_fail_if_no_peer_cert": True}
    assert _values("listeners.ssl.default = 0.0.0.0:5671", set()) == {
        "tls_port": 5671, "host": "0.0.0.0"}
    assert "AMQP listener's address" in _refused(
        "listeners.tcp.default = 127.0.0.1:5672\nlisteners.ssl.default = 0.0.0.0:5671").reason
    assert "verify_peer or verify_none" in _refused("ssl_options.verify = yes").reason


# ---- through `shoal serve`


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf: str, *args: str,
           mode: int = 0o600) -> tuple[int, str, dict[str, object]]:
    """`shoal serve --config FILE ARGS`: its exit code, its output and the options it would hand
    the supervisor (nothing is started)."""
    seen: dict[str, object] = {}

    def fake_run(config: object) -> int:
        seen.update(dataclasses.asdict(config))  # type: ignore[call-overload]
        return 0

    monkeypatch.setattr(cli_main, "run", fake_run)
    monkeypatch.delenv("SHOAL_USERS", raising=False)
    path = tmp_path / "rabbitmq.conf"
    path.write_text(conf)
    os.chmod(path, mode)
    result = CliRunner().invoke(
        cli_main.main, ["serve", "--data-dir", str(tmp_path / "data"), "--config", str(path), *args])
    return result.exit_code, result.output, seen


CONF = """\
listeners.tcp.default = 127.0.0.2:5999
default_user = alice
default_pass = s3cret
heartbeat = 30
loopback_users.guest = false
vm_memory_high_watermark.relative = 0.5
"""


def test_the_file_sets_serves_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, seen = _serve(tmp_path, monkeypatch, CONF, "--arena-mb", "64")
    assert code == 0, output
    assert (seen["host"], seen["port"], seen["heartbeat"]) == ("127.0.0.2", 5999, 30)
    assert seen["users"] == {"alice": "s3cret"}
    assert seen["loopback_users"] == frozenset()
    assert seen["memory_high_watermark"] == 32 << 20  # relative: of --arena-mb
    assert "warning" not in output  # no --user on the command line, the file is 0600


def test_management_ssl_keys_set_the_management_tls_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """management.ssl.port/certfile/keyfile/cacertfile set `shoal serve --management-tls-*`."""
    conf = ("management.ssl.port = 15671\nmanagement.ssl.certfile = /c.pem\n"
            "management.ssl.keyfile = /k.pem\nmanagement.ssl.cacertfile = /ca.pem\n")
    code, output, seen = _serve(tmp_path, monkeypatch, conf)
    assert code == 0, output
    assert (seen["management_tls_port"], seen["management_tls_cert"], seen["management_tls_key"],
            seen["management_tls_ca"]) == (15671, "/c.pem", "/k.pem", "/ca.pem")


def test_the_command_line_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, seen = _serve(tmp_path, monkeypatch, CONF, "--port", "6000", "--heartbeat", "5",
                                "--loopback-users", "guest,bob")
    assert code == 0, output
    assert (seen["host"], seen["port"], seen["heartbeat"]) == ("127.0.0.2", 6000, 5)
    assert seen["loopback_users"] == frozenset({"guest", "bob"})


def test_shoal_users_wins_over_default_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SHOAL_USERS, as an option from the environment, wins over the file's default_user."""
    seen: dict[str, object] = {}
    monkeypatch.setattr(cli_main, "run", lambda config: seen.update(dataclasses.asdict(config)) or 0)
    path = tmp_path / "rabbitmq.conf"
    path.write_text(CONF)
    result = CliRunner().invoke(cli_main.main, ["serve", "--data-dir", str(tmp_path), "--config",
                                                str(path)], env={"SHOAL_USERS": "svc:pw"})
    assert result.exit_code == 0, result.output
    assert seen["users"] == {"svc": "pw"}


def test_shoal_config_file_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(cli_main, "run", lambda config: seen.update(dataclasses.asdict(config)) or 0)
    path = tmp_path / "rabbitmq.conf"
    path.write_text("heartbeat = 7\n")
    result = CliRunner().invoke(cli_main.main, ["serve", "--data-dir", str(tmp_path)],
                                env={"SHOAL_CONFIG_FILE": str(path), "SHOAL_USERS": None})
    assert result.exit_code == 0, result.output
    assert seen["heartbeat"] == 7


def test_without_a_file_the_defaults_stand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, seen = _serve(tmp_path, monkeypatch, "# nothing\n")
    assert code == 0, output
    assert (seen["port"], seen["heartbeat"], seen["loopback_users"]) == (5672, 60, frozenset({"guest"}))


@pytest.mark.parametrize(("conf", "message"), [
    ("heartbeat = 10\nnot_a_key = 1\n", ":2: not_a_key: unknown key"),
    ("heartbeat = 70000\n", ":1: heartbeat: 70000 is not in the range"),
    ("frame_max = 1024\n", ":1: frame_max: 1024 is not in the range"),
    ("max_message_size = 1GB\n", ":1: max_message_size: 1000000000 is 1000000000 bytes; expected 1"),
    ("log.file = /tmp/x.log\n", ":1: log.file: Shoal logs to stderr only"),
])
def test_a_bad_file_stops_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    conf: str, message: str) -> None:
    """An unknown key, or a value the option refuses (its own range): one line, exit code 1,
    no traceback, nothing started."""
    code, output, seen = _serve(tmp_path, monkeypatch, conf)
    assert code == 1
    assert output.startswith(f"{tmp_path / 'rabbitmq.conf'}{message}")
    assert len(output.splitlines()) == 1 and "Traceback" not in output
    assert seen == {}


def test_a_password_in_a_file_others_may_read_gets_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, _ = _serve(tmp_path, monkeypatch, CONF, mode=0o644)
    assert code == 0
    assert "holds default_pass and is readable by other users" in output
    assert "s3cret" not in output


def test_default_vhost_sets_serves_default_vhost(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """default_vhost = app becomes `shoal serve --default-vhost app`; an empty name is refused."""
    code, output, seen = _serve(tmp_path, monkeypatch, "default_vhost = app\n")
    assert code == 0, output
    assert seen["default_vhost"] == "app"
    code, output, _ = _serve(tmp_path, monkeypatch, "", "--default-vhost", "")
    assert code == 2 and "non-empty name" in output


def test_default_permissions_set_serves_default_permissions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """default_permissions.* (each .* unless given) become --default-permissions; a key that is
    no regular expression stops the start with FILE:LINE: key."""
    code, output, seen = _serve(tmp_path, monkeypatch, "default_permissions.write = ^w\n")
    assert code == 0, output
    assert seen["default_permissions"] == (".*", "^w", ".*")
    code, output, _ = _serve(tmp_path, monkeypatch, "heartbeat = 5\ndefault_permissions.read = (\n")
    assert code == 1 and ":2: default_permissions: " in output and "not a regular expression" in output
