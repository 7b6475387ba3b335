"""The test process forks children that stand for RQ's work-horses (tests/support/harness.py's
``in_forked_child``), sometimes after DIAMBRA's tests have had diambra-arena open a grpc channel
to an engine, which starts grpc's threads in the test process. Such a child must not run grpc's
threads: tests/conftest.py turns grpc's fork support off, which would start them again in it."""

from __future__ import annotations

import os
import time

import pytest

grpc = pytest.importorskip("grpc")  # diambra-arena's way to its engine

from harness import in_forked_child, wait_for  # noqa: E402

GRPC_THREADS = ("event_engine", "grpc_global_tim", "lifeguard")  # their names in /proc


def native_threads() -> list[str]:
    """The names of this process's threads, as the kernel knows them (grpc's are not Python's)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
            names.append(comm.read().strip())
    return sorted(names)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc to name threads")
def test_a_forked_child_of_the_test_process_runs_no_grpc_threads():
    channel = grpc.insecure_channel("127.0.0.1:1")  # as diambra-arena opens one to its engine
    try:
        # grpc runs here: its threads start with the channel, and a thread takes its name once it runs
        wait_for(lambda: any(name.startswith(GRPC_THREADS) for name in native_threads()), what="grpc's threads")

        def grpc_threads_a_moment_after_the_fork() -> list[str]:
            time.sleep(0.2)  # grpc's fork support starts its threads again at once after the fork
            return [name for name in native_threads() if name.startswith(GRPC_THREADS)]

        _, child_grpc_threads = in_forked_child(grpc_threads_a_moment_after_the_fork)
    finally:
        channel.close()
    assert child_grpc_threads == "[]"
