"""The two-phase format's competition keys (docs/formats/two-phase.md), checked at load.

Top level: ``env_id``, ``env_kwargs``, ``num_episodes``, ``phase``, ``worst_return``,
``reward_per_step``; table ``[phase2]``: ``max_steps``, ``goal_reward``, ``stability_window``,
``num_runs``, ``penalty_factor``, ``criterion``, ``run_budget_s``, ``step_s``, ``planning_s``.
An impossible value or an infeasible goal is an error that says why, never a silent penalty for
every submission.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError

CRITERIA = ("streak", "mean")

# Per-step reward bounds of Gymnasium's built-in classic-control envs, read from their source:
# what makes a goal's feasibility and a timed-out episode's worst return computable.
KNOWN_REWARD_PER_STEP: dict[str, tuple[float, float]] = {
    "CartPole-v0": (1.0, 1.0),
    "CartPole-v1": (1.0, 1.0),
    "MountainCar-v0": (-1.0, -1.0),
    "Acrobot-v1": (-1.0, 0.0),
    "Pendulum-v1": (-(math.pi**2 + 0.1 * 8**2 + 0.001 * 2**2), 0.0),
}


@dataclass(frozen=True)
class Phase2Options:
    max_steps: int = 20_000  # env steps one training run may take (counted by the server)
    goal_reward: float = 475.0
    stability_window: int = 10
    num_runs: int = 5
    penalty_factor: float = 1.5  # a run that does not converge scores penalty_factor × max_steps
    # "streak": converged at the end of an episode ≥ goal followed by stability_window more ≥ goal
    # (the rule's text, docs/formats/two-phase.md); "mean": the mean of the last stability_window episodes ≥ goal (the
    # published template's code).
    criterion: str = "streak"
    run_budget_s: float = 1800.0  # wall clock for one training run
    step_s: float = 30.0  # an agent updates its networks between training steps
    planning_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_steps", "stability_window", "num_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"phase2.{name} must be a whole number >= 1, got {value!r}")
        for name in ("penalty_factor", "run_budget_s", "step_s", "planning_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise ConfigError(f"phase2.{name} must be a positive number, got {value!r}")
        if not math.isfinite(self.goal_reward):
            raise ConfigError(f"phase2.goal_reward must be a finite number, got {self.goal_reward!r}")
        if self.criterion not in CRITERIA:
            raise ConfigError(f"phase2.criterion must be one of {list(CRITERIA)}, got {self.criterion!r}")

    @property
    def penalty(self) -> float:
        return self.penalty_factor * self.max_steps


@dataclass(frozen=True)
class TwoPhaseOptions:
    env_id: str = "CartPole-v1"  # a registered id, "module:EnvId", or "module:Class"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_episodes: int = 10  # phase 1 episodes, and evaluation episodes after each training run
    phase: int | None = None  # 1 or 2 runs that phase alone; None runs both
    worst_return: float | None = None  # a timed-out evaluation episode's return (default: derived)
    reward_per_step: list[float] | None = None  # [min, max] reward of one step, if the env's is bounded
    phase2: Phase2Options = field(default_factory=Phase2Options)

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ConfigError("env_id must name a Gymnasium env")
        if isinstance(self.num_episodes, bool) or not isinstance(self.num_episodes, int) or self.num_episodes < 1:
            raise ConfigError(f"num_episodes must be a whole number >= 1, got {self.num_episodes!r}")
        if self.phase not in (None, 1, 2):
            raise ConfigError(f"phase must be 1 or 2 (or absent for both), got {self.phase!r}")
        bounds = self.reward_per_step
        if bounds is not None and (len(bounds) != 2 or not bounds[0] <= bounds[1]):
            raise ConfigError(f"reward_per_step must be [min, max] with min <= max, got {bounds!r}")
        # Checked again on the env itself when a plan is built; here too, so that `arbiter submit`
        # refuses a goal no agent can reach before it is queued.
        check_feasible(self, registered_episode_steps(self))
        if self.worst_return is not None and not math.isfinite(self.worst_return):
            raise ConfigError("worst_return must be a finite number")

    def step_bounds(self) -> tuple[float, float] | None:
        if self.reward_per_step is not None:
            return float(self.reward_per_step[0]), float(self.reward_per_step[1])
        return KNOWN_REWARD_PER_STEP.get(self.env_id)

    def runs_phase(self, phase: int) -> bool:
        return self.phase is None or self.phase == phase


def registered_episode_steps(options: TwoPhaseOptions) -> int | None:
    """Where an episode of ``options.env_id`` is cut, as its registration (or ``env_kwargs``) says,
    without making the env; None when the id is not registered or no goal is checked on it."""
    if options.step_bounds() is None or not options.runs_phase(2):
        return None
    if "max_episode_steps" in options.env_kwargs:
        steps = options.env_kwargs["max_episode_steps"]
        return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
    import gymnasium

    registered = gymnasium.registry.get(options.env_id)
    return None if registered is None else registered.max_episode_steps


def check_feasible(options: TwoPhaseOptions, max_episode_steps: int | None) -> None:
    """A goal no agent can reach within max_steps is the organiser's error, said at load."""
    p2 = options.phase2
    bounds = options.step_bounds()
    if not options.runs_phase(2) or bounds is None or p2.goal_reward <= 0:
        return
    best_per_step = bounds[1]
    if best_per_step <= 0:
        raise ConfigError(
            f"phase2.goal_reward {p2.goal_reward:g} cannot be reached: {options.env_id} gives at most "
            f"{best_per_step:g} per step"
        )
    steps_per_episode = math.ceil(p2.goal_reward / best_per_step)
    if max_episode_steps is not None and steps_per_episode > max_episode_steps:
        raise ConfigError(
            f"phase2.goal_reward {p2.goal_reward:g} cannot be reached in one episode of {options.env_id}: "
            f"it needs {steps_per_episode} steps at {best_per_step:g} per step, and episodes end after "
            f"{max_episode_steps}"
        )
    episodes = p2.stability_window + 1 if p2.criterion == "streak" else p2.stability_window
    needed = episodes * steps_per_episode
    if needed > p2.max_steps:
        raise ConfigError(
            f"infeasible phase 2: converging needs {episodes} episodes of at least {steps_per_episode} steps "
            f"(goal {p2.goal_reward:g} at {best_per_step:g} per step, criterion {p2.criterion!r}, window "
            f"{p2.stability_window}) = {needed} env steps, more than phase2.max_steps = {p2.max_steps}; "
            "raise max_steps or lower the goal or the window"
        )


def worst_return(options: TwoPhaseOptions, max_episode_steps: int | None) -> float:
    """What a timed-out evaluation episode scores: configured, or the lowest return the env can
    give (never above 0, so a cut-short episode never beats a finished one)."""
    if options.worst_return is not None:
        return float(options.worst_return)
    bounds = options.step_bounds()
    if bounds is None or max_episode_steps is None:
        raise ConfigError(
            f"set worst_return for {options.env_id}: its reward per step is not known to arbiter "
            "(or set reward_per_step = [min, max]), so a timed-out episode's score cannot be derived"
        )
    return min(0.0, bounds[0] * max_episode_steps)
