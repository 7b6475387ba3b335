"""Tests marked ``alone`` run while no other test runs, when the suite runs on several workers
(pytest-xdist, one per CPU by default): their verdicts depend on how promptly the machine runs a
process (sub-second budgets, the instant a command lands, a poller's CPU), or on a resource the
whole machine shares (port 6379), which a test on another worker would disturb. Every other test
runs beside one on the other workers.

The workers of one run share a readers-writer lock over a file: every test holds it while it runs
(its fixtures' setup and teardown included), shared, and an ``alone`` test holds it exclusively.
``flock`` alone would let the shared holders starve a test waiting for the exclusive hold (one of
them always takes it again before the others have let go), so each test first passes a turnstile:
a test waiting for the exclusive hold keeps the turnstile, and no test starts until it has run.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

MARKER = "alone"
# The key under which the run's controller hands its workers the lock's folder.
FOLDER_KEY = "arbiter_alone_folder"
TURNSTILE = "turnstile.lock"
RUNNING = "running.lock"


@contextlib.contextmanager
def holding(folder: Path, alone: bool) -> Iterator[None]:
    """Hold the run's lock in ``folder`` (shared by its workers) while the block runs: exclusively
    if ``alone``, else shared."""
    with open(folder / TURNSTILE, "a") as turnstile, open(folder / RUNNING, "a") as running:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(running, fcntl.LOCK_UN)
