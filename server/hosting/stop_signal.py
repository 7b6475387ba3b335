"""A SIGTERM to the work-horse while it waits on something outside it (the Kubernetes backend
following its Job): the wait ends within ``STOP_CHECK_S`` and the caller stops what it started.

The handler only sets a plain attribute, and waits sleep in short slices: a handler that took a
lock (a ``threading.Event``'s) could find it held by the very wait it interrupts, in the same
thread, and never return.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from arbiter.server.service import held_stops

STOP_CHECK_S = 0.05  # how soon a SIGTERM ends a wait


class StopSignal:
    """Set by a SIGTERM to the work-horse inside its ``with`` block (handled in the main thread
    only, where Python runs signal handlers); a stop held while the attempt was getting ready
    (``held_stops``) counts as one."""

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self.previous: Any = None

    def is_set(self) -> bool:
        return self.requested

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or until a stop is requested (seen within ``STOP_CHECK_S``)."""
        wake_at = time.monotonic() + timeout_s
        while not self.requested and (left_s := wake_at - time.monotonic()) > 0:
            time.sleep(min(left_s, STOP_CHECK_S))

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._request)
            self.installed = True
            if held_stops.take() is not None:  # it came while the attempt was getting ready
                self.requested = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.installed:  # None: the handler was not set from Python; the default takes its place
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self.previous is None else self.previous)
