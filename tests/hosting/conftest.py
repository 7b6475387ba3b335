"""Fixtures of the hosting tests."""

from collections.abc import Iterator

import pytest
from containers import podman_env  # noqa: F401 - the container tests' fixture
from hosting_farm import RUNNING_NOW, Workers


@pytest.fixture(autouse=True)
def no_workers_of_an_earlier_test() -> None:
    RUNNING_NOW.clear()


@pytest.fixture
def workers(redis_url, tmp_path) -> Iterator[Workers]:
    """`arbiter worker` processes on the session's Redis, writing under tmp_path/results; all
    killed at the end of the test."""
    started = Workers(redis_url, str(tmp_path / "results"))
    try:
        yield started
    finally:
        started.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failing test's report carries what its `arbiter worker` processes said and the last
    events of their evaluations: on CI, nothing else of them is kept."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for workers in RUNNING_NOW:
            report.sections.append(("arbiter workers", workers.story()))
