"""A configurable Gymnasium env for the two-phase format's budget and fault tests: cheap,
deterministic, with episode length and reward per step chosen by the competition's env_kwargs.

Competitions name it ``env_id = "fake_envs:CountingEnv"`` (the tests folder is on the import
path under pytest, and the runner's subprocesses get it through PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from arbiter.server.core.competition import spec_from_dict


class CountingEnv(gymnasium.Env):
    """Observation: [steps so far, seed % 1000]; action 0 or 1; reward ``reward`` per step plus
    ``bonus`` per action 1; the episode ends after ``length`` steps (terminated)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, reward: float = 1.0, bonus: float = 0.0):
        self.length = length
        self.reward = reward
        self.bonus = bonus
        self.observation_space = gymnasium.spaces.Box(0.0, 1e6, shape=(2,), dtype=np.float64)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.steps = 0
        self.seed_seen = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.steps = 0
        self.seed_seen = 0 if seed is None else seed
        return self._observation(), {"seed_seen": self.seed_seen}

    def _observation(self) -> np.ndarray:
        return np.array([self.steps, self.seed_seen % 1000], dtype=np.float64)

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        reward = self.reward + (self.bonus if action == 1 else 0.0)
        return self._observation(), reward, self.steps >= self.length, False, {"steps": self.steps}


def fake_spec(**extra: Any) -> Any:
    """A two-phase competition on CountingEnv: 5-step episodes, 1 per step (+bonus for action 1).
    ``extra`` overrides keys; ``phase2`` and ``budgets`` are merged into the defaults."""
    data: dict[str, Any] = {
        "format": "two-phase",
        "seed": 7,
        "env_id": "fake_envs:CountingEnv",
        "env_kwargs": {"length": 5, "bonus": 1.0},
        "reward_per_step": [1.0, 2.0],
        "worst_return": 0.0,
        "num_episodes": 2,
        "phase2": {"max_steps": 200, "goal_reward": 9.0, "stability_window": 2, "num_runs": 2,
                   "step_s": 2.0, "planning_s": 2.0, "run_budget_s": 30.0},
        "budgets": {"step_s": 2.0, "planning_s": 2.0, "idle_s": 5.0, "overall_s": 120.0},
    }  # fmt: skip
    for key, value in extra.items():
        if key in ("phase2", "budgets"):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return spec_from_dict("fake", data)


# -- competitions on CountingEnv: the cheapest evaluations whose env is the server's ----------------

# Budgets no agent of these tests comes near, unless a test chooses otherwise.
ROOMY_BUDGETS = {"step_s": 5.0, "planning_s": 5.0, "idle_s": 10.0, "overall_s": 300.0}


def counting_competition(
    *, num_episodes: int = 3, length: int = 5, phase: int = 1, budgets: dict[str, float] | None = None, **keys: Any
) -> Any:
    """Phase ``phase`` of a two-phase competition whose episodes last ``length`` steps of reward 1
    each (plus 1 per action 1); ``keys`` are further competition keys (``phase2``, ``debug`` ...)."""
    return spec_from_dict(
        "counting",
        {
            "format": "two-phase",
            "seed": 7,
            "env_id": "fake_envs:CountingEnv",
            "env_kwargs": {"length": length, "reward": 1.0, "bonus": 1.0},
            "worst_return": 0.0,
            "num_episodes": num_episodes,
            "phase": phase,
            "budgets": {**ROOMY_BUDGETS, **(budgets or {})},
            **keys,
        },
    )
