"""The two-phase format's items: an evaluation episode, and a training run of many episodes.

Both are ``gym_episode.GymEpisode``s of the one Gymnasium env the plan owns: reset with the
seeds the server derives, each seed recorded and kept secret until its episode ends, actions
outside the action space refused (see ``gym_episode``).
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.server.core.summary import FINISHED, STEP_LIMIT
from arbiter.server.formats.base import Item, finite, reset_seed, step_reply
from arbiter.server.formats.gym_episode import GymEpisode
from arbiter.server.formats.two_phase.convergence import ConvergenceTracker
from arbiter.server.formats.two_phase.options import TwoPhaseOptions, worst_return

# How a training episode ended: the env ended it (terminated or truncated), the agent reset
# mid-episode, or the run's end cut it short (its step limit, a timeout, the evaluation's end).
ENDED_BY_ENV, ENDED_BY_RESET, CUT_BY_RUN_END = "env", "reset", "run_end"


class EvalEpisode(GymEpisode):
    """One evaluation episode (phase 1, or after a training run). A timed-out or abandoned one
    scores ``worst_return``, never its partial return."""


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


class TrainingRun(GymEpisode):
    """One phase-2 training run: the agent resets and steps the server's env as often as it
    likes; the server counts env steps, records every episode, and ends the run when it has
    converged or reached ``max_steps`` (the step that reaches it cuts the running episode).

    A reset ends the running episode, whatever its length (even none: rerolling the initial
    state is not free): it is recorded with ``agent_reset``, its steps stay counted, and it takes
    part in the convergence criterion with its partial return, capped where rewards can be
    negative (``reset_episode_cap``), so an agent cannot hide its bad episodes by abandoning
    them. When such an episode completes the
    criterion, the run has converged at that reset; the episode the reset hands out is never
    played: its first step ends the run (nothing applied, ``truncated``).

    A run holds at most ``max_steps`` episodes, the most an agent that steps can end (an episode
    the env ends took a step): the reset that ends the last of them ends the run at its limit, the
    same way. Resets that step nowhere would otherwise each cost a record, with no bound but the
    run's time budget."""

    spans_resets = True

    def __init__(self, env: Any, item: Item, options: TwoPhaseOptions, base_seed: int | None):
        p2 = options.phase2
        self.max_steps = p2.max_steps
        self.stage_budget_s = p2.run_budget_s
        self.base_seed = base_seed
        self.run = item.fields["run"]
        self.reset_cap = reset_episode_cap(options, env)
        self.tracker = ConvergenceTracker(p2.goal_reward, p2.stability_window, p2.criterion)
        self.total_steps = 0
        self.done_episodes: list[dict[str, Any]] = []
        self.episode = 0
        self.run_over = False  # converged or at max_steps (``over`` is the running episode's)
        self._ended_seed: int | None = None  # the seed of the episode the last step ended, if it did
        super().__init__(env, item, reset_seed(base_seed, 2, self.run, 0))

    def begin(self, seed: int | None) -> None:
        super().begin(seed)
        self.episode_started = time.monotonic()
        self.episode_open = True  # an episode was reset and has not ended yet

    def place(self) -> dict[str, Any]:
        return {**self.item.fields, "episode": self.episode}

    def next_reset(self) -> dict[str, Any]:
        if self.run_over:  # converged at the previous reset: the episode it handed out is still the one
            return self.create_payload()
        if self.episode_open:
            self._close_episode(ENDED_BY_RESET)
        if not self.run_over and len(self.done_episodes) >= self.max_steps:
            self.run_over = True
            self.limit_reached = True
        self.episode += 1
        self.begin(reset_seed(self.base_seed, 2, self.run, self.episode))
        return self.create_payload()

    def step(self, action: Any) -> bool:
        self._ended_seed = None
        if self.run_over:  # converged at the reset before this step: the run ends, nothing is applied
            self.last_step = (self.observation, 0.0, False, True, {})
            return True
        ended = super().step(action)
        self.total_steps += 1
        if ended:
            self._close_episode(ENDED_BY_ENV)
        if not self.run_over and self.total_steps >= self.max_steps:
            if not ended:
                self._close_episode(CUT_BY_RUN_END)
                # the run's step limit cuts the episode: the agent sees it end
                observation, reward, terminated, _, info = self.last_step  # type: ignore[misc]
                self.last_step = (observation, reward, terminated, True, info)
            self.run_over = True
            self.limit_reached = True
        return self.run_over

    def _close_episode(self, how: str) -> None:
        """Record the running episode; one that counts goes to the convergence criterion."""
        collected = self.total_return
        counted = collected
        if how == ENDED_BY_RESET and self.reset_cap is not None:
            counted = min(collected, self.reset_cap)
        self.done_episodes.append(
            {
                **self.item.fields,
                "episode": self.episode,
                "seed": self.seed,
                "steps": self.steps,
                "return": counted,
                "partial_return": finite(collected) if how == ENDED_BY_RESET else None,
                "total_steps": self.total_steps,
                "complete": how == ENDED_BY_ENV,
                "agent_reset": how == ENDED_BY_RESET,
                "episode_wall_s": time.monotonic() - self.episode_started,
            }
        )
        self.steps = 0
        self.episode_open = False
        self._ended_seed = self.seed
        if how != CUT_BY_RUN_END and self.tracker.add(counted, self.total_steps):
            self.run_over = True  # converged: the run finished

    def step_reply(self, invalid: int) -> dict[str, Any]:
        if self.last_step is None:
            raise RuntimeError("TrainingRun.step_reply before any step")
        steps = self.total_steps
        # The step that ended an episode names its seed: once it is over, the seed is no secret.
        revealed = {"seed": self._ended_seed} if self._ended_seed is not None else {}
        return step_reply(
            self.last_step, done=self.run_over, step=steps, invalid=invalid, stage_over=self.run_over,
            total_steps=steps, **revealed,
        )  # fmt: skip

    def records_for(self, ended: str) -> list[dict[str, Any]]:
        """Every episode of the run; only the one a timeout cut short is ``timed_out`` (the
        run's others were played), and the run's ending is each record's ``ended``."""
        if ended not in (FINISHED, STEP_LIMIT) and self.steps:
            self._close_episode(CUT_BY_RUN_END)  # the episode running when the run ended
        no_episode = {**self.item.fields, "episode": None, "seed": None, "steps": 0, "return": 0.0}
        records = self.done_episodes or [{**no_episode, "complete": False, "agent_reset": False}]
        last = len(records) - 1
        timed_out = ended.endswith("_timeout")
        return [
            {
                **r,
                "total_steps": r.get("total_steps", 0),
                "timed_out": timed_out and i == last and not r["complete"] and not r.get("agent_reset"),
                "converged_at": self.tracker.step,
            }
            for i, r in enumerate(records)
        ]
