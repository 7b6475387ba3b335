"""The difficulty-weighted score (docs/formats/diambra.md), as pure functions over episode records.

R is an episode's total cumulative reward. Easy: score = R. Medium and Hard: score = R × k(R),
where k grows linearly from 1 at the lowest possible R to L_D / L_Easy at the highest, and is
clipped to that range (an R outside the bounds never weighs more or less than the ends):

    k(R) = 1 + (L_D / L_Easy − 1) × (R − R_min) / (R_max − R_min)

The bounds are the env's own (``get_cumulative_reward_bounds()``) when it reports usable ones,
else DIAMBRA's documented formula; a record says which. A timed-out or unplayed episode gets
R = R_min (so stopping early never beats playing on) and k = 1. Every figure recomputes from the
record's R, bounds and levels, never from a stored score, so a results folder rescores offline.

Leaderboard figures: ``score`` (the mean weighted score) and ``reward`` (the mean R); the game,
difficulty, level and engine describe the evaluation beside them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.server.formats.base import Rule
from arbiter.server.formats.diambra.engine import ENGINE_MOCK, MOCK_NOTE
from arbiter.server.formats.diambra.games import GAMES
from arbiter.server.formats.diambra.settings import DiambraSettings

RULE_NAME = "difficulty-weighted"


@dataclass(frozen=True)
class Bounds:
    low: float  # R_min
    high: float  # R_max
    source: str  # "env": reported by the env; "formula": DIAMBRA's documented formula


def formula_bounds(game_id: str) -> Bounds:
    low, high = GAMES[game_id].formula_bounds()
    return Bounds(low, high, "formula")


def choose_bounds(game_id: str, env_bounds: Sequence[float] | None) -> Bounds:
    """The env's bounds when it gives two finite numbers low < high, else the formula's."""
    if env_bounds is not None and len(env_bounds) == 2:
        low, high = (float(b) for b in env_bounds)
        if math.isfinite(low) and math.isfinite(high) and low < high:
            return Bounds(low, high, "env")
    return formula_bounds(game_id)


def weight(reward: float, *, low: float, high: float, level: int, easy_level: int) -> float:
    """k(R): 1 at R_min, L_D / L_Easy at R_max, linear between, clipped to [1, L_D / L_Easy]."""
    ratio = level / easy_level
    if ratio <= 1.0:
        return 1.0
    k = 1.0 + (ratio - 1.0) * (reward - low) / (high - low)
    return min(max(k, 1.0), ratio)


def weighted_score(reward: float, *, low: float, high: float, level: int, easy_level: int) -> tuple[float, float]:
    """(k, score) of one episode."""
    k = weight(reward, low=low, high=high, level=level, easy_level=easy_level)
    return k, reward * k


def episode_record(
    settings: DiambraSettings,
    *,
    reward: float,
    bounds: Bounds,
    seed: int | None,
    engine: str,
    steps: int,
    invalid_actions: int = 0,
    timeout: str | None = None,
    abandoned: bool = False,
    played: bool = True,
    episode: int = 0,
) -> dict[str, Any]:
    """The record of one episode. ``timeout`` names the budget that ran out, if one did;
    ``abandoned``: the agent left the episode before its end (a reset, a lost connection);
    ``played`` is False for an episode the evaluation never reached. In all three R = R_min (an
    agent cannot lock in a good start by leaving), and the reward the agent had collected is kept
    as ``partial_reward``."""
    game = GAMES[settings.game]
    finished = played and timeout is None and not abandoned
    scored_reward = float(reward) if finished else bounds.low
    level, easy_level = game.levels[settings.difficulty], game.levels["easy"]
    k, score = weighted_score(scored_reward, low=bounds.low, high=bounds.high, level=level, easy_level=easy_level)
    formula_low, formula_high = game.formula_bounds()
    return {
        "episode": episode,
        "game": settings.game,
        "difficulty": settings.difficulty,
        "level": level,
        "easy_level": easy_level,
        "reward": scored_reward,
        "partial_reward": None if finished else float(reward),
        "bounds": [bounds.low, bounds.high],
        "bounds_source": bounds.source,
        "formula_bounds": [formula_low, formula_high],
        "k": k,
        "score": score,
        "finished": finished,
        "timeout": timeout,
        "abandoned": abandoned,
        "played": played,
        "steps": steps,
        "invalid_actions": invalid_actions,
        "seed": seed,
        "engine": engine,
        "settings": settings.as_record(),
    }


def rescore(record: dict[str, Any]) -> tuple[float, float]:
    """(k, score) of a record, from its R, bounds and levels alone."""
    low, high = record["bounds"]
    return weighted_score(
        float(record["reward"]), low=low, high=high, level=record["level"], easy_level=record["easy_level"]
    )


class DifficultyWeightedRule(Rule):
    """An evaluation of N episodes scores the mean of their weighted scores; the secondary
    figure is the mean unweighted reward R."""

    name = RULE_NAME
    options: DiambraSettings | None
    described = {
        "score": ("mean difficulty-weighted score", True, ".2f"),
        "reward": ("mean cumulative reward", True, ".2f"),
    }

    def primary(self, records: list[dict[str, Any]]) -> float | None:
        scores = [rescore(r)[1] for r in records]
        return statistics.fmean(scores) if scores else None

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        from arbiter.server.core.scoring import spread  # the core's spread figures (std, bootstrap interval)

        scores = [rescore(r)[1] for r in records]
        rewards = [float(r["reward"]) for r in records]
        return {
            "primary": statistics.fmean(scores) if scores else None,
            "secondary": statistics.fmean(rewards) if rewards else None,
            "primary_name": self.described["score"][0],
            "secondary_name": self.described["reward"][0],
            "primary_higher_is_better": True,
            "episodes": len(records),
            "timed_out": sum(1 for r in records if r.get("timeout")),
            "abandoned": sum(1 for r in records if r.get("abandoned")),
            "unplayed": sum(1 for r in records if not r.get("played", True)),
            "spread": {
                "primary": spread(scores) if scores else None,
                "secondary": spread(rewards) if rewards else None,
            },
            "rule": {"name": RULE_NAME, "levels": _levels(records)},
        }

    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        spreads = score.get("spread") or {}
        primary, secondary = spreads.get("primary"), spreads.get("secondary")
        return [
            self.figure_of("score", score["primary"], primary),
            self.figure_of("reward", score["secondary"], secondary),
        ]

    def context(self, records: list[dict[str, Any]], score: dict[str, Any]) -> dict[str, Any]:
        """The game, difficulty and level played (as the score's rule records them, else as the
        competition set them), and the engine the episodes ran on."""
        levels = (score.get("rule") or {}).get("levels") or {}
        settings = self.options
        return {
            "game": levels.get("game", settings.game if settings is not None else None),
            "difficulty": levels.get("difficulty", settings.difficulty if settings is not None else None),
            "level": levels.get("level"),
            "engine": score["engine"] if "engine" in score else engine_of(records),
        }


def engine_of(records: list[dict[str, Any]]) -> str | None:
    """The engine the episodes ran on ("mock": DIAMBRA's engine mock), or the engines, when
    they differ; None without records."""
    engines = sorted({str(r.get("engine")) for r in records})
    return engines[0] if len(engines) == 1 else "mixed: " + ", ".join(engines) if engines else None


def _levels(records: list[dict[str, Any]]) -> dict[str, Any]:
    if not records:
        return {}
    first = records[0]
    return {
        "game": first["game"],
        "difficulty": first["difficulty"],
        "level": first["level"],
        "easy": first["easy_level"],
    }


EPISODE_FIELDS = (
    "episode",
    "seed",
    "reward",
    "partial_reward",
    "k",
    "score",
    "bounds",
    "bounds_source",
    "level",
    "ended",
    "steps",
    "invalid_actions",
    "engine",
)


class DiambraRule(DifficultyWeightedRule):
    """The difficulty-weighted rule as a DIAMBRA evaluation reports it: the domain's figures
    (primary = mean score, secondary = mean R, their spread), plus each episode's figures and
    the engine the episodes ran on ("mock" says the score comes from the engine mock). Its name
    is the one the format registers it under, so a summary names the rule that rescores it."""

    name = "diambra"
    figure_names = ("score", "reward")
    context_names = ("game", "difficulty", "level", "engine")

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        figures = super().aggregate(records)
        engines = sorted({str(r.get("engine")) for r in records})
        per_episode = []
        for record in records:
            k, score = rescore(record)
            per_episode.append({**{key: record.get(key) for key in EPISODE_FIELDS}, "k": k, "score": score})
        return {
            **figures,
            "engine": engine_of(records),
            "engine_note": MOCK_NOTE if ENGINE_MOCK in engines else None,
            "per_episode": per_episode,
        }
