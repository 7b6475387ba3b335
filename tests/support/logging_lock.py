"""Who holds the logging module's lock, for tests whose evaluators log from background threads.

Every logger takes that lock the first time it checks a level after the levels changed (pytest
changes them around each test). A thread that never releases it (the main thread interrupted
inside logging by an exception a signal handler raised, say) leaves every evaluator thread of
the later tests waiting on its first log line: a cascade of failures that names none of its
cause. The suite's fixture (conftest.py) catches the test that left the lock held, with the
client's own ``release_logging_locks`` (client/deadline_guard.py), and a report of a stuck
evaluator (harness.where_threads_are) names the lock's owner first.
"""

from __future__ import annotations

import logging
import re
import threading

_OWNER = re.compile(r"\bowner=(\d+)")


def owner() -> int | None:
    """The ident of the thread holding logging's module lock, None when it is free. Read from
    the lock's repr, the only place an RLock tells its owner to another thread."""
    match = _OWNER.search(repr(logging._lock))  # type: ignore[attr-defined]
    return int(match.group(1)) if match and match.group(1) != "0" else None


def describe_owner() -> str:
    """One line: who holds the lock (the thread's name, or that no live thread has that ident)."""
    ident = owner()
    if ident is None:
        return "logging's module lock is free"
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    who = f"thread {names[ident]!r}" if ident in names else "a thread that has ended"
    return f"logging's module lock is held by {who} (ident {ident}): {logging._lock!r}"  # type: ignore[attr-defined]
