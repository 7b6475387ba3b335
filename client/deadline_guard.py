"""The evaluator's deadline as the client sees it, and calling a policy within it: what
``RemoteClient.time_left_s`` and ``RemoteClient.act_within_budget`` rest on.

``BudgetClock`` follows the budgets the evaluator announced in its PONG on the client's own
``time.monotonic()``: the planning window opens when the ``env_create`` reply arrives, a step
window when the last step is sent. The evaluator opens a step window only once it has applied
that step, so the client errs on the safe side, except by the one-way wire latency of the
``env_create`` reply. Time a step used beyond its budget is drawn from the client's copy of the
episode's time bank, as the evaluator draws it (a little more, by the same safe error).

``DeadlineGuard`` calls the policy with a limit. In the main thread (on Unix) the policy is
interrupted with SIGALRM, through timeout-decorator's signal mode: an exception is raised inside
the policy at the limit. That exception derives from ``BaseException``, so a policy's own
``except Exception`` does not swallow it. What a signal cannot interrupt: C code that does not
return to the interpreter (a long numpy or torch call ends first, then the policy is stopped).
An interval timer the agent had set itself is put back afterwards; if it fell due during the
call it fires right after. A policy stopped inside logging may have been stopped between a lock's
acquire and the code that releases it: the logging locks it left held (the module's, a
handler's) are released, or the agent's other threads would wait forever on their next log line.

Elsewhere (another thread, or a platform without SIGALRM) no signal can reach the policy. It
then runs in a worker thread that the caller stops waiting for at the limit: the fallback goes
out on time, and the abandoned call runs on to its end in the background, its result dropped.
Until it has ended, further calls return the fallback at once, so two calls of the policy never
overlap.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import timeout_decorator

MIN_LIMIT_S = 0.001  # less than this is no time to call anything in


class BudgetClock:
    def __init__(self) -> None:
        self._budgets: dict[str, Any] = {}
        self._window_started = time.monotonic()
        self._window_budget_s: float | None = None
        self._bank_left_s = 0.0

    def _budget(self, name: str) -> float | None:
        value = self._budgets.get(name)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def episode_started(self, budgets: Any, at: float) -> None:
        """The ``env_create`` reply arrived at ``at``; ``budgets`` as the PONG announced them."""
        self._budgets = budgets if isinstance(budgets, dict) else {}
        self._window_started = at
        self._window_budget_s = self._budget("planning_s")
        self._bank_left_s = self._budget("time_bank_s") or 0.0

    def step_sent(self, at: float) -> None:
        if self._window_budget_s is not None:
            over_budget_s = at - self._window_started - self._window_budget_s
            if over_budget_s > 0:
                self._bank_left_s = max(0.0, self._bank_left_s - over_budget_s)
        self._window_started = at
        self._window_budget_s = self._budget("step_s")

    def time_left_s(self, *, use_time_bank: bool) -> float | None:
        """Seconds until the next step's deadline (with the bank's rest, if asked); None without budgets."""
        if self._window_budget_s is None:
            return None
        left_s = self._window_started + self._window_budget_s - time.monotonic()
        return left_s + self._bank_left_s if use_time_bank else left_s


class _OutOfTime(BaseException):
    """Raised inside the policy at its limit (not an Exception: the policy must not catch it)."""


def _signals_usable() -> bool:
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def _owned_here(lock: Any) -> bool:
    """Whether this thread holds ``lock``; only a reentrant lock can tell (logging's are)."""
    is_owned = getattr(lock, "_is_owned", None)
    return bool(is_owned()) if is_owned is not None else False


def logging_locks_held() -> list[Any]:
    """The logging locks (the module's, every live handler's) this thread holds now."""
    locks = [getattr(logging, "_lock", None)]
    for reference in list(getattr(logging, "_handlerList", ())):
        handler = reference()
        locks.append(getattr(handler, "lock", None))
    return [lock for lock in locks if _owned_here(lock)]


def release_logging_locks(held_before: Sequence[Any] = ()) -> int:
    """Release the logging locks this thread took since ``held_before`` and never released, as
    often as it took each; returns how many releases that took."""
    releases = 0
    for lock in logging_locks_held():
        if not any(lock is before for before in held_before):
            while _owned_here(lock):
                lock.release()
                releases += 1
    return releases


class DeadlineGuard:
    def __init__(self) -> None:
        self._abandoned: threading.Thread | None = None  # a worker still running past its limit

    def call(self, limit_s: float, policy: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        """``(True, policy(*args))`` if the policy returns within ``limit_s``, else ``(False, None)``.
        An exception the policy raises in time is raised here."""
        if limit_s < MIN_LIMIT_S:
            return False, None
        if _signals_usable():
            return self._with_alarm(limit_s, policy, args)
        return self._in_worker(limit_s, policy, args)

    @staticmethod
    def _with_alarm(limit_s: float, policy: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        outer_handler = signal.getsignal(signal.SIGALRM)
        outer_delay_s, outer_interval_s = signal.getitimer(signal.ITIMER_REAL)
        started = time.monotonic()
        held_before = logging_locks_held()
        bounded = timeout_decorator.timeout(limit_s, use_signals=True, timeout_exception=_OutOfTime)(policy)
        try:
            return True, bounded(*args)
        except _OutOfTime:
            release_logging_locks(held_before)
            return False, None
        finally:
            # timeout-decorator puts the handler back, except when the alarm beats the policy's
            # start; it always clears the timer, so one the agent had set is set again.
            if outer_handler is not None:  # None: a handler set outside Python, left as it is
                signal.signal(signal.SIGALRM, outer_handler)
            if outer_delay_s > 0:
                left_s = max(outer_delay_s - (time.monotonic() - started), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, left_s, outer_interval_s)

    def _in_worker(self, limit_s: float, policy: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        if self._abandoned is not None:
            if self._abandoned.is_alive():
                return False, None
            self._abandoned = None
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = policy(*args)
            except BaseException as exc:  # handed to the caller, if it is still waiting
                outcome["error"] = exc

        worker = threading.Thread(target=run, name="arbiter-policy", daemon=True)
        worker.start()
        worker.join(limit_s)
        if worker.is_alive():
            self._abandoned = worker
            return False, None
        if "error" in outcome:
            raise outcome["error"]
        return True, outcome["value"]
