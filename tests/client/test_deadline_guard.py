"""client/deadline_guard.py: the evaluator's deadline as the client follows it (BudgetClock), and a
policy called within a limit (DeadlineGuard), in the main thread, where a signal stops it.

The worker-thread path and an alarm of the agent's own are in tests/client/test_act_within_budget.py,
with ``RemoteClient.act_within_budget`` against a real evaluator.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from arbiter.client.deadline_guard import MIN_LIMIT_S, BudgetClock, DeadlineGuard

pytestmark = pytest.mark.alone  # limits timed to fractions of a second


def test_a_policy_that_returns_in_time_gives_its_value():
    assert DeadlineGuard().call(1.0, lambda a, b: a + b, (2, 3)) == (True, 5)


def test_a_policy_past_its_limit_is_stopped_at_the_limit():
    guard = DeadlineGuard()
    started = time.monotonic()
    assert guard.call(0.1, time.sleep, (5,)) == (False, None)
    assert 0.1 <= time.monotonic() - started < 1.0
    assert guard.call(1.0, lambda: "next", ()) == (True, "next")  # the guard is usable again at once


def test_a_policy_cannot_swallow_its_stop():
    swallowed = []

    def stubborn() -> str:
        try:
            time.sleep(5)
        except Exception as exc:  # an agent's catch-all must not keep it running
            swallowed.append(exc)
        return "late"

    assert DeadlineGuard().call(0.05, stubborn, ()) == (False, None)
    assert swallowed == []


def test_a_pure_python_loop_is_stopped_too():
    def spin() -> int:
        total = 0
        while True:
            total += 1

    started = time.monotonic()
    assert DeadlineGuard().call(0.05, spin, ()) == (False, None)
    assert time.monotonic() - started < 1.0


def test_an_error_of_the_policy_is_raised_to_the_caller():
    with pytest.raises(KeyError, match="missing"):
        DeadlineGuard().call(1.0, {}.__getitem__, ("missing",))


def test_no_time_left_means_the_policy_is_not_called():
    called = []
    assert DeadlineGuard().call(MIN_LIMIT_S / 2, lambda: called.append(1), ()) == (False, None)
    assert DeadlineGuard().call(-1.0, lambda: called.append(1), ()) == (False, None)
    assert called == []


def test_each_step_opens_a_window_of_the_step_budget():
    clock = BudgetClock()
    started = time.monotonic()
    clock.episode_started({"planning_s": 3.0, "step_s": 0.5}, started)
    assert 2.9 < clock.time_left_s(use_time_bank=False) <= 3.0
    clock.step_sent(time.monotonic())
    assert 0.4 < clock.time_left_s(use_time_bank=False) <= 0.5
    assert clock.time_left_s(use_time_bank=True) == pytest.approx(clock.time_left_s(use_time_bank=False), abs=1e-3)


def test_time_over_budget_is_drawn_from_the_bank_which_never_goes_below_zero():
    clock = BudgetClock()
    started = time.monotonic()
    clock.episode_started({"planning_s": 1.0, "step_s": 1.0, "time_bank_s": 0.5}, started)
    clock.step_sent(started + 1.2)  # 0.2 s over the planning budget
    bank = clock.time_left_s(use_time_bank=True) - clock.time_left_s(use_time_bank=False)
    assert bank == pytest.approx(0.3, abs=1e-3)
    clock.step_sent(started + 3.2)  # 1 s over the step budget: more than the bank holds
    bank = clock.time_left_s(use_time_bank=True) - clock.time_left_s(use_time_bank=False)
    assert bank == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("budgets", [None, "5", {"planning_s": True}, {"planning_s": "5"}, {"step_s": 1.0}])
def test_budgets_that_are_not_numbers_are_no_budgets(budgets):
    clock = BudgetClock()
    clock.episode_started(budgets, time.monotonic())
    assert clock.time_left_s(use_time_bank=True) is None  # no planning budget: no deadline to tell


class SlowToTakeItsLock(logging.Handler):
    """A handler that takes its lock, then dawdles before the ``try`` that releases it: the
    moment a stop can land in, made long enough for the alarm to find."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []
        self.dawdle = True

    def acquire(self) -> None:
        super().acquire()
        if self.dawdle:
            time.sleep(5)

    def emit(self, record: logging.LogRecord) -> None:
        self.written.append(record.getMessage())


def test_a_policy_stopped_inside_logging_leaves_no_logging_lock_held():
    logger = logging.getLogger("test.policy-stopped-inside-logging")
    handler = SlowToTakeItsLock()
    logger.addHandler(handler)
    try:
        assert DeadlineGuard().call(0.05, logger.warning, ("thinking",)) == (False, None)
        assert not handler.lock._is_owned()  # the lock the stopped policy took is free again
        handler.dawdle = False
        other = threading.Thread(target=logger.warning, args=("from another thread",))
        other.start()
        other.join(5)
        assert not other.is_alive() and handler.written == ["from another thread"]
    finally:
        logger.removeHandler(handler)


def test_a_logging_lock_held_before_the_call_is_left_held():
    handler = SlowToTakeItsLock()
    handler.lock.acquire()  # the caller's own, taken before the policy ran
    try:
        assert DeadlineGuard().call(0.05, time.sleep, (5,)) == (False, None)
        assert handler.lock._is_owned()
    finally:
        handler.lock.release()
        handler.close()
