"""Whether this process may still write the results folder it evaluates into.

A hosted attempt holds its submission through a lock in the farm's Redis, which lives a few
seconds unless renewed (hosting/job.py). A work-horse held up past that lifetime (its machine
paused, its processes stopped) may find, once it goes on, that another worker took the
submission over and evaluated it in the same results folder. From then on it must write nothing
there: not an item, not an event, not the summary of its own ending. The attempt installs a
fence (``fenced``) that says why it may no longer write; every write of the results folder asks
``refusal()`` first, and a refused write fails as one the folder itself refused: the evaluation
stops, writing nothing more.

An evaluation of its own (``arbiter run``, ``arbiter serve``) has no fence: it may always write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Refusal = Callable[[], "str | None"]  # why this process may not write its results now; None: it may

_fences: list[Refusal] = []  # installed ones, innermost last


@contextmanager
def fenced(refusal: Refusal) -> Iterator[None]:
    """Within this block, the results folder is written only while ``refusal()`` returns None.
    It is asked before every write, from any thread: it must be quick while writing is allowed."""
    _fences.append(refusal)
    try:
        yield
    finally:
        _fences.remove(refusal)


def refusal() -> str | None:
    """Why the results folder may not be written now; None when it may (or no fence is installed)."""
    return _fences[-1]() if _fences else None
