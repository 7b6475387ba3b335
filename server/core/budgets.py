"""Time budgets as data, and the deadlines they imply.

Every duration is measured by the server on ``time.monotonic()``; client timestamps are never
used. No signals: the service loop waits on Redis with bounded blocking pops up to the nearest
deadline (see transport.py), so budgets work in any thread.

The time bank (kaggle-environments calls it overage time) is a per-episode reserve of seconds
that the planning phase and the steps of that episode may run over their budgets in all: a
window's deadline is its budget plus what is left in the bank, and what a request used beyond
its budget is drawn from the bank when it arrives. An empty bank (the default) leaves flatland's
rules exactly as they are.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import NamedTuple

from arbiter.protocol.errors import ConfigError


@dataclass(frozen=True)
class BudgetPolicy:
    planning_s: float = 300.0  # from the ENV_CREATE reply to the episode's first ENV_STEP
    step_s: float = 5.0  # between consecutive ENV_STEPs of an episode
    overall_s: float = 8 * 3600.0  # from the first ENV_CREATE to the end of the evaluation
    idle_s: float = 300.0  # waiting for a client and its first ENV_CREATE, or for the next one between episodes
    max_successive_timeouts: int = 10
    time_bank_s: float = 0.0  # per episode: what planning and steps may run over their budgets in all

    def __post_init__(self) -> None:
        for name in ("planning_s", "step_s", "overall_s", "idle_s"):
            value = getattr(self, name)
            # Infinity too is refused: every deadline is a number the evaluator reckons with, and
            # a summary must stay plain JSON.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ConfigError(f"budget {name} must be a positive, finite number of seconds, got {value!r}")
        bank = self.time_bank_s
        if isinstance(bank, bool) or not isinstance(bank, (int, float)) or not 0 <= bank < float("inf"):
            raise ConfigError(f"budget time_bank_s must be a number of seconds >= 0, got {bank!r}")
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


class Deadline(NamedTuple):  # a tuple: one is made for every wait, a frozen dataclass costs 2.5x
    wait: Wait
    at: float  # time.monotonic() value
    overall: bool = False  # True when the overall budget is the nearer limit
    stage: bool = False  # True when the running item's stage budget is the nearer limit


def budget_for(wait: Wait, budgets: BudgetPolicy, bank_left_s: float = 0.0) -> float:
    """How long the evaluator waits in ``wait``; while an episode runs, the bank's rest included."""
    if wait is Wait.PLANNING:
        return budgets.planning_s + bank_left_s
    if wait is Wait.STEP:
        return budgets.step_s + bank_left_s
    if wait is Wait.AFTER_TIMEOUT:
        return budgets.step_s
    return budgets.idle_s


def silence_before_takeover_s(wait: Wait, budgets: BudgetPolicy, bank_left_s: float) -> float:
    """How long the bound client must have been silent before another client's handshake may
    replace it (server/clients.py): while an episode runs, as long as the episode waits for it
    (its planning or step budget plus the bank's rest), so the episode has timed out or would
    have; between episodes, the step budget, since a live agent asks for the next episode at once.
    """
    if wait in (Wait.PLANNING, Wait.STEP):
        return budget_for(wait, budgets, bank_left_s)
    return budgets.step_s


class TimeBank:
    """One episode's time bank: refilled when the episode starts, drawn by late requests."""

    __slots__ = ("size_s", "left_s")

    def __init__(self, size_s: float) -> None:
        self.size_s = size_s
        self.left_s = size_s

    @property
    def used_s(self) -> float:
        return self.size_s - self.left_s

    def refill(self) -> None:
        self.left_s = self.size_s

    def draw(self, over_budget_s: float) -> None:
        """A request came ``over_budget_s`` after its budget ran out (it was on time, so the bank
        covered it; one taken from Redis a moment after its deadline never overdraws)."""
        if over_budget_s > 0:
            self.left_s = max(0.0, self.left_s - over_budget_s)

    def spend_all(self) -> None:
        """A window ran out with the bank: the episode timed out having used all of it."""
        self.left_s = 0.0
