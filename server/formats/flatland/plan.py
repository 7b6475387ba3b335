"""The Flatland plan: one item per episode of the test folder, in (test, level) order.

Flatland is the one format whose env is mirrored by the client: ENV_CREATE sends the env's state
and the client computes its own observations, so a step needs no reply (flatland-rl's clients
send steps fire-and-forget) and the wire stays exactly flatland-rl's.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.formats.base import Item
from arbiter.server.formats.flatland.episodes import FlatlandEpisode, FlatlandTestFolder, sanitize_actions

# flatland-rl's result columns, in its order, so tools reading its CSV read ours.
FLATLAND_RESULT_COLUMNS = [
    "reward",
    "normalized_reward",
    "percentage_complete",
    "steps",
    "simulation_time",
    "nb_malfunctioning_trains",
    "nb_deadlocked_trains",
    "controller_inference_time_min",
    "controller_inference_time_mean",
    "controller_inference_time_max",
]
EXTRA_COLUMNS = ["timed_out", "timeout", "debug"]


class FlatlandItem:
    """One opened episode of the test folder."""

    spans_resets = False
    stage_budget_s = None

    def __init__(self, item: Item, episode: FlatlandEpisode, plan: FlatlandPlan):
        self.item = item
        self.episode = episode
        self._plan = plan

    @property
    def steps(self) -> int:
        return self.episode.steps

    @property
    def num_agents(self) -> int:
        return self.episode.num_agents

    def create_payload(self) -> dict[str, Any]:
        body = self.episode.create_payload()
        body[EXTENSION_KEY] = {
            "env_state": self.episode.wire_state,
            "episode": self.item.index,
            "episodes": len(self._plan.items),
            "reward_model": self._plan.rule.reward_model,
            "debug": self._plan.debug,
        }
        return body

    def next_reset(self) -> dict[str, Any]:  # pragma: no cover - an episode never spans resets
        raise NotImplementedError

    def sanitize(self, action: Any) -> tuple[dict[int, int], int]:
        return sanitize_actions(action, self.episode.num_agents)

    def step(self, action: dict[int, int]) -> bool:
        return self.episode.step(action)

    def step_reply(self, invalid: int) -> dict[str, Any]:
        return {"done": self.episode.done, "step": self.episode.steps, "invalid_actions": invalid}

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        episode = self.episode
        return [self._plan.record(self.item, episode, episode.num_agents, finished=finished)]

    def close(self) -> None:
        self.episode.close()


class FlatlandPlan:
    server_side = False  # the client mirrors the env; steps are answered only when asked
    prepare_ahead = True  # loading an env takes long: the next one is built while the agent thinks
    packages = ("flatland-rl",)  # versions recorded in the summary

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        from arbiter.protocol.errors import ConfigError

        if tests is None:
            raise ConfigError("a Flatland evaluation needs a test folder (--tests DIR)")
        self.rule = rule
        self.debug = spec.debug
        self.folder = FlatlandTestFolder(tests, seed=spec.seed, max_episodes=spec.max_episodes)
        self.seed = spec.seed
        self.source = tests
        self.tests_dir = tests
        self._episodes = self.folder.episodes
        self.items = [
            Item(index=e.index, key=e.env, fields={"env": e.env, "test": e.test, "level": e.level})
            for e in self._episodes
        ]
        columns = [c for c in self.folder.metadata_columns if c not in FLATLAND_RESULT_COLUMNS]
        self.csv_columns = (columns or ["test_id", "env_id"]) + FLATLAND_RESULT_COLUMNS + EXTRA_COLUMNS

    def open(self, item: Item) -> FlatlandItem:
        return FlatlandItem(item, self.folder.open(self._episodes[item.index], self.rule.reward_model), self)

    def record(self, item: Item, episode: FlatlandEpisode | None, num_agents: int | None, *, finished: bool) -> dict:
        if episode is not None:
            max_steps, steps, reward, arrived = (
                episode.max_episode_steps,
                episode.steps,
                episode.reward,
                episode.arrived(),
            )
        else:
            max_steps, steps, reward, arrived = None, 0, 0.0, 0
        rule = self.rule
        normalized = rule.normalized_return(
            reward=reward, max_episode_steps=max_steps or 1, num_agents=num_agents or 1, finished=finished
        )
        arrived_fraction = (
            rule.arrived_fraction(arrived=arrived, num_agents=num_agents, finished=finished) if num_agents else 0.0
        )
        return {
            **item.fields,
            "num_agents": num_agents,
            "max_episode_steps": max_steps,
            "steps": steps,
            "reward": reward,
            "normalized_return": normalized,
            "arrived": arrived,
            "arrived_fraction": arrived_fraction,
            "malfunctions": episode.malfunctions if episode is not None else 0,
            "seed": self.seed,
        }

    def unplayed(self, item: Item) -> list[dict[str, Any]]:
        return [self.record(item, None, None, finished=False)]

    def handshake(self) -> dict[str, Any]:
        return {"reward_model": self.rule.reward_model}

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Flatland's four submit figures, which legacy clients print."""
        normalized = [r["normalized_return"] for r in records]
        return {
            "mean_reward": statistics.fmean(r["reward"] for r in records) if records else None,
            "mean_normalized_reward": statistics.fmean(normalized) if normalized else None,
            "sum_normalized_reward": math.fsum(normalized) if normalized else None,
            "mean_percentage_complete": statistics.fmean(r["arrived_fraction"] for r in records) if records else None,
        }

    def progress_text(self, record: dict[str, Any]) -> str:
        arrived = f"{record['arrived']}/{record['num_agents']}" if record["num_agents"] else "-"
        figure = record["normalized_return"]
        return f"{record['env']:<22} steps {record['steps']:>5}  return {figure:.4f}  arrived {arrived:>5}"

    def table_header(self) -> str:
        return f"{'env':<22} {'agents':>6} {'steps':>6} {'return':>9} {'arrived':>8}"

    def table_row(self, r: dict[str, Any]) -> str:
        return (
            f"{r['env']:<22} {r['num_agents'] or '-':>6} {r['steps']:>6} "
            f"{r['normalized_return']:>9.4f} {r['arrived_fraction']:>8.3f}"
        )

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = dict(self.folder.metadata.get(record["env"], {}))
        if not row:
            row.update({"test_id": record["test"], "env_id": record["level"]})
        think = record.get("step_think_s") or {}
        row.update(
            {
                "reward": record["reward"],
                "normalized_reward": record["normalized_return"],
                "percentage_complete": record["arrived_fraction"],
                "steps": record["steps"],
                "simulation_time": record["wall_s"],
                "nb_malfunctioning_trains": record.get("malfunctions", 0),
                "nb_deadlocked_trains": "",
                "controller_inference_time_min": think.get("min", 0.0),
                "controller_inference_time_mean": think.get("mean", 0.0),
                "controller_inference_time_max": think.get("max", 0.0),
                "timed_out": record["timed_out"],
                "timeout": record.get("timeout") or "",
                "debug": record.get("debug", False),
            }
        )
        return row

    def close(self) -> None:
        pass
