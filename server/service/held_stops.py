"""Stop signals that come before anything is ready to obey them.

A hosted attempt's work-horse is told to stop (its submission was cancelled, or its lock was
lost: hosting/job.py) by a SIGTERM to itself. Under the signal's default action, one that comes
while the attempt is still starting (its private Redis, the evaluator being built) would kill the
horse outright: the evaluation would leave no summary, and RQ would report the job as failed.
Within ``held()``, such a signal is noted instead. Whoever then installs the handler that obeys
it (the evaluator's service loop; the Kubernetes backend while it follows its Job) takes the
noted signal (``take()``) and obeys it at once: the evaluation ends as INTERRUPTED, its agent
never started.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HELD_SIGNALS = (signal.SIGTERM,)
_noted: list[int] = []  # the held signals that came, oldest first; appended from the handler


def _note(signum: int, frame: Any) -> None:
    _noted.append(signum)  # nothing else: a signal handler takes no lock


@contextmanager
def held() -> Iterator[None]:
    """Note the stop signals that come inside this block instead of dying of them, until a
    handler of the evaluation's replaces this one; then restore what was there before. Only the
    main thread can set signal handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _noted.clear()
    previous = {signum: signal.signal(signum, _note) for signum in HELD_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: the handler was not set from Python; the default takes its place
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        _noted.clear()


def take() -> int | None:
    """The oldest stop signal noted and not taken yet (then forgotten), else None. Called right
    after installing the handler that obeys stop signals, so that none falls between the two."""
    return _noted.pop(0) if _noted else None


def noted_from_now(signals: tuple[int, ...]) -> None:
    """From now on ``signals`` are noted instead of acting by default, until the handler of the
    evaluation replaces this one (and takes what was noted): for ``arbiter serve``, whose
    evaluation has started on disk (its ``started`` event) a moment before that handler is
    installed; a SIGTERM in between would end it with no summary and no word. Nothing is put back:
    the process's own handlers follow. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    _noted.clear()
    for signum in signals:
        signal.signal(signum, _note)
