"""The suite's workers and its ``alone`` tests (tests/support/alone.py): every test holds the run's
lock while it runs, shared, and an ``alone`` test holds it exclusively; a test waiting to run
alone goes before the tests that asked after it."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest
from alone import FOLDER_KEY, RUNNING, TURNSTILE, holding
from harness import wait_for


def the_runs_lock(request: pytest.FixtureRequest) -> Path:
    folder = getattr(request.config, "workerinput", {}).get(FOLDER_KEY)
    if folder is None:
        pytest.skip("the tests run one after the other here (-n 0): there is no lock to hold")
    return Path(folder) / RUNNING


def can_take(path: Path, how: int) -> bool:
    """Whether ``path``'s lock could be taken ``how`` now (taken and given back at once)."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, how | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def test_a_test_runs_holding_the_runs_lock_shared(request):
    running = the_runs_lock(request)
    assert can_take(running, fcntl.LOCK_SH)  # beside the tests of the other workers
    assert not can_take(running, fcntl.LOCK_EX)  # this test holds it


@pytest.mark.alone
def test_an_alone_test_runs_holding_it_exclusively(request):
    running = the_runs_lock(request)
    assert not can_take(running, fcntl.LOCK_SH)  # no other test may start meanwhile


def waiting_on(path: Path) -> int:
    """How many locks wait to be taken on ``path`` (the kernel's ``->`` lines of /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    with open("/proc/locks") as locks:
        return sum(1 for line in locks if "->" in line and inode in line)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="the kernel's list of locks is Linux's")
def test_a_test_waiting_to_run_alone_goes_before_the_tests_that_ask_after_it(tmp_path):
    order: list[str] = []
    release = {name: threading.Event() for name in ("first", "alone", "after")}

    def run(name: str, alone: bool) -> None:
        with holding(tmp_path, alone):
            order.append(name)
            release[name].wait(30)

    threads = {name: threading.Thread(target=run, args=(name, name == "alone"), daemon=True) for name in release}
    threads["first"].start()
    wait_for(lambda: order == ["first"], what="the first test to hold the lock")
    threads["alone"].start()  # waits for the first to finish, keeping the turnstile
    wait_for(lambda: waiting_on(tmp_path / RUNNING) == 1, what="the alone test to wait for the lock")
    threads["after"].start()  # a shared hold would be granted now; the turnstile makes it wait
    wait_for(lambda: waiting_on(tmp_path / TURNSTILE) == 1, what="the later test to wait at the turnstile")
    assert order == ["first"]

    release["first"].set()
    wait_for(lambda: len(order) == 2, what="the next test to run")
    assert order == ["first", "alone"]
    # The later test, let through the turnstile by the alone one, then waits for it to end.
    wait_for(lambda: waiting_on(tmp_path / RUNNING) == 1, what="the later test to wait for the alone one")
    assert order == ["first", "alone"]
    release["alone"].set()
    wait_for(lambda: len(order) == 3, what="the later test to run")
    assert order == ["first", "alone", "after"]
    release["after"].set()
    for thread in threads.values():
        thread.join(10)
        assert not thread.is_alive()
