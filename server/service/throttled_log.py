"""Warnings an agent's requests cause, at most one line per kind each second.

An agent may send requests that are refused as fast as Redis takes them; each is counted in the
summary, and a line per request would only fill the evaluator's log (and its disk). The first of
a kind is logged at once, the next after a second, with how many like it came between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

QUIET_S = 1.0  # at most one line per kind in this time


class ThrottledLog:
    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.clock = clock
        self._last_at: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        """``message % args`` as a warning, unless a line of ``kind`` went out less than
        ``QUIET_S`` ago: then only counted, and said with the next line of that kind."""
        now = self.clock()
        last = self._last_at.get(kind)
        if last is not None and now - last < QUIET_S:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last_at[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            message += " (and %d more like it in the last %.1f s, not logged)"
            args = (*args, held, now - last)
        self.logger.warning(message, *args)
