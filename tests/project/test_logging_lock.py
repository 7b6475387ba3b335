"""The suite's watch on logging's module lock (tests/support/logging_lock.py): who holds it is
told, a stuck evaluator's report names the holder first, and a lock the main thread left held
is freed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading

import logging_lock
import paths
from harness import where_threads_are

from arbiter.client.deadline_guard import logging_locks_held, release_logging_locks


def test_the_holder_of_the_lock_is_named_and_its_stack_comes_first():
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with logging._lock:  # type: ignore[attr-defined]
            taken.set()
            done.wait(10)

    holder = threading.Thread(target=hold, name="holder", daemon=True)
    holder.start()
    try:
        assert taken.wait(10)
        assert logging_lock.owner() == holder.ident
        assert "held by thread 'holder'" in logging_lock.describe_owner()
        report = where_threads_are()
        assert report.startswith("logging's module lock is held by thread 'holder'")
        first_stack = report.split("\nthread ", 1)[1]
        assert first_stack.startswith("holder:") and "in hold" in first_stack.split("\nthread ", 1)[0]
    finally:
        done.set()
        holder.join(10)
    assert not holder.is_alive()


def test_a_lock_held_by_a_thread_that_ended_says_so():
    # An RLock left held by a thread that ended stays held: nothing else can take it.
    left_held = threading.RLock()
    saved, logging._lock = logging._lock, left_held  # type: ignore[attr-defined]
    try:
        ended = threading.Thread(target=left_held.acquire)
        ended.start()
        ended.join(10)
        assert logging_lock.owner() == ended.ident
        assert "held by a thread that has ended" in logging_lock.describe_owner()
    finally:
        logging._lock = saved  # type: ignore[attr-defined]


def test_a_lock_the_main_thread_left_held_is_released_as_often_as_it_was_taken():
    assert logging_locks_held() == []
    logging._lock.acquire()  # type: ignore[attr-defined]
    logging._lock.acquire()  # type: ignore[attr-defined]
    assert logging_locks_held() == [logging._lock] and logging_lock.owner() == threading.get_ident()  # type: ignore[attr-defined]
    assert release_logging_locks() == 2
    assert logging_locks_held() == []


LEAKING_TESTS = """
import logging, threading

def test_leaves_the_lock_held():
    logging._lock.acquire()  # as an exception raised between its acquire and its try would

def test_after_it_a_thread_logs():
    logging.getLogger("after").setLevel(logging.INFO)  # a level check that takes the lock
    thread = threading.Thread(target=logging.getLogger("after").info, args=("logged",))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
"""


def test_the_suite_fails_the_test_that_left_the_lock_held_and_the_next_one_runs(tmp_path):
    (tmp_path / "test_leak.py").write_text(textwrap.dedent(LEAKING_TESTS))
    tests = str(paths.REPO / "tests")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.path.join(tests, "support")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir", str(tmp_path),
         "-o", "timeout=60", str(tmp_path / "test_leak.py")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert "ERROR" in said and "test_leaves_the_lock_held" in said, said
    assert "left logging's locks held by the main thread (1 times); freed" in said, said
    assert "2 passed, 1 error" in said, said
