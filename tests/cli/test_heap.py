"""cli.heap: the environment `shoal serve --huge-pages` starts itself again with, and the option's
refusals (nothing is started; tests/integration/test_huge_pages.py runs a broker with it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import cli.heap as heap
import cli.main as cli_main
from cli.heap import huge_pages_env, thp_setting


def test_an_environment_without_them_gets_both_settings() -> None:
    env = huge_pages_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "PYTHONMALLOC": "malloc",
                   "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def test_other_glibc_tunables_are_kept_and_an_old_hugetlb_value_replaced() -> None:
    env = huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"})
    assert env is not None
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert env["PYTHONMALLOC"] == "malloc"


def test_a_process_that_has_both_is_not_started_again() -> None:
    assert huge_pages_env({"PYTHONMALLOC": "malloc",
                           "GLIBC_TUNABLES": "glibc.mem.tagging=0:glibc.malloc.hugetlb=1"}) is None
    assert huge_pages_env({"PYTHONMALLOC": "malloc"}) is not None  # the tunable missing


def test_another_python_allocator_is_refused_not_overridden() -> None:
    with pytest.raises(ValueError, match="PYTHONMALLOC is 'debug'"):
        huge_pages_env({"PYTHONMALLOC": "debug"})


def test_serve_says_so_and_exits_1_when_pythonmalloc_is_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(cli_main, "run", started.append)
    monkeypatch.setattr(heap.os, "execve", lambda *a: started.append(a))
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc_debug")
    result = CliRunner().invoke(cli_main.main, ["serve", "--data-dir", "/nonexistent-shoal",
                                                "--huge-pages"])
    assert result.exit_code == 1 and "PYTHONMALLOC is 'pymalloc_debug'" in result.output
    assert started == []


def test_serve_starts_itself_again_with_them_then_runs_with_the_kernels_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    execs: list[tuple[str, list[str], dict[str, str]]] = []
    configs: list[object] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        execs.append((path, argv, env))
        monkeypatch.setenv("PYTHONMALLOC", env["PYTHONMALLOC"])  # what the new process has
        monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])

    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(heap.os, "execve", execve)
    monkeypatch.setattr(cli_main, "run", lambda config: configs.append(config) or 0)
    monkeypatch.setattr(cli_main, "thp_setting", lambda: "madvise")
    args = ["serve", "--data-dir", "/nonexistent-shoal", "--huge-pages"]
    result = CliRunner().invoke(cli_main.main, args)
    assert result.exit_code == 0, result.output
    [(path, _, env)] = execs
    assert path == heap.sys.executable
    assert env["PYTHONMALLOC"] == "malloc" and env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    # the fake execve returned: serve went on as the new process would, and started no other
    [config] = configs
    assert config.huge_pages == "madvise"  # type: ignore[attr-defined]
    result = CliRunner().invoke(cli_main.main, args)  # now the environment has them
    assert result.exit_code == 0 and len(execs) == 1


def test_without_the_option_nothing_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap.os, "execve", lambda *a: pytest.fail("started again"))
    configs: list[object] = []
    monkeypatch.setattr(cli_main, "run", lambda config: configs.append(config) or 0)
    monkeypatch.delenv("SHOAL_HUGE_PAGES", raising=False)
    result = CliRunner().invoke(cli_main.main, ["serve", "--data-dir", "/nonexistent-shoal"])
    assert result.exit_code == 0, result.output
    assert configs[0].huge_pages == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "mode"), [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"), ("garbled\n", "")])
def test_the_kernels_mode_is_the_bracketed_word(tmp_path: Path, text: str, mode: str) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_setting(str(path)) == mode
    assert thp_setting(str(tmp_path / "missing")) == ""
