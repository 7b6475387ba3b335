"""A child process that cannot outlive the thread that started it: the kernel SIGKILLs it when
that thread ends, killed included (Linux's ``PR_SET_PDEATHSIG``). For the servers a process
starts for itself alone, such as an evaluation's private redis-server."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def death_signal_wrapper() -> list[str]:
    """util-linux's ``setpriv --pdeathsig KILL --``, which has the kernel SIGKILL the program it
    runs when the thread that started it ends (killed included); [] where setpriv lacks it.

    Preferred to a ``preexec_fn``: one makes subprocess fork rather than vfork, and a fork runs
    the at-fork handlers of every library loaded in the process, gRPC's included (a DIAMBRA
    env's), which crash a process forked from one whose gRPC threads are running."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    try:
        helped = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"] if "--pdeathsig" in helped.stdout else []


def signalled_when_parent_ends(parent: int, signum: int = signal.SIGTERM) -> None:
    """For the calling process, a fork's child: ``signum`` from the kernel when the thread of
    ``parent`` that forked it ends, killed included; at once if ``parent`` has ended already."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def dying_with_parent() -> Callable[[], None]:
    """Where setpriv cannot: a ``preexec_fn`` that has the kernel SIGKILL the child when the
    thread that started it ends (killed included), and kills a child whose parent already ended
    before it was set. libc is looked up before the fork: the child only makes two system calls."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal
