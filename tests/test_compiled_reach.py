"""The selection of the pure-Python pass (tests/compiled_reach.py): which test modules run
compiled code."""

from __future__ import annotations

from tests.compiled_reach import REPO_ROOT, compiled_modules, reaches_compiled, source_modules, why_it_reaches_compiled


def test_the_makefiles_compiled_list_names_modules_of_the_tree() -> None:
    """A module renamed or moved without the Makefile following would drop out of the selection."""
    compiled = compiled_modules()
    assert {"workers.codec", "workers.channel", "ipc.ring", "ipc.arena"} <= compiled
    assert compiled <= set(source_modules()), sorted(compiled - set(source_modules()))


def test_a_module_importing_a_compiled_one_reaches_it() -> None:
    assert why_it_reaches_compiled(REPO_ROOT / "tests/workers/test_codec.py") == "workers.codec"
    assert reaches_compiled(REPO_ROOT / "tests/ipc/test_compiled.py")


def test_a_module_reaches_what_its_helpers_and_conftests_import() -> None:
    """test_output_parts imports compiled modules through tests/workers/helpers.py."""
    assert reaches_compiled(REPO_ROOT / "tests/workers/test_output_parts.py")


def test_a_module_starting_a_broker_reaches_compiled_code_whatever_it_imports() -> None:
    why = why_it_reaches_compiled(REPO_ROOT / "tests/integration/test_heartbeat.py")
    assert why is not None and why.startswith("a broker started by"), why


def test_the_supervisors_domain_tests_reach_its_compiled_modules() -> None:
    """The supervisor's per-message modules (broker/runtime, broker/queues) are compiled too."""
    for name in ("test_vhost.py", "test_dispatch.py", "test_dead_letter.py", "test_standing_pulls.py"):
        why = why_it_reaches_compiled(REPO_ROOT / "tests/broker" / name)
        assert why is not None and why.startswith("broker."), name


def test_tests_of_modules_outside_the_hot_path_reach_none() -> None:
    """ipc/'s records and log files import neither a ring nor the supervisor's modules."""
    for name in ("test_records.py", "test_logfile.py"):
        assert why_it_reaches_compiled(REPO_ROOT / "tests/ipc" / name) is None, name


def test_a_file_outside_the_tree_counts_as_reaching() -> None:
    assert reaches_compiled(REPO_ROOT / "Makefile")
