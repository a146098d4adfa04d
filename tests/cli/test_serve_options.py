"""`shoal serve` option parsing that does not need a running broker."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

import cli.main as cli_main
from cli.main import _parse_bytes, parse_size


@pytest.mark.parametrize(("text", "value"), [
    ("50MB", 50_000_000), ("50mb", 50_000_000), ("2GiB", 2 << 30), ("512 KiB", 512 << 10),
    ("1000", 1000), ("0", 0), ("3kB", 3000), ("1GB", 1_000_000_000), ("7MiB", 7 << 20),
])
def test_disk_free_limit_takes_rabbitmqs_information_units(text: str, value: int) -> None:
    assert _parse_bytes(None, None, text) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "5PB", "5.5GB", "fifty"])
def test_disk_free_limit_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(click.BadParameter, match="expected bytes"):
        _parse_bytes(None, None, text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "value"), [
    ("10TB", 10 * 1000**4), ("2tb", 2 * 1000**4), ("1TiB", 1 << 40), ("3k", 3 << 10),
    ("3K", 3 << 10), ("5M", 5 << 20), ("2G", 2 << 30), ("1T", 1 << 40), ("4mB", 4_000_000),
    ("128MiB", 128 << 20), ("64kib", 64 << 10),
])
def test_sizes_take_rabbitmqs_units_up_to_terabytes(text: str, value: int) -> None:
    """RabbitMQ's information units: kB/MB/GB/TB powers of 1000; KiB…TiB and k/M/G/T of 1024."""
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["5XB", "1PB", "5MB!", "0x10", "1e6", "MiB"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    """Anything but digits and one of RabbitMQ's units is refused, never guessed."""
    with pytest.raises(ValueError, match="expected bytes"):
        parse_size(text)


def _serve_config(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The options `shoal serve ARGS` would hand the supervisor (nothing is started)."""
    seen: dict[str, object] = {}

    def fake_run(config: object) -> int:
        seen.update(dataclasses.asdict(config))  # type: ignore[call-overload]
        return 0

    monkeypatch.setattr(cli_main, "run", fake_run)
    result = CliRunner().invoke(cli_main.main, ["serve", "--data-dir", "/nonexistent-shoal", *args])
    assert result.exit_code == 0, result.output
    return seen


def test_every_size_option_takes_rabbitmqs_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-message-size, the memory watermarks and --disk-free-limit all read kB…TB, KiB…TiB."""
    seen = _serve_config(["--max-message-size", "64MiB", "--memory-high-watermark", "200MB",
                          "--memory-low-watermark", "150M", "--disk-free-limit", "10TB"],
                         monkeypatch)
    assert seen["max_message_size"] == 64 << 20
    assert seen["memory_high_watermark"] == 200_000_000
    assert seen["memory_low_watermark"] == 150 << 20
    assert seen["disk_free_limit"] == 10 * 1000**4


def test_size_options_keep_their_defaults_and_raw_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the options the defaults stand; a plain number is still bytes."""
    seen = _serve_config([], monkeypatch)
    assert (seen["max_message_size"], seen["memory_high_watermark"],
            seen["memory_low_watermark"], seen["disk_free_limit"]) == (128 << 20, 0, 0, 50_000_000)
    seen = _serve_config(["--max-message-size", "1000", "--memory-high-watermark", "4096"],
                         monkeypatch)
    assert (seen["max_message_size"], seen["memory_high_watermark"]) == (1000, 4096)


@pytest.mark.parametrize("args", [["--max-message-size", "1GB"], ["--max-message-size", "0"],
                                  ["--memory-high-watermark", "5.5GB"],
                                  ["--memory-low-watermark", "-1"]])
def test_size_options_refuse_sizes_out_of_range(args: list[str]) -> None:
    """--max-message-size stays within 1 byte to 512 MiB (RabbitMQ's cap); no negative sizes."""
    result = CliRunner().invoke(cli_main.main, ["serve", *args])
    assert result.exit_code == 2
    assert "Invalid value" in result.output
