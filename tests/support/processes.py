"""What /proc says about the processes a test started.

A process can exit between opening one of its /proc files and reading it: the read then fails
with ESRCH (ProcessLookupError), not ENOENT. Both mean the process is gone, so the helpers here
treat them alike: a test that waits for a process to end must not fail on the instant it ends.
"""

from __future__ import annotations

import os
from pathlib import Path

GONE = (FileNotFoundError, ProcessLookupError)


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie, waiting for its parent to reap it, runs nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except GONE:
        return False
    # The command name in parentheses may hold anything, spaces and ')' too: the state follows the last ')'.
    return stat.rpartition(")")[2].split()[0] != "Z"


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children and so on; a process that exits meanwhile is skipped."""
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except GONE:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except GONE:
                continue
            for child in map(int, children):
                found.append(child)
                pending.append(child)
    return found
