"""`shoal serve` option parsing that does not need a running broker."""

from __future__ import annotations

import click
import pytest

from cli.main import _parse_bytes


@pytest.mark.parametrize(("text", "value"), [
    ("50MB", 50_000_000), ("50mb", 50_000_000), ("2GiB", 2 << 30), ("512 KiB", 512 << 10),
    ("1000", 1000), ("0", 0), ("3kB", 3000), ("1GB", 1_000_000_000), ("7MiB", 7 << 20),
])
def test_disk_free_limit_takes_rabbitmqs_information_units(text: str, value: int) -> None:
    assert _parse_bytes(None, None, text) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "5TB", "5.5GB", "fifty"])
def test_disk_free_limit_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(click.BadParameter, match="expected bytes"):
        _parse_bytes(None, None, text)  # type: ignore[arg-type]
