"""Recording the actions of the first N episodes (``--record N``), for ``arbiter replay``: the
format's ``recorder`` hook.

A thin wrapper around the format's plan (Flatland's: replays re-run flatland envs): items below N
are opened wrapped in a ``RecordingEpisode`` that keeps every action it applies; every other item
is the plan's own object, so their step path is exactly what it is without recording. When a recorded
episode ends (finished, timed out or abandoned), its actions are written atomically to
``replays/episode-<index>.json`` in the results folder, with what is needed to play them
again: env path, seed and reward model.
"""

from __future__ import annotations

import logging
from typing import Any

from arbiter.server.formats.base import Plan
from arbiter.server.service.results import ResultsStore

log = logging.getLogger(__name__)

REPLAY_FORMAT = 1


class RecordingEpisode:
    """One opened item whose applied actions are kept; everything else is the wrapped item's."""

    def __init__(self, opened: Any, reward_model: str):
        self._opened = opened
        self.reward_model = reward_model
        self.actions: list[dict[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opened, name)

    def step(self, actions: dict[int, int]) -> bool:
        # The evaluation hands over a fresh dict per step (sanitize) and flatland only reads it,
        # so keeping the reference is safe.
        self.actions.append(actions)
        return self._opened.step(actions)


class RecordingPlan:
    """The plan, recording items ``0 .. record_episodes - 1``."""

    def __init__(self, plan: Any, *, store: ResultsStore, record_episodes: int):
        self._plan = plan
        self._store = store
        self.record_episodes = record_episodes
        # Opened recorded items by index, until their record arrives (an item prepared ahead is
        # opened before the previous one ends; one played again is opened anew).
        self._recording: dict[int, RecordingEpisode] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plan, name)

    def open(self, item: Any) -> Any:
        opened = self._plan.open(item)
        if item.index >= self.record_episodes:
            return opened
        recording = RecordingEpisode(opened, self._plan.rule.reward_model)
        self._recording[item.index] = recording
        return recording

    def episode_ended(self, record: dict[str, Any], evaluation: Any) -> None:
        """The Evaluation's ``on_episode``: write the replay of a recorded episode that was played."""
        recording = self._recording.pop(record["index"], None)
        if recording is None or record["skipped"]:
            return
        replay = {
            "format": REPLAY_FORMAT,
            "index": record["index"],
            "env": record["env"],
            "seed": self._plan.seed,
            "reward_model": recording.reward_model,
            "num_agents": record["num_agents"],
            "steps": len(recording.actions),
            # JSON keys are strings; ``arbiter replay`` turns the handles back into ints.
            "actions": [{str(handle): action for handle, action in step.items()} for step in recording.actions],
        }
        try:
            self._store.write_replay(record["index"], replay)
        except (OSError, ValueError) as exc:  # the evaluation matters more than its recording
            evaluation.counters["replays_unwritten"] += 1
            log.warning("cannot write the replay of episode %d: %s", record["index"], exc)


def recording_plan(plan: Plan, store: ResultsStore, record_episodes: int) -> RecordingPlan:
    """The ``recorder`` hook: ``plan`` recording its first ``record_episodes`` episodes."""
    return RecordingPlan(plan, store=store, record_episodes=record_episodes)
