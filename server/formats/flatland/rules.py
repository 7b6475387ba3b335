"""Flatland's scoring rules (docs/formats/flatland.md): per-episode normalized return, then the mean (NeurIPS
2020) or the sum (flatland-rl 4.3.0's own rule) over episodes; secondary: mean fraction arrived.

Leaderboard figures: ``normalized_return`` and ``arrived_fraction`` (the score's primary and
secondary), and under NeurIPS 2020 ``round2_score``, the sum its round 2 ranked by.

``flatland3`` computes every figure with flatland-rl 4.3.0's service's own float arithmetic, to
the last digit: an episode's normalized reward summed step by step, and the figures over episodes
as pandas sums and means its results table (one row per line of the test folder's
``metadata.csv``, an unplayed episode's row empty, NaN, skipped by the mean), a NumPy sum of the
column with 0.0 in the empty rows."""

from __future__ import annotations

import math
import statistics
from abc import abstractmethod
from typing import Any

import numpy as np

from arbiter.server.core.scoring import spread, sum_spread
from arbiter.server.formats.base import Rule
from arbiter.server.formats.flatland.options import TEST_MIN_PERCENTAGE_COMPLETE_MEAN

ARRIVED_TITLE = "mean fraction of agents arrived"


def _per_test(episodes: list[dict[str, Any]], key: str, reduce: Any) -> dict[str, float]:
    tests: dict[str, list[float]] = {}
    for record in episodes:
        tests.setdefault(record["test"], []).append(record[key])
    return {test: reduce(values) for test, values in tests.items()}


def _aggregate(episodes: list[dict[str, Any]], primary_of: Any, primary_name: str) -> dict[str, Any]:
    """Primary: ``primary_of`` the episodes' normalized returns; secondary: mean arrived fraction."""
    returns = [r["normalized_return"] for r in episodes]
    arrived = [r["arrived_fraction"] for r in episodes]
    return {
        "primary": primary_of(returns),
        "secondary": statistics.fmean(arrived),
        "primary_name": primary_name,
        "secondary_name": ARRIVED_TITLE,
        "per_test": {
            "primary": _per_test(episodes, "normalized_return", primary_of),
            "secondary": _per_test(episodes, "arrived_fraction", statistics.fmean),
        },
        "spread": {"primary": spread(returns), "secondary": spread(arrived)},
    }


