"""When a training run has converged (docs/formats/two-phase.md): one implementation for the evaluator, which
ends the run at that moment, and for the offline rescoring of a results folder.

- ``streak`` (the rule's text): converged at the first episode with return ≥ goal that is followed
  by ``window`` consecutive episodes also ≥ goal; the step recorded is the run's env-step count at
  the end of the last episode of that streak.
- ``mean`` (the published template's code): converged at the first episode at which the mean
  return of the last ``window`` episodes is ≥ goal; the step recorded is the count at its end.

Which episodes count: every episode that ended, whether the env ended it or the agent did by
resetting mid-episode (an episode ended by a reset counts with the return its record holds, see
``episodes.TrainingRun``), so abandoning an episode that goes badly cannot hide it from the
criterion. Only the episode the run's own end cut short (its step limit, a timeout, the end of
the evaluation) does not count: the agent did not end it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from typing import Any


def counts_for_convergence(record: dict[str, Any]) -> bool:
    """Whether a training episode's record takes part in the criterion: the env ended it
    (``complete``) or the agent did, with a reset mid-episode (``agent_reset``)."""
    return bool(record.get("complete") or record.get("agent_reset"))


class ConvergenceTracker:
    def __init__(self, goal: float, window: int, criterion: str):
        self.goal = goal
        self.window = window
        self.criterion = criterion
        self.streak = 0
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.step: int | None = None  # the recorded convergence step, once converged

    @property
    def converged(self) -> bool:
        return self.step is not None

    def add(self, episode_return: float, total_steps: int) -> bool:
        """One episode that counts; True when the run converges with it."""
        if self.converged:
            return False
        if self.criterion == "streak":
            self.streak = self.streak + 1 if episode_return >= self.goal else 0
            reached = self.streak >= self.window + 1
        else:
            self._recent.append(episode_return)
            reached = len(self._recent) == self.window and math.fsum(self._recent) / self.window >= self.goal
        if reached:
            self.step = total_steps
        return reached


def convergence_step(episodes: Iterable[tuple[float, int]], goal: float, window: int, criterion: str) -> int | None:
    """The recorded convergence step of counting episodes given as (return, total_steps), or None."""
    tracker = ConvergenceTracker(goal, window, criterion)
    for episode_return, total_steps in episodes:
        if tracker.add(episode_return, total_steps):
            return tracker.step
    return None
