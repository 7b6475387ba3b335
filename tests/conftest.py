"""Shared pytest fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from alone import FOLDER_KEY as ALONE_FOLDER
from alone import MARKER as ALONE
from alone import holding
from report_pages import CHROMIUM_INSTALL

from arbiter.client.deadline_guard import release_logging_locks
from arbiter.protocol.spin_wait import usable_cpus
from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port
from arbiter.server.cli.local_runs import RUNS_DIR_VARIABLE

# Evaluators run as threads of the test process here, next to their agents: the same short GIL
# switch interval as the `arbiter` command keeps their deadline checks as prompt as in production.
sys.setswitchinterval(0.001)
# DIAMBRA's in-process tests load grpc (diambra-arena talks to its engine through it), whose
# threads then run in the test process; tests that fork it (a work-horse, as RQ forks one) would
# get those threads started again in the child by grpc's fork support, a child that has no use
# for them and once died there. Set before grpc is imported: the children stay single-threaded,
# as a worker's are (an `arbiter worker` never loads grpc).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
# Every `arbiter run` the tests start announces itself in a folder of this process's, not in the
# developer's own runs folder, where `arbiter watch` would find them and where a run the tests
# kill would leave its announcement. Set before the test modules are imported: some copy the
# environment for their commands then.
RUNS_FOLDER = tempfile.mkdtemp(prefix="arbiter-test-runs-")
os.environ[RUNS_DIR_VARIABLE] = RUNS_FOLDER

# --- Workers: one per CPU, and the tests marked `alone` with nothing beside them --------------
# (tests/support/alone.py says why and how). The lock's folder is made by the run's controller
# and handed to its workers.


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per CPU this run may use (its affinity, a container's CPU quota),
    not per CPU the machine has."""
    return max(1, int(usable_cpus()))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # the controller, for each worker it starts
    config = node.config
    if not hasattr(config, ALONE_FOLDER):
        setattr(config, ALONE_FOLDER, tempfile.mkdtemp(prefix="arbiter-tests-"))
    node.workerinput[ALONE_FOLDER] = getattr(config, ALONE_FOLDER)


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, ALONE_FOLDER):  # the controller, once every worker has finished
        shutil.rmtree(getattr(config, ALONE_FOLDER), ignore_errors=True)
    shutil.rmtree(RUNS_FOLDER, ignore_errors=True)  # every process's own


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: the wait is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = getattr(item.config, "workerinput", {}).get(ALONE_FOLDER)
    if folder is None:  # the tests run one after the other anyway
        yield
        return
    with holding(Path(folder), alone=item.get_closest_marker(ALONE) is not None):
        yield


# --- Logging's lock: never left held by a test ------------------------------------------------


@pytest.fixture(autouse=True)
def logging_lock_left_free() -> Iterator[None]:
    """A test that leaves logging's locks held by the main thread (the module's, a handler's)
    fails here, by name, and they are freed: otherwise every evaluator thread of the tests after
    it would hang on its first log line (tests/support/logging_lock.py says how a lock gets left
    held)."""
    yield
    released = release_logging_locks()
    if released:
        pytest.fail(f"the test left logging's locks held by the main thread ({released} times); freed")


# --- Redis: one private redis-server for the whole session -----------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """A redis-server on a free port (never 6379, so a developer's own Redis is left alone)."""
    with EmbeddedRedis(port=free_port()) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
def redis_conn(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A client to the session's server; the database is flushed afterwards so tests don't share keys."""
    conn = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        yield conn
    finally:
        conn.flushdb()
        conn.close()


@pytest.fixture
def service_id() -> str:
    """A service id no other test uses, so queues and replies never cross between tests."""
    return "t-" + uuid.uuid4().hex[:12]


# --- Flatland test sets -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_tests(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 3-episode Flatland test folder (2 agents each), generated once per session."""
    from arbiter.server.formats.flatland.generate import generate_test_set

    folder = tmp_path_factory.mktemp("tiny") / "tests"
    generate_test_set(folder, preset="tiny", seed=1)
    return str(folder)


# --- a browser for the report's rendering tests --------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed here when missing and possible (root with apt-get)."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["bash", "-c", CHROMIUM_INSTALL], check=True, env=env, capture_output=True, timeout=900)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip(f"no chromium, and it cannot be installed here (as root: {CHROMIUM_INSTALL})")
    return found
