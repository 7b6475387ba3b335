"""A DIAMBRA evaluation played in process: the env an agent script steps, and its score.

``LocalEvaluation`` behaves as DIAMBRA's competition env does for an agent script: ``reset()``
starts the evaluation's next episode, and once the last one is over, ``info["env_done"]`` is
True (in the step that ends it and in the ``reset()`` after it), which is when a DIAMBRA agent
script leaves its loop. The records and the score are the format's own (``scoring``), so a
submitter sees offline what an arbiter server would compute. Episode i is reset with the seed
``env.episode_seed(seed, i)``; without a competition seed each episode draws one (recorded).
"""

from __future__ import annotations

from typing import Any

import gymnasium

from arbiter.protocol.errors import OutOfOrder
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.formats.diambra.env import DiambraEnv, episode_seed
from arbiter.server.formats.diambra.scoring import DifficultyWeightedRule, episode_record
from arbiter.server.formats.diambra.settings import DiambraSettings


class LocalEvaluation(gymnasium.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        settings: DiambraSettings,
        *,
        seed: int | None = None,
        engine_address: str | None = None,
        **mock_options: Any,
    ):
        super().__init__()
        self.settings = settings
        self.competition_seed = seed
        self.env = DiambraEnv(settings, engine_address=engine_address, **mock_options)
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.bounds = self.env.reward_bounds()
        self.records: list[dict[str, Any]] = []
        self.episode = -1  # index of the running (or last) episode
        self._running = False
        self._reward = 0.0
        self._steps = 0
        self._seed: int | None = None
        self._last: tuple[Any, dict[str, Any]] | None = None

    @property
    def env_done(self) -> bool:
        return len(self.records) >= self.settings.episodes

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """The next episode; after the last one, the last observation again with ``env_done``.
        The evaluation chooses every seed: ``seed`` and ``options`` are not accepted."""
        if seed is not None or options:
            raise ValueError("the evaluation chooses each episode's seed and settings; reset() takes no arguments")
        if self._running:  # leaving an episode before its end scores it as the lowest reward
            self._record(abandoned=True)
        if self.env_done:
            observation, info = self._last if self._last is not None else (None, {})
            return observation, {**info, "env_done": True}
        self.episode += 1
        observation, info = self.env.reset(seed=episode_seed(self.competition_seed, self.episode))
        self._seed = self.env.seed_used
        self._running, self._reward, self._steps = True, 0.0, 0
        return observation, self._with_place(info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if not self._running:
            raise OutOfOrder("step() with no running episode: call reset() first")
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._reward += reward
        self._steps += 1
        if terminated or truncated:
            self._record()
        info = self._with_place(info)
        self._last = (observation, info)
        return observation, reward, terminated, truncated, info

    def result(self) -> dict[str, Any]:
        """The evaluation's figures over the episodes recorded so far."""
        return DifficultyWeightedRule(self.settings).aggregate(self.records)

    def close(self) -> None:
        self.env.close()
        super().close()

    def _record(self, *, abandoned: bool = False) -> None:
        self.records.append(
            episode_record(
                self.settings,
                reward=self._reward,
                bounds=self.bounds,
                seed=self._seed,
                engine=self.env.engine,
                steps=self._steps,
                invalid_actions=self.env.invalid_actions,
                episode=self.episode,
                abandoned=abandoned,
            )
            | {"drawn": self.env.drawn}
        )
        self._running = False

    def _with_place(self, info: dict[str, Any]) -> dict[str, Any]:
        place: dict[str, Any] = {"episode": self.episode, "engine": self.env.engine}
        if not self._running:  # as the server does: an episode's seed is named once it has ended
            place["seed"] = self._seed
        return {**info, "env_done": self.env_done, EXTENSION_KEY: place}
