"""When a training run has converged (SCORING.md §2): one implementation for the evaluator, which
ends the run at that moment, and for the offline rescoring of a results folder.

- ``streak`` (the rule's text): converged at the first episode with return ≥ goal that is followed
  by ``window`` consecutive episodes also ≥ goal; the step recorded is the run's env-step count at
  the end of the last episode of that streak.
- ``mean`` (the published template's code): converged at the first episode at which the mean
  return of the last ``window`` episodes is ≥ goal; the step recorded is the count at its end.

Only complete episodes count: an episode cut short when the run reached its step limit does not.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable


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
        """One complete episode; True when the run converges with it."""
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
    """The recorded convergence step of complete episodes given as (return, total_steps), or None."""
    tracker = ConvergenceTracker(goal, window, criterion)
    for episode_return, total_steps in episodes:
        if tracker.add(episode_return, total_steps):
            return tracker.step
    return None
