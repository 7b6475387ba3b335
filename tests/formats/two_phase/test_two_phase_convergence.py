"""When a training run has converged (docs/formats/two-phase.md, "Convergence"), on hand-made
episode sequences: the streak rule, the mean rule, and which episodes take part."""

from __future__ import annotations

import pytest

from arbiter.server.formats.two_phase.convergence import (
    ConvergenceTracker,
    convergence_step,
    counts_for_convergence,
)


def run_of(returns, steps_each=10):
    """(return, total steps at its end) per episode, every episode ``steps_each`` long."""
    return [(value, steps_each * (i + 1)) for i, value in enumerate(returns)]


def test_a_streak_is_an_episode_at_the_goal_followed_by_window_more():
    # goal 5, window 2: three in a row at the goal; the third ends at 10 × 5 steps
    assert convergence_step(run_of([1, 5, 6, 2, 5, 5, 5, 9]), 5, 2, "streak") == 70
    assert convergence_step(run_of([5, 5, 4, 5, 5]), 5, 2, "streak") is None  # a miss breaks the streak


def test_the_mean_rule_looks_at_the_last_window_episodes():
    # goal 5, window 2: the windows ending at episodes 2, 3, 4 average 3, 4.5, 5.5 → the fourth ends it
    assert convergence_step(run_of([2, 4, 5, 6]), 5, 2, "mean") == 40
    # the first full window already averages the goal although one episode is below it
    assert convergence_step(run_of([10, 0, 0]), 5, 2, "mean") == 20
    assert convergence_step(run_of([4.9] * 10), 5, 3, "mean") is None


def test_the_same_returns_converge_later_under_the_streak_than_under_the_mean():
    returns = [10, 0, 10, 10, 10]
    assert convergence_step(run_of(returns), 5, 2, "mean") == 20
    assert convergence_step(run_of(returns), 5, 2, "streak") == 50


def test_the_tracker_records_the_step_once_and_stays_converged():
    tracker = ConvergenceTracker(goal=1.0, window=1, criterion="streak")
    assert tracker.add(1.0, 3) is False and not tracker.converged
    assert tracker.add(2.0, 8) is True and tracker.step == 8
    assert tracker.add(0.0, 9) is False and tracker.step == 8 and tracker.converged


@pytest.mark.parametrize(
    "record,counts",
    [
        ({"complete": True}, True),
        ({"agent_reset": True, "complete": False}, True),
        ({"complete": False}, False),  # cut short by the run's own end
        ({}, False),
    ],
)
def test_only_episodes_the_env_or_the_agent_ended_count(record, counts):
    assert counts_for_convergence(record) is counts
