"""Folders named after the process that made them (protocol/starter_folders.py): those of a
process that no longer runs are found, whatever tells it (Linux's /proc, else the pid itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from arbiter.protocol import starter_folders
from arbiter.protocol.starter_folders import abandoned, process_runs, starter_of, starter_prefix

PREFIX = "arbiter-test-starter-"


@pytest.mark.parametrize("proc", ["linux", "elsewhere"])
def test_the_folders_of_ended_processes_are_found_and_no_other(monkeypatch, tmp_path, proc) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if proc == "elsewhere":
        monkeypatch.setattr(starter_folders, "PROC", tmp_path / "no-proc")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    mine = tempfile.mkdtemp(prefix=starter_prefix(PREFIX))
    theirs = tmp_path / f"{PREFIX}{ended.pid}-x"
    unnamed = tmp_path / f"{PREFIX}x"
    other_kind = tmp_path / f"arbiter-other-{ended.pid}-x"
    for folder in (theirs, unnamed, other_kind):
        folder.mkdir()
    assert starter_of(os.path.basename(mine), PREFIX) == os.getpid()
    assert process_runs(os.getpid()) and not process_runs(ended.pid)
    assert abandoned(PREFIX) == [theirs]


def test_a_zombie_no_longer_runs_where_proc_says_so() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert not process_runs(child.pid)
    finally:
        child.wait()
