"""The two-phase format's items: an evaluation episode, and a training run of many episodes.

Both step the one Gymnasium env the plan owns; the server resets it with the seeds it derives
(``base.reset_seed``) and records every reset's seed. An episode's seed stays the server's while
the episode runs: no create reply carries it (an agent that knew it could replay the episode on
its own copy of the env and foresee every random outcome); the step reply that ends the episode
names it (``"arbiter": {"seed"}``), and the records keep it so scores recompute. Actions outside
the action space are refused (an ``INVALID_ACTION`` error reply, nothing applied, counted): a
Gymnasium env has no universal no-op to substitute.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.protocol.errors import InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import action_for
from arbiter.server.formats.base import Item, finite, plain, reset_seed, step_reply
from arbiter.server.formats.two_phase.convergence import ConvergenceTracker
from arbiter.server.formats.two_phase.options import TwoPhaseOptions, worst_return

# How a training episode ended: the env ended it (terminated or truncated), the agent reset
# mid-episode, or the run's end cut it short (its step limit, a timeout, the evaluation's end).
ENDED_BY_ENV, ENDED_BY_RESET, CUT_BY_RUN_END = "env", "reset", "run_end"


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
        return {"observation": self.observation, "info": plain(self.info), EXTENSION_KEY: dict(self.item.fields)}

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
        revealed = {"seed": self.seed} if self.over else {}  # the episode has ended: its seed is no secret
        return step_reply(self._last, done=self.over, step=self.steps, invalid=invalid, stage_over=self.over,
                          **revealed)  # fmt: skip

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


def reset_episode_cap(options: TwoPhaseOptions, env: Any) -> float | None:
    """The most an episode ended by the agent's reset can count for, or None for no limit.

    None when no step's reward can be negative: a partial return is then no more than any return
    the episode could have finished with, so it counts as it is. Otherwise ``worst_return``: a
    partial return would flatter the episode (on MountainCar, a reset after one step would
    "reach" a goal of -110), so it counts as the worst an episode can score."""
    bounds = options.step_bounds()
    if bounds is not None and bounds[0] >= 0:
        return None
    max_episode_steps = env.spec.max_episode_steps if getattr(env, "spec", None) is not None else None
    return worst_return(options, max_episode_steps)


class TrainingRun:
    """One phase-2 training run: the agent resets and steps the server's env as often as it
    likes; the server counts env steps, records every episode, and ends the run when it has
    converged or reached ``max_steps`` (the step that reaches it cuts the running episode).

    A reset ends the running episode, whatever its length (even none: rerolling the initial
    state is not free): it is recorded with ``agent_reset``, its steps stay counted, and it takes
    part in the convergence criterion with its partial return, capped where rewards can be
    negative (``reset_episode_cap``), so an agent cannot hide its bad episodes by abandoning
    them. When such an episode completes the
    criterion, the run has converged at that reset; the episode the reset hands out is never
    played: its first step ends the run (nothing applied, ``truncated``)."""

    spans_resets = True

    def __init__(self, env: Any, item: Item, options: TwoPhaseOptions, base_seed: int | None):
        p2 = options.phase2
        self.env = env
        self.item = item
        self.max_steps = p2.max_steps
        self.stage_budget_s = p2.run_budget_s
        self.base_seed = base_seed
        self.run = item.fields["run"]
        self.reset_cap = reset_episode_cap(options, env)
        self.tracker = ConvergenceTracker(p2.goal_reward, p2.stability_window, p2.criterion)
        self.total_steps = 0
        self.done_episodes: list[dict[str, Any]] = []
        self.episode = -1
        self.episode_open = False  # an episode was reset and has not ended yet
        self.over = False
        self.ended_by: str | None = None
        self._last: tuple[Any, float, bool, bool, Any] | None = None
        self._ended_seed: int | None = None  # the seed of the episode the last step ended, if it did
        self._reset()

    def _reset(self) -> None:
        self.episode += 1
        self.seed = reset_seed(self.base_seed, 2, self.run, self.episode)
        self.observation, self.info = self.env.reset(seed=self.seed)
        self.episode_steps = 0
        self.episode_return = 0.0
        self.episode_started = time.monotonic()
        self.episode_open = True

    def create_payload(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "info": plain(self.info),
            EXTENSION_KEY: {**self.item.fields, "episode": self.episode},
        }

    def next_reset(self) -> dict[str, Any]:
        if self.over:  # converged at the previous reset: the episode it handed out is still the one
            return self.create_payload()
        if self.episode_open:
            self._close_episode(ENDED_BY_RESET)
        self._reset()
        return self.create_payload()

    def sanitize(self, action: Any) -> tuple[Any, int]:
        return _refuse_or_clean(self.env.action_space, action)

    def step(self, action: Any) -> bool:
        self._ended_seed = None
        if self.over:  # converged at the reset before this step: the run ends, nothing is applied
            self._last = (self.observation, 0.0, False, True, {})
            return True
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.total_steps += 1
        self.episode_steps += 1
        self.episode_return += float(reward)
        ended = bool(terminated or truncated)
        if ended:
            self._close_episode(ENDED_BY_ENV)
        if not self.over and self.total_steps >= self.max_steps:
            if not ended:
                self._close_episode(CUT_BY_RUN_END)
                truncated = True  # the run's step limit cuts the episode: the agent sees it end
            self._end("max_steps")
        self._last = (observation, float(reward), bool(terminated), bool(truncated), info)
        return self.over

    def _close_episode(self, how: str) -> None:
        """Record the running episode; one that counts goes to the convergence criterion."""
        collected = self.episode_return
        counted = collected
        if how == ENDED_BY_RESET and self.reset_cap is not None:
            counted = min(collected, self.reset_cap)
        self.done_episodes.append(
            {
                **self.item.fields,
                "episode": self.episode,
                "seed": self.seed,
                "steps": self.episode_steps,
                "return": counted,
                "partial_return": finite(collected) if how == ENDED_BY_RESET else None,
                "total_steps": self.total_steps,
                "complete": how == ENDED_BY_ENV,
                "agent_reset": how == ENDED_BY_RESET,
                "episode_wall_s": time.monotonic() - self.episode_started,
            }
        )
        self.episode_steps = 0
        self.episode_open = False
        self._ended_seed = self.seed
        if how != CUT_BY_RUN_END and self.tracker.add(counted, self.total_steps):
            self._end("converged")

    def _end(self, why: str) -> None:
        self.over = True
        self.ended_by = why

    def step_reply(self, invalid: int) -> dict[str, Any]:
        assert self._last is not None
        steps = self.total_steps
        # The step that ended an episode names its seed: once it is over, the seed is no secret.
        revealed = {"seed": self._ended_seed} if self._ended_seed is not None else {}
        return step_reply(
            self._last, done=self.over, step=steps, invalid=invalid, stage_over=self.over, total_steps=steps,
            **revealed,
        )  # fmt: skip

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        if not finished and self.episode_steps:
            self._close_episode(CUT_BY_RUN_END)  # the episode running when the run ended
        ended_by = self.ended_by or (f"{timeout}_timeout" if timeout else "agent" if abandoned else "evaluation_end")
        no_episode = {**self.item.fields, "episode": None, "seed": None, "steps": 0, "return": 0.0}
        records = self.done_episodes or [{**no_episode, "complete": False, "agent_reset": False}]
        last = len(records) - 1
        return [
            {
                **r,
                "total_steps": r.get("total_steps", 0),
                # Only the episode the timeout cut short timed out; the run's others were played.
                "timed_out": timeout is not None and i == last and not r["complete"] and not r.get("agent_reset"),
                "run_ended": ended_by,
                "converged_at": self.tracker.step,
            }
            for i, r in enumerate(records)
        ]

    def close(self) -> None:
        self._last = None
