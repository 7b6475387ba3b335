"""Between two MetaLC folds in a container of their own: nothing of one fold left for the next.

A fold's process and its process group end with the fold, and its folders go
(``metalc_process.FoldProcess.close``). A deliberate agent can still leave two things behind: a
process in a session of its own (``setsid``), and a file at an absolute path in a writable folder,
from which the next fold would read the test curves this fold was given. On a machine where the
runner shares its user with other programs it may touch neither. In a container that runs the
submission alone, arbiter's container backend says so in ``ARBITER_SOLE_TENANT``, naming the
container's one writable folder; the runner then clears both when a fold ends:

- every process of its user started since the fold began is killed (the runner, and whatever ran
  before it, such as flatland's socket bridge, started earlier);
- every entry of the writable folder made since the runner started is removed.

Never set the variable outside such a container: the first would kill the user's other programs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time

log = logging.getLogger(__name__)

SOLE_TENANT_VARIABLE = "ARBITER_SOLE_TENANT"
KILL_ROUNDS = 20  # a process may start another while the others are killed: look again, this often
KILLED_WAIT_S = 2.0  # a killed process ends within moments; a round waits this long at most


def _ticks_now() -> int:
    """Clock ticks since boot, the unit of a process's start time in ``/proc/<pid>/stat``."""
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime_s = float(handle.read().split()[0])
    return int(uptime_s * os.sysconf("SC_CLK_TCK"))


def _started_at(pid: int) -> int | None:
    """A running process's start time in ticks since boot; None once it has ended (a zombie
    included: it runs nothing, and its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state, on
    return None if fields[0] in ("Z", "X") else int(fields[19])


class FoldTenancy:
    def __init__(self, environ: os._Environ[str] | dict[str, str] = os.environ):
        self.scratch = environ.get(SOLE_TENANT_VARIABLE) or None
        self.kept: set[str] = set()  # the writable folder's entries when the runner started
        if self.scratch is not None:
            self.kept = set(os.listdir(self.scratch))
        self._fold_began = 0

    @property
    def active(self) -> bool:
        return self.scratch is not None

    def fold_begins(self) -> None:
        """Just before a fold's process starts. Start times count in ticks (10 ms): the fold
        begins on a tick of its own, so that what started before it never shares its tick."""
        if self.active:
            before = _ticks_now()
            while (now := _ticks_now()) == before:
                time.sleep(0.001)
            self._fold_began = now

    def fold_ended(self) -> None:
        """Once the fold's process is gone: what the fold left in the container, removed."""
        if not self.active:
            return
        killed = self._kill_the_folds_processes()
        removed = self._empty_the_scratch_folder()
        if killed or removed:
            log.info("the fold left %d process(es) and %d entr(ies) in %s: removed", killed, removed, self.scratch)

    def _kill_the_folds_processes(self) -> int:
        """Kill them, round after round until a round finds none (one may start another while
        the others are killed), each round waiting for its killed to end."""
        me, uid, killed = os.getpid(), os.getuid(), set()
        for _ in range(KILL_ROUNDS):
            found = []
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == me:
                    continue
                pid = int(name)
                try:
                    if os.stat(f"/proc/{pid}").st_uid != uid:
                        continue
                except OSError:
                    continue
                started = _started_at(pid)
                if started is None or started < self._fold_began:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    found.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            if not found:
                break
            killed.update(found)
            give_up = time.monotonic() + KILLED_WAIT_S
            while any(_started_at(pid) is not None for pid in found) and time.monotonic() < give_up:
                time.sleep(0.001)
            self._reap()
        return len(killed)

    @staticmethod
    def _reap() -> None:
        """Reap what was killed among this process's children (a container's first process also
        adopts the orphans of its others)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _empty_the_scratch_folder(self) -> int:
        assert self.scratch is not None
        removed = 0
        for name in os.listdir(self.scratch):
            if name in self.kept:
                continue
            path = os.path.join(self.scratch, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    continue
            removed += 1
        return removed
