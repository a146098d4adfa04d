"""`shoal serve --prometheus-port/--prometheus-host`, and rabbitmq.conf's prometheus.tcp.* keys."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main as cli_main


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str,
           conf: str | None = None) -> dict[str, object]:
    seen: dict[str, object] = {}
    monkeypatch.setattr(cli_main, "run", lambda config: seen.update(dataclasses.asdict(config)) or 0)
    monkeypatch.delenv("SHOAL_USERS", raising=False)
    extra: list[str] = []
    if conf is not None:
        path = tmp_path / "rabbitmq.conf"
        path.write_text(conf)
        os.chmod(path, 0o600)
        extra = ["--config", str(path)]
    result = CliRunner().invoke(
        cli_main.main, ["serve", "--data-dir", str(tmp_path / "data"), *extra, *args])
    assert result.exit_code == 0, result.output
    return seen


def test_rabbitmqs_port_by_default_and_a_taken_default_is_no_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _serve(tmp_path, monkeypatch)
    assert (seen["prometheus_port"], seen["prometheus_host"]) == (15692, None)
    assert seen["prometheus_required"] is False
    seen = _serve(tmp_path, monkeypatch, "--prometheus-port", "0")
    assert seen["prometheus_port"] == 0


def test_the_config_files_prometheus_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _serve(tmp_path, monkeypatch,
                  conf="prometheus.tcp.port = 15999\nprometheus.tcp.ip = 127.0.0.3\n")
    assert (seen["prometheus_port"], seen["prometheus_host"]) == (15999, "127.0.0.3")
    assert seen["prometheus_required"] is True  # asked for: a port in use fails the start
