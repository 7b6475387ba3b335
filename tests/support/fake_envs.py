"""A configurable Gymnasium env for the two-phase format's budget and fault tests: cheap,
deterministic, with episode length and reward per step chosen by the competition's env_kwargs.

Competitions name it ``env_id = "fake_envs:CountingEnv"`` (the tests folder is on the import
path under pytest, and the runner's subprocesses get it through PYTHONPATH).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np


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
