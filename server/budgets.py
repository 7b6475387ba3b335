"""Time budgets as data, and the deadlines they imply.

Every duration is measured by the server on ``time.monotonic()``; client timestamps are never
used. No signals: the service loop waits on Redis with bounded blocking pops up to the nearest
deadline (see transport.py), so budgets work in any thread.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from arbiter.protocol.errors import ConfigError


@dataclass(frozen=True)
class BudgetPolicy:
    planning_s: float = 300.0  # from the ENV_CREATE reply to the episode's first ENV_STEP
    step_s: float = 5.0  # between consecutive ENV_STEPs of an episode
    overall_s: float = 8 * 3600.0  # from the first request to the end of the evaluation
    idle_s: float = 300.0  # waiting for a client, or for the next ENV_CREATE between episodes
    max_successive_timeouts: int = 10

    def __post_init__(self) -> None:
        for name in ("planning_s", "step_s", "overall_s", "idle_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"budget {name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.max_successive_timeouts, int) or self.max_successive_timeouts < 1:
            raise ConfigError(
                f"max_successive_timeouts must be a whole number >= 1, got {self.max_successive_timeouts!r}"
            )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class Wait(enum.Enum):
    """What the evaluator is waiting for; each kind has its own budget."""

    CLIENT = "client"  # nothing heard yet (idle budget)
    PLANNING = "planning"  # the first step of an episode (planning budget)
    STEP = "step"  # the next step of an episode (step budget)
    NEXT_EPISODE = "next_episode"  # ENV_CREATE after a finished episode (idle budget)
    AFTER_TIMEOUT = "after_timeout"  # ENV_CREATE after a timed-out episode (step budget)
    SUBMIT = "submit"  # ENV_SUBMIT after the last episode (idle budget)


@dataclass(frozen=True)
class Deadline:
    wait: Wait
    at: float  # time.monotonic() value
    overall: bool = False  # True when the overall budget is the nearer limit


def budget_for(wait: Wait, budgets: BudgetPolicy) -> float:
    if wait is Wait.PLANNING:
        return budgets.planning_s
    if wait in (Wait.STEP, Wait.AFTER_TIMEOUT):
        return budgets.step_s
    return budgets.idle_s
