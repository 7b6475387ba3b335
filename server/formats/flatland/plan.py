"""The Flatland plan: one item per episode of the test folder, in (test, level) order.

Flatland is the one format whose env is mirrored by the client: ENV_CREATE sends the env's state
and the client computes its own observations, so a step needs no reply (flatland-rl's clients
send steps fire-and-forget) and the wire stays exactly flatland-rl's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arbiter.protocol.errors import ConfigError
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.core.summary import FINISHED, NOT_PLAYED
from arbiter.server.formats.base import Column, Item, OpenItem, Plan
from arbiter.server.formats.flatland.episodes import FlatlandEpisode, FlatlandTestFolder, sanitize_actions
from arbiter.server.formats.flatland.rules import FlatlandRule

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
EXTRA_COLUMNS = ["timed_out", "timeout", "ended", "debug"]
# The digits flatland's service rounds its submit figures to (compute_mean_scores).
LEGACY_DIGITS = {"mean_reward": 2, "mean_normalized_reward": 5, "mean_percentage_complete": 3}


def _rounded(value: float | None, digits: int | None) -> float | None:
    if value is None or digits is None:
        return value
    return float(round(np.float64(value), digits))


def _arrived(record: dict[str, Any]) -> str:
    return f"{record['arrived']}/{record['num_agents']}" if record.get("num_agents") else "-"


# What the progress line and the end table show (results.csv is flatland-rl's: ``csv_row``).
COLUMNS = (
    Column("env", "<22", label="", csv=False),
    Column("num_agents", ">6", title="agents", progress=False, csv=False),
    Column("steps", ">5", width=6, csv=False),
    Column("normalized_return", ".4f", label="return", title="return", width=9, csv=False),
    Column("arrived", ">5", value=_arrived, table=False, csv=False),
    Column("arrived_fraction", ">8.3f", title="arrived", progress=False, csv=False),
)


class FlatlandItem(OpenItem):
    """One opened episode of the test folder."""

    def __init__(self, item: Item, episode: FlatlandEpisode, plan: FlatlandPlan):
        super().__init__(item)
        self.episode = episode
        self._plan = plan

    @property  # type: ignore[override]
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
            "reward_model": self._plan.reward_model,
            "debug": self._plan.debug,
        }
        return body

    def sanitize(self, action: Any) -> tuple[dict[int, int], int]:
        return sanitize_actions(action, self.episode.num_agents)

    def step(self, action: dict[int, int]) -> bool:
        return self.episode.step(action)

    def step_reply(self, invalid: int) -> dict[str, Any]:
        return {"done": self.episode.done, "step": self.episode.steps, "invalid_actions": invalid}

    def record(self, ended: str) -> dict[str, Any]:
        episode = self.episode
        return self._plan.record(self.item, episode, episode.num_agents, finished=ended == FINISHED)

    def close(self) -> None:
        self.episode.close()


class FlatlandPlan(Plan):
    server_side = False  # the client mirrors the env; steps are answered only when asked
    prepare_ahead = True  # loading an env takes long: the next one is built while the agent thinks
    packages = ("flatland-rl",)  # versions recorded in the summary
    columns = COLUMNS
    rule: FlatlandRule

    def __init__(self, spec: Any, rule: FlatlandRule, *, tests: str | None = None):
        if tests is None:
            raise ConfigError("a Flatland evaluation needs a test folder (--tests DIR)")
        self.folder = FlatlandTestFolder(tests, seed=spec.seed, max_episodes=spec.max_episodes)
        self._episodes = self.folder.episodes
        super().__init__(spec, rule, tests=tests)
        self.debug = spec.debug
        self.source = tests
        if rule.played_only:
            # flatland3 leaves an unplayed episode's row empty: no figure counts it, not even as 0.
            self.unplayed_count = "in no figure"
        self.tests_dir = tests
        metadata = [c for c in self.folder.metadata_columns if c not in FLATLAND_RESULT_COLUMNS and c != "filename"]
        # flatland's table is indexed by the env file, its first column
        self._csv_columns = ["filename"] + (metadata or ["test_id", "env_id"]) + FLATLAND_RESULT_COLUMNS + EXTRA_COLUMNS

    @property
    def reward_model(self) -> str:
        """flatland's reward scheme the envs are built with: the scoring rule's."""
        return self.rule.reward_model

    @property
    def csv_columns(self) -> list[str]:
        """flatland-rl's result columns, after the test folder's metadata columns, then arbiter's."""
        return self._csv_columns

    def make_items(self) -> list[Item]:
        rows, count = self.folder.metadata_rows()
        return [
            Item(
                index=e.index,
                unit=e.env,
                fields={
                    "env": e.env,
                    "test": e.test,
                    "level": e.level,
                    # where flatland's results table holds the episode (rules.py sums it in that order)
                    "metadata_row": rows[e.env],
                    "metadata_rows": count,
                },
            )
            for e in self._episodes
        ]

    def open(self, item: Item) -> FlatlandItem:
        keep = self.rule.keeps_step_rewards
        return FlatlandItem(item, self.folder.open(self._episodes[item.index], self.reward_model, keep), self)

    def stop_before(self, item: Item, records: list[dict[str, Any]]) -> str | None:
        return self.rule.stop_before(records, item.fields["test"])

    def record(self, item: Item, episode: FlatlandEpisode | None, num_agents: int | None, *, finished: bool) -> dict:
        if episode is not None:
            max_steps, steps, reward, arrived = (
                episode.max_episode_steps,
                episode.steps,
                episode.reward,
                episode.arrived(),
            )
            step_rewards, deadlocked = episode.step_rewards, episode.deadlocked
        else:
            max_steps, steps, reward, arrived = None, 0, 0.0, 0
            step_rewards, deadlocked = ([] if self.rule.keeps_step_rewards else None), None
        rule = self.rule
        normalized = rule.normalized_return(
            reward=reward,
            max_episode_steps=max_steps or 1,
            num_agents=num_agents or 1,
            finished=finished,
            step_rewards=step_rewards,
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
            "reward_model": self.reward_model,  # what ``reward`` was earned under (rescore.py)
            "normalized_return": normalized,
            "arrived": arrived,
            "arrived_fraction": arrived_fraction,
            "malfunctions": episode.malfunctions if episode is not None else 0,
            "deadlocked": deadlocked if finished else None,
            "seed": self.seed,
            **({} if step_rewards is None else {"step_rewards": list(step_rewards)}),
        }

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        return [self.record(item, None, None, finished=False)]

    def handshake(self) -> dict[str, Any]:
        return {"reward_model": self.reward_model}

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Flatland's four submit figures, which legacy clients print, rounded as flatland's
        service rounds them (``round`` of a NumPy float: NumPy's rounding); the sum is not."""
        figures = self.rule.legacy_figures(records)
        return {key: _rounded(value, LEGACY_DIGITS.get(key)) for key, value in figures.items()}

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"filename": record["env"], **self.folder.metadata.get(record["env"], {})}
        if len(row) == 1:
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
                # flatland's count after a finished episode's last step; empty otherwise (its NaN)
                "nb_deadlocked_trains": "" if record.get("deadlocked") is None else record["deadlocked"],
                "controller_inference_time_min": think.get("min", 0.0),
                "controller_inference_time_mean": think.get("mean", 0.0),
                "controller_inference_time_max": think.get("max", 0.0),
                "timed_out": record["timed_out"],
                "timeout": record.get("timeout") or "",
                "ended": record.get("ended", ""),
                "debug": record.get("debug", False),
            }
        )
        if self.rule.played_only and record.get("ended") == NOT_PLAYED:
            row.update(dict.fromkeys(FLATLAND_RESULT_COLUMNS, ""))  # flatland's NaN: no figure, none counted
        return row