class FlatlandRule(Rule):
    """A Flatland rule: an episode's normalized return and arrived fraction from what the env
    reported, and the reward scheme its envs are built with."""

    reward_model: str  # flatland's rewards the envs use (sent to clients, kept with replays)
    primary_sums: bool = False  # the primary figure sums the episodes' normalized returns (not a mean)
    keeps_step_rewards: bool = False  # records keep the steps' rewards (``step_rewards``): the rule sums them
    played_only: bool = False  # the figures over episodes leave out those not played (not the worst score)

    @abstractmethod
    def normalized_return(
        self,
        *,
        reward: float,
        max_episode_steps: int,
        num_agents: int,
        finished: bool,
        step_rewards: list[float] | None = None,
    ) -> float: ...

    def stop_before(self, records: list[dict[str, Any]], next_test: str) -> str | None:
        """Why the evaluation stops before an episode of ``next_test`` is handed out, or None."""
        return None

    def legacy_figures(self, records: list[dict[str, Any]]) -> dict[str, float | None]:
        """flatland's four ENV_SUBMIT figures, unrounded: over every record, as the rule scores."""
        if not records:
            return dict.fromkeys(("mean_reward", "mean_normalized_reward", "sum_normalized_reward",
                                  "mean_percentage_complete"))  # fmt: skip
        normalized = [r["normalized_return"] for r in records]
        return {
            "mean_reward": statistics.fmean(r["reward"] for r in records),
            "mean_normalized_reward": statistics.fmean(normalized),
            "sum_normalized_reward": math.fsum(normalized),
            "mean_percentage_complete": statistics.fmean(r["arrived_fraction"] for r in records),
        }

    @abstractmethod
    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float: ...

    def figures(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        spreads = score.get("spread") or {}
        primary_spread = spreads.get("primary")
        return [
            # A sum's interval is in the sum's units, or it could not be set beside its value.
            self.figure_of(
                "normalized_return",
                score["primary"],
                sum_spread(primary_spread) if self.primary_sums else primary_spread,
            ),
            self.figure_of("arrived_fraction", score["secondary"], spreads.get("secondary")),
        ]


class NeurIPS2020(FlatlandRule):
    """docs/formats/flatland.md: normalized return in [−1, 0], mean over episodes; timeout → −1.0."""

    name = "neurips2020"
    figure_names = ("normalized_return", "arrived_fraction", "round2_score")
    described = {
        "normalized_return": ("mean normalized return", True, ".4f"),
        "arrived_fraction": (ARRIVED_TITLE, True, ".3f"),
        "round2_score": ("sum of normalized returns plus one (round 2)", True, ".3f"),
    }
    reward_model = "neurips2020"

    def normalized_return(
        self,
        *,
        reward: float,
        max_episode_steps: int,
        num_agents: int,
        finished: bool,
        step_rewards: list[float] | None = None,
    ) -> float:
        if not finished:
            return -1.0
        return reward / (max_episode_steps * num_agents)

    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float:
        # Agents that reached their target before a timeout did arrive: the figure stays honest.
        return arrived / num_agents

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        return _aggregate(episodes, statistics.fmean, self.described["normalized_return"][0])

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        return statistics.fmean(r["normalized_return"] for r in episodes)

    def figures(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        """Beside the mean, NeurIPS 2020 round 2's figure: the sum over episodes of the normalized
        return plus one (each episode counts between 0, not finished, and 1)."""
        shifted = [r["normalized_return"] + 1.0 for r in episodes]
        round2 = self.figure_of("round2_score", math.fsum(shifted), sum_spread(spread(shifted)) if shifted else None)
        return [*super().figures(episodes, score), round2]


class Flatland3(FlatlandRule):
    """flatland-rl 4.3.0's own rule: env rewards, +1.0 per finished episode, timeout 0.0, sum; the
    figures over the episodes it played (pandas skips an unplayed episode's empty row)."""

    name = "flatland3"
    figure_names = ("normalized_return", "arrived_fraction")
    described = {
        "normalized_return": ("sum of normalized rewards", True, ".4f"),
        "arrived_fraction": (ARRIVED_TITLE, True, ".3f"),
    }
    reward_model = "flatland"
    primary_sums = True
    keeps_step_rewards = True
    played_only = True  # an unplayed episode's row is empty, as in flatland's results table

    @property
    def min_test_completion(self) -> float:
        """No further Test is played after one whose finished episodes' mean fraction of agents
        arrived is below this (the competition's ``min_test_completion``, flatland's 0.25)."""
        options = self.options
        return options.min_test_completion if options is not None else TEST_MIN_PERCENTAGE_COMPLETE_MEAN

    def normalized_return(
        self,
        *,
        reward: float,
        max_episode_steps: int,
        num_agents: int,
        finished: bool,
        step_rewards: list[float] | None = None,
    ) -> float:
        """As flatland's service sums it: each step's reward over (steps × agents) added as the
        step comes, from 0, then 1.0. ``step_rewards`` holds the steps' non-zero rewards (a zero
        step adds exactly nothing); without it (a record written before it was kept) the
        episode's reward counts as one step's."""
        if not finished:
            return 0.0
        if step_rewards is None:
            step_rewards = [reward] if reward else []
        scale = max_episode_steps * num_agents
        normalized: float = 0  # flatland's running figure starts as the int 0
        for step_reward in step_rewards:
            normalized += step_reward / scale
        return normalized + 1.0

    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float:
        return arrived / num_agents if finished else 0.0

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        played = _played(episodes)
        returns = [r["normalized_return"] for r in played]
        arrived = [r["arrived_fraction"] for r in played]
        tests: dict[str, list[dict[str, Any]]] = {}
        for record in played:
            tests.setdefault(record["test"], []).append(record)
        return {
            "primary": pandas_sum(episodes, "normalized_return"),
            "secondary": pandas_mean(episodes, "arrived_fraction"),
            "primary_name": self.described["normalized_return"][0],
            "secondary_name": ARRIVED_TITLE,
            "per_test": {
                "primary": {test: pandas_sum(records, "normalized_return") for test, records in tests.items()},
                "secondary": {test: pandas_mean(records, "arrived_fraction") for test, records in tests.items()},
            },
            "spread": {"primary": spread(returns), "secondary": spread(arrived)},
        }

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        return pandas_sum(episodes, "normalized_return")

    def legacy_figures(self, records: list[dict[str, Any]]) -> dict[str, float | None]:
        """As flatland's service computes them from its results table: means and the sum over the
        played episodes' rows."""
        return {
            "mean_reward": pandas_mean(records, "reward"),
            "mean_normalized_reward": pandas_mean(records, "normalized_return"),
            "sum_normalized_reward": pandas_sum(records, "normalized_return"),
            "mean_percentage_complete": pandas_mean(records, "arrived_fraction"),
        }

    def stop_before(self, records: list[dict[str, Any]], next_test: str) -> str | None:
        """flatland's service, at each ENV_CREATE after the first: when the next episode is of
        another Test than the last one handed out, the mean fraction of agents arrived over that
        Test's finished episodes (NumPy's mean; 0.0 when none finished) must reach
        ``min_test_completion``, else the evaluation stops (ENV_CREATE answers with no episode)."""
        if not records or records[-1].get("test") == next_test:
            return None
        last_test = records[-1].get("test")
        finished = [r["arrived_fraction"] for r in records if r.get("test") == last_test and _finished(r)]
        mean = float(np.mean(finished)) if finished else 0.0
        if mean >= self.min_test_completion:
            return None
        return (
            f"the mean fraction of agents arrived in {last_test} ({len(finished)} finished episodes) was "
            f"{mean:.3f}, below {self.min_test_completion:g}"
        )


def _finished(record: dict[str, Any]) -> bool:
    ended = record.get("ended")
    if ended is not None:
        return ended == "finished"
    return not (record.get("timed_out") or record.get("abandoned") or record.get("skipped"))


def _played(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of episodes handed out (finished, timed out or abandoned): those with a row."""
    return [r for r in records if not r.get("skipped") and r.get("ended") != "not_played"]


def _column(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, int]:
    """``key`` as flatland's results table holds it: one float per row of the test folder's
    ``metadata.csv`` (the records' ``metadata_row``; a record without one takes its place in
    ``records``), 0.0 where no played episode wrote one, and the count of rows written."""
    rows = max((r.get("metadata_rows") or 0 for r in records), default=0)
    placed: list[tuple[int, float]] = []
    for position, record in enumerate(records):
        if record.get("skipped") or record.get("ended") == "not_played":
            continue
        row = record.get("metadata_row")
        placed.append((position if row is None else row, float(record[key])))
    size = max([rows, len(records), *(row + 1 for row, _ in placed)])
    column = np.zeros(size, dtype=np.float64)
    for row, value in placed:
        column[row] = value
    return column, len(placed)


def pandas_sum(records: list[dict[str, Any]], key: str) -> float:
    """pandas' ``Series.sum()`` of flatland's column: NaN rows as 0.0, NumPy's pairwise sum."""
    column, _ = _column(records, key)
    return float(column.sum())


def pandas_mean(records: list[dict[str, Any]], key: str) -> float | None:
    """pandas' ``Series.mean()``: that sum over the count of rows written (None when none)."""
    column, count = _column(records, key)
    if not count:
        return None
    return float(column.sum(dtype=np.float64) / np.float64(count))


RULES = {"neurips2020": NeurIPS2020, "flatland3": Flatland3}
