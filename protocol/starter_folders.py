"""Temporary folders named after the process that made them, so that those of a process that
ended without removing its own (killed outright) are found and removed by a later one.

The agent's side (a MetaLC runner's fold folders) and the evaluator's (a hosted evaluation's
Redis) both leave such folders when they are killed; the name ``<prefix><pid>-<random>`` says
whose they are, and a folder stays while a process of that pid runs: it may be filling it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PROC = Path("/proc")


def starter_prefix(prefix: str) -> str:
    """The name prefix of a folder this process makes (``tempfile.mkdtemp(prefix=...)``)."""
    return f"{prefix}{os.getpid()}-"


def starter_of(name: str, prefix: str) -> int | None:
    """The pid in a folder's name (``<prefix><pid>-...``), or None when it names none."""
    if not name.startswith(prefix):
        return None
    pid_text, dash, _ = name[len(prefix) :].partition("-")
    return int(pid_text) if dash and pid_text.isdigit() else None


def process_runs(pid: int) -> bool:
    """Whether process ``pid`` still runs. A zombie does not (it has ended; only its parent has
    yet to reap it): read from Linux's /proc, elsewhere whether the pid is taken at all."""
    if PROC.is_dir():
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # ESRCH: it ended as it was read
            return False
        except OSError:
            return True  # cannot tell: treated as running, so nothing of its is removed
        return stat.rpartition(")")[2].split()[0] != "Z"  # the state follows the name, which may hold ")"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process holds the pid
    return True


def abandoned(prefix: str) -> list[Path]:
    """This user's folders in the temporary folder named ``<prefix><pid>-...`` whose process no
    longer runs."""
    found: list[Path] = []
    try:
        folders = list(Path(tempfile.gettempdir()).glob(f"{prefix}*"))
    except OSError:
        return found
    for folder in folders:
        starter = starter_of(folder.name, prefix)
        if starter is None:
            continue
        try:
            if folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue  # removed meanwhile
        if not process_runs(starter):
            found.append(folder)
    return found
