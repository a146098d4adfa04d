"""ipc.huge_pages and ipc/huge_arenas.c: pymalloc's arenas carved from one region on huge pages.

The allocator is installed in a child process (a process installs it once, before its imports),
which reports what it saw as JSON; the environment and THP-mode helpers are pure."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ipc import huge_pages
from ipc.huge_pages import LIBRARY, thp_setting, tunable_env

ROOT = Path(__file__).resolve().parents[2]
needs_library = pytest.mark.skipif(not LIBRARY.exists(), reason=f"{LIBRARY} not built (make arenas)")


def run_child(code: str, prelude: str = "", **env: str) -> dict[str, object]:
    script = "import json, sys\nfrom ipc import huge_pages\n" + prelude + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def region_huge_kib() -> str:
    """Child code: the AnonHugePages of the mappings the region's arenas live in."""
    return textwrap.dedent("""
        def region_huge_kib(address):
            huge, inside = 0, False
            for line in open("/proc/self/smaps"):
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1])
            return huge
    """)


@needs_library
def test_objects_live_in_the_region_survive_reuse_and_overflow_to_plain_mmaps() -> None:
    seen = run_child(prelude=region_huge_kib(), code="""
        early = [str(i) * 3 for i in range(50_000)]  # arenas from before the switch
        said = huge_pages.install(reserve=32 << 20)
        again = huge_pages.install()
        del early  # their arenas are unmapped as CPython's own allocator does
        keep = [{"k": i, "v": str(i)} for i in range(100_000)]
        used = huge_pages.arenas_used()
        first = id(keep[-1])
        lib = huge_pages._library
        huge = region_huge_kib(first)
        del keep
        import gc; gc.collect()
        freed = int(lib.huge_arenas_free_count())
        more = [[i, str(i), (i,)] for i in range(400_000)]  # past the 32 MiB reserve
        ok = all(m[1] == str(m[0]) for m in more) and more[123_456][2] == (123_456,)
        print(json.dumps({"said": said, "again": again, "used": used, "huge": huge,
                          "freed": freed, "full": huge_pages.arenas_used(), "ok": ok}))
    """)
    assert seen["said"] == "on" and seen["again"] == "on"
    assert 0 < int(seen["used"]) <= 32 << 20  # type: ignore[call-overload]
    assert int(seen["freed"]) > 0  # type: ignore[call-overload]  # freed arenas kept for reuse
    assert seen["full"] == 32 << 20 and seen["ok"] is True  # then plain mmaps, objects intact
    if thp_setting() in ("madvise", "always"):
        assert int(seen["huge"]) > 0  # type: ignore[call-overload]  # 2 MiB pages under them


@needs_library
def test_small_pages_variable_leaves_the_allocator_alone() -> None:
    seen = run_child("""
        print(json.dumps({"said": huge_pages.install(), "used": huge_pages.arenas_used()}))
    """, SHOAL_SMALL_PAGES="1")
    assert seen == {"said": "off (SHOAL_SMALL_PAGES is set)", "used": 0}


def test_without_the_library_the_process_runs_as_before(tmp_path: Path) -> None:
    seen = run_child(f"""
        from pathlib import Path
        said = huge_pages.install(library=Path({str(tmp_path / 'missing.so')!r}))
        data = [str(i) for i in range(100_000)]
        print(json.dumps({{"said": said, "used": huge_pages.arenas_used(), "n": len(data)}}))
    """)
    assert str(seen["said"]).startswith("off (missing.so is not built")
    assert seen["used"] == 0 and seen["n"] == 100_000


def test_the_tunable_is_added_once_and_other_tunables_kept() -> None:
    assert tunable_env({"PATH": "/bin"}) == {"PATH": "/bin",
                                            "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = tunable_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"})
    assert env is not None
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert tunable_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None  # no second exec
    assert tunable_env({"SHOAL_SMALL_PAGES": "1"}) is None


def test_start_again_execs_the_same_command_with_the_tunable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(huge_pages.os, "execve", lambda *a: calls.append(a))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SHOAL_SMALL_PAGES", raising=False)
    huge_pages.start_again_with_tunable()
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == [sys.executable, *sys.orig_argv[1:]]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    huge_pages.start_again_with_tunable()
    assert len(calls) == 1


def test_a_failed_exec_leaves_the_process_running_as_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError("exec refused")

    monkeypatch.setattr(huge_pages.os, "execve", refuse)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SHOAL_SMALL_PAGES", raising=False)
    huge_pages.start_again_with_tunable()  # returns: the caller serves on
    assert "GLIBC_TUNABLES" not in huge_pages.os.environ


@pytest.mark.parametrize(("text", "mode"), [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"), ("garbled\n", "")])
def test_the_kernels_mode_is_the_bracketed_word(tmp_path: Path, text: str, mode: str) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_setting(str(path)) == mode
    assert thp_setting(str(tmp_path / "missing")) == ""
