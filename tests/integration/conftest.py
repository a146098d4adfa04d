"""The integration tests' pytest hooks and fixtures; the helpers they use are in `harness.py`.

- Every test's call phase runs under a SIGALRM deadline (`@pytest.mark.deadline(seconds)`,
  default `harness.DEFAULT_DEADLINE`), so a broker that never answers a synchronous pika call
  fails the test instead of hanging the run. A test whose deadline is `SLOW_DEADLINE` or more
  is also marked `slow`: `make test` runs it, `-m 'not slow'` leaves it out.
- `broker` starts a fresh broker per test (for tests that kill processes or check shutdown),
  `shared_broker` reuses one per session and replaces it after any test on it fails, so one
  broken test cannot cascade into the next; `names` hands out unique entity names.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import (
    CALL_FAILED,
    DEFAULT_DEADLINE,
    Broker,
    deadline,
    finish,
    show_log_if_failed,
    start_broker,
)
from tests.integration.pika_helpers import Names

# Deadlines this long belong to the big-body, paging, persistence and bounded-step tests: minutes each.
SLOW_DEADLINE = 180.0
# Integration modules whose subject is not the hot path the compiled modules implement (the
# data directory, the management process, the links process, configuration, the CLI, logins,
# virtual hosts and limits, which the supervisor and the uncompiled connection methods keep): they are
# marked `compiled_only`, and make test's pure-Python pass leaves them out. The broker code they
# drive is the same in both passes; the protocol suites (clients, features, negative, fuzz, flow
# control, deliveries) run the pure fallback end to end.
COMPILED_ONLY = frozenset({
    "test_bounded_steps", "test_config_file", "test_corruption_definitions", "test_corruption_index",
    "test_ctl", "test_definitions_import", "test_disk_alarm", "test_durable_topology",
    "test_federation", "test_first_run", "test_limits", "test_load_generator", "test_management_api",
    "test_management_rabbitmqadmin", "test_management_stats", "test_management_tls",
    "test_management_ui", "test_paging", "test_password_hashes", "test_persistence", "test_policies",
    "test_process_failures", "test_remote_logins", "test_shovels", "test_slow_consumer", "test_users",
    "test_vhosts",
})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deadline(seconds): bound on an integration test's call phase "
        f"(default {DEFAULT_DEADLINE:g} s); past it the test fails with DeadlineExceeded",
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("deadline")
        if marker and float(marker.args[0]) >= SLOW_DEADLINE:
            item.add_marker("slow")
        if item.module is not None and item.module.__name__.rpartition(".")[2] in COMPILED_ONLY:
            item.add_marker("compiled_only")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("deadline")
    seconds = float(marker.args[0]) if marker else DEFAULT_DEADLINE
    with deadline(seconds, f"{item.name} (@pytest.mark.deadline)"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A fresh broker for this test alone; stopped and checked for leftovers afterwards."""
    instance = start_broker(tmp_path / "broker")
    try:
        yield instance
    finally:
        show_log_if_failed(request, instance)
        finish(instance)


class _SharedBrokers:
    def __init__(self, root: Path):
        self._root = root
        self._started = 0
        self.current: Broker | None = None

    def get(self) -> Broker:
        if self.current is None or not self.current.running():
            problems = self.discard()
            if problems:
                pytest.fail("the shared broker had died:\n" + "\n".join(problems), pytrace=False)
            self._started += 1
            self.current = start_broker(self._root / f"shared-{self._started}")
        return self.current

    def discard(self) -> list[str]:
        current, self.current = self.current, None
        return current.stop() if current else []


@pytest.fixture(scope="session")
def _shared_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SharedBrokers]:
    holder = _SharedBrokers(tmp_path_factory.mktemp("shared-broker"))
    yield holder
    problems = holder.discard()
    if problems:
        pytest.fail("shared broker did not shut down cleanly:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture
def shared_broker(_shared_brokers: _SharedBrokers, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The session's broker; the test's client connections are closed when it ends, and the
    broker is replaced after a failing test (so its state cannot leak into the next)."""
    instance = _shared_brokers.get()
    yield instance
    instance.close_clients()
    show_log_if_failed(request, instance)
    if request.node.stash.get(CALL_FAILED, False) or not instance.running():
        problems = _shared_brokers.discard()
        if problems:
            pytest.fail("shared broker did not shut down cleanly:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    return Names(request.node.name)
