"""Flatland's scoring rules (docs/formats/flatland.md): per-episode normalized return, then the mean (NeurIPS
2020) or the sum (flatland-rl 4.3.0's own rule) over episodes; secondary: mean fraction arrived.

Leaderboard figures: ``normalized_return`` and ``arrived_fraction`` (the score's primary and
secondary), and under NeurIPS 2020 ``round2_score``, the sum its round 2 ranked by."""

from __future__ import annotations

import math
import statistics
from abc import abstractmethod
from typing import Any

from arbiter.server.core.scoring import figure, spread, sum_spread
from arbiter.server.formats.base import Rule


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
        "secondary_name": "mean fraction of agents arrived",
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

    @abstractmethod
    def normalized_return(self, *, reward: float, max_episode_steps: int, num_agents: int, finished: bool) -> float: ...

    @abstractmethod
    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float: ...

    def figures(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        spreads = score.get("spread") or {}
        primary_spread = spreads.get("primary")
        return [
            figure(
                "normalized_return",
                score["primary_name"],
                score["primary"],
                higher_is_better=True,
                # A sum's interval is in the sum's units, or it could not be set beside its value.
                spread_map=sum_spread(primary_spread) if self.primary_sums else primary_spread,
            ),
            figure(
                "arrived_fraction",
                score["secondary_name"],
                score["secondary"],
                higher_is_better=True,
                spec=".3f",
                spread_map=spreads.get("secondary"),
            ),
        ]


class NeurIPS2020(FlatlandRule):
    """docs/formats/flatland.md: normalized return in [−1, 0], mean over episodes; timeout → −1.0."""

    name = "neurips2020"
    figure_names = ("normalized_return", "arrived_fraction", "round2_score")
    reward_model = "neurips2020"

    def normalized_return(self, *, reward: float, max_episode_steps: int, num_agents: int, finished: bool) -> float:
        if not finished:
            return -1.0
        return reward / (max_episode_steps * num_agents)

    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float:
        # Agents that reached their target before a timeout did arrive: the figure stays honest.
        return arrived / num_agents

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        return _aggregate(episodes, statistics.fmean, "mean normalized return")

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        return statistics.fmean(r["normalized_return"] for r in episodes)

    def figures(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        """Beside the mean, NeurIPS 2020 round 2's figure: the sum over episodes of the normalized
        return plus one (each episode counts between 0, not finished, and 1)."""
        shifted = [r["normalized_return"] + 1.0 for r in episodes]
        round2 = figure(
            "round2_score",
            "sum of normalized returns plus one (round 2)",
            math.fsum(shifted),
            higher_is_better=True,
            spec=".3f",
            spread_map=sum_spread(spread(shifted)) if shifted else None,
        )
        return [*super().figures(episodes, score), round2]


class Flatland3(FlatlandRule):
    """flatland-rl 4.3.0's own rule: env rewards, +1.0 per finished episode, timeout 0.0, sum."""

    name = "flatland3"
    figure_names = ("normalized_return", "arrived_fraction")
    reward_model = "flatland"
    primary_sums = True

    def normalized_return(self, *, reward: float, max_episode_steps: int, num_agents: int, finished: bool) -> float:
        if not finished:
            return 0.0
        return reward / (max_episode_steps * num_agents) + 1.0

    def arrived_fraction(self, *, arrived: int, num_agents: int, finished: bool) -> float:
        return arrived / num_agents if finished else 0.0

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        return _aggregate(episodes, math.fsum, "sum of normalized rewards")

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        return math.fsum(r["normalized_return"] for r in episodes)


RULES = {"neurips2020": NeurIPS2020, "flatland3": Flatland3}
