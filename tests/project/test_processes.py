"""The tests' own view of processes (tests/support/processes.py): a process that exits while it
is being looked at counts as gone, whichever error /proc gives for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from processes import alive, descendants


def test_a_live_process_is_alive_and_a_zombie_or_a_reaped_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert alive(child.pid)
        child.stdin.close()
        # Exited, not yet reaped: a zombie (waitid with WNOWAIT waits for the exit and reaps nothing).
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert Path(f"/proc/{child.pid}/stat").exists()
        assert not alive(child.pid)
    finally:
        child.wait()
    assert not alive(child.pid)


def test_an_exit_between_opening_and_reading_proc_counts_as_gone(monkeypatch) -> None:
    def exited_meanwhile(self, *args, **kwargs):
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(Path, "read_text", exited_meanwhile)
    assert not alive(1)
    assert descendants(1) == []


def test_descendants_are_found_through_every_generation() -> None:
    # The child starts a grandchild; both wait on the same stdin, so closing it ends them both.
    starts_a_grandchild = (
        "import subprocess, sys; "
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()']); "
        "print(grandchild.pid, flush=True); sys.stdin.read(); grandchild.wait()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", starts_a_grandchild], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        grandchild = int(child.stdout.readline())
        assert set(descendants(child.pid)) == {grandchild}
    finally:
        child.stdin.close()
        child.wait()
    assert descendants(child.pid) == []
