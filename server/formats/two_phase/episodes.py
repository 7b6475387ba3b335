"""The two-phase format's items: an evaluation episode, and a training run of many episodes.

Both step the one Gymnasium env the plan owns; the server resets it with the seeds it derives
(``base.reset_seed``) and records every reset's seed. Actions outside the action space are
refused (an ``INVALID_ACTION`` error reply, nothing applied, counted): a Gymnasium env has no
universal no-op to substitute.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.protocol.errors import InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import action_for

from ..base import Item, finite, plain, reset_seed, step_reply
from .convergence import ConvergenceTracker
from .options import TwoPhaseOptions


def _refuse_or_clean(space: Any, action: Any) -> tuple[Any, int]:
    clean = action_for(space, action)
    if clean is None:
        raise InvalidAction(f"action {str(action)[:80]!r} is not in the action space {space}; nothing was applied")
    return clean, 0


class EvalEpisode:
    """One evaluation episode (phase 1, or after a training run). A timed-out or abandoned one
    scores ``worst_return``, never its partial return."""

    spans_resets = False
    stage_budget_s = None

    def __init__(self, env: Any, item: Item, seed: int | None, worst_return: float):
        self.env = env
        self.item = item
        self.seed = seed
        self.worst_return = worst_return
        self.observation, self.info = env.reset(seed=seed)
        self.steps = 0
        self.total_return = 0.0
        self.over = False
        self._last: tuple[Any, float, bool, bool, Any] | None = None

    def create_payload(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "info": plain(self.info),
            "random_seed": self.seed,
            EXTENSION_KEY: {**self.item.fields, "seed": self.seed},
        }

    def next_reset(self) -> dict[str, Any]:  # pragma: no cover - an eval episode never spans resets
        raise NotImplementedError

    def sanitize(self, action: Any) -> tuple[Any, int]:
        return _refuse_or_clean(self.env.action_space, action)

    def step(self, action: Any) -> bool:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.total_return += float(reward)
        self._last = (observation, float(reward), bool(terminated), bool(truncated), info)
        self.over = bool(terminated or truncated)
        return self.over

    def step_reply(self, invalid: int) -> dict[str, Any]:
        assert self._last is not None
        return step_reply(self._last, done=self.over, step=self.steps, invalid=invalid, stage_over=self.over)

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        return [
            {
                **self.item.fields,
                "seed": self.seed,
                "steps": self.steps,
                "return": self.total_return if finished else self.worst_return,
                "partial_return": None if finished else finite(self.total_return),
            }
        ]

    def close(self) -> None:
        self._last = None


class TrainingRun:
    """One phase-2 training run: the agent resets and steps the server's env as often as it
    likes; the server counts env steps, records every episode, and ends the run when it has
    converged or reached ``max_steps`` (the step that reaches it cuts the running episode)."""

    spans_resets = True

    def __init__(self, env: Any, item: Item, options: TwoPhaseOptions, base_seed: int | None):
        p2 = options.phase2
        self.env = env
        self.item = item
        self.max_steps = p2.max_steps
        self.stage_budget_s = p2.run_budget_s
        self.base_seed = base_seed
        self.run = item.fields["run"]
        self.tracker = ConvergenceTracker(p2.goal_reward, p2.stability_window, p2.criterion)
        self.total_steps = 0
        self.done_episodes: list[dict[str, Any]] = []
        self.episode = -1
        self.over = False
        self.ended_by: str | None = None
        self._last: tuple[Any, float, bool, bool, Any] | None = None
        self._reset()

    def _reset(self) -> None:
        self.episode += 1
        self.seed = reset_seed(self.base_seed, 2, self.run, self.episode)
        self.observation, self.info = self.env.reset(seed=self.seed)
        self.episode_steps = 0
        self.episode_return = 0.0
        self.episode_started = time.monotonic()

    def create_payload(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "info": plain(self.info),
            "random_seed": self.seed,
            EXTENSION_KEY: {**self.item.fields, "episode": self.episode, "seed": self.seed},
        }

    def next_reset(self) -> dict[str, Any]:
        if self.episode_steps:
            self._close_episode(complete=False)  # reset mid-episode: recorded, never counted
        self._reset()
        return self.create_payload()

    def sanitize(self, action: Any) -> tuple[Any, int]:
        return _refuse_or_clean(self.env.action_space, action)

    def step(self, action: Any) -> bool:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.total_steps += 1
        self.episode_steps += 1
        self.episode_return += float(reward)
        ended = bool(terminated or truncated)
        if ended:
            self._close_episode(complete=True)
            if self.tracker.add(self.done_episodes[-1]["return"], self.total_steps):
                self._end("converged")
        if not self.over and self.total_steps >= self.max_steps:
            if not ended:
                self._close_episode(complete=False)
                truncated = True  # the run's step limit cuts the episode: the agent sees it end
            self._end("max_steps")
        self._last = (observation, float(reward), bool(terminated), bool(truncated), info)
        return self.over

    def _close_episode(self, *, complete: bool) -> None:
        self.done_episodes.append(
            {
                **self.item.fields,
                "episode": self.episode,
                "seed": self.seed,
                "steps": self.episode_steps,
                "return": self.episode_return,
                "total_steps": self.total_steps,
                "complete": complete,
                "episode_wall_s": time.monotonic() - self.episode_started,
            }
        )
        self.episode_steps = 0

    def _end(self, why: str) -> None:
        self.over = True
        self.ended_by = why

    def step_reply(self, invalid: int) -> dict[str, Any]:
        assert self._last is not None
        steps = self.total_steps
        return step_reply(
            self._last, done=self.over, step=steps, invalid=invalid, stage_over=self.over, total_steps=steps
        )

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        if not finished and self.episode_steps:
            self._close_episode(complete=False)  # the episode running when the run ended
        ended_by = self.ended_by or (f"{timeout}_timeout" if timeout else "agent" if abandoned else "evaluation_end")
        records = self.done_episodes or [
            {**self.item.fields, "episode": None, "seed": None, "steps": 0, "return": 0.0, "complete": False}
        ]
        last = len(records) - 1
        return [
            {
                **r,
                "total_steps": r.get("total_steps", 0),
                # Only the episode the timeout cut short timed out; the run's others were played.
                "timed_out": timeout is not None and i == last and not r["complete"],
                "run_ended": ended_by,
                "converged_at": self.tracker.step,
            }
            for i, r in enumerate(records)
        ]

    def close(self) -> None:
        self._last = None
