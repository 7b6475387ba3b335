"""The DIAMBRA format's difficulty-weighted score (docs/formats/diambra.md), from records alone.

Needs nothing from diambra-arena: a result rescores on any machine."""

from __future__ import annotations

import json

import pytest

from arbiter.server.formats.diambra.games import GAMES, SCORED_GAMES
from arbiter.server.formats.diambra.scoring import (
    Bounds,
    DifficultyWeightedRule,
    choose_bounds,
    episode_record,
    formula_bounds,
    rescore,
    weight,
)
from arbiter.server.formats.diambra.settings import DiambraSettings

# docs/formats/diambra.md, as published: levels (easy, medium, hard) and the documented reward bounds.
DOCUMENTED_LEVELS = {
    "doapp": (2, 3, 4),
    "sfiii3n": (4, 6, 8),
    "tektagt": (5, 7, 9),
    "umk3": (3, 4, 5),
    "samsh5sp": (4, 6, 8),
    "kof98umh": (4, 6, 8),
}
DOCUMENTED_BOUNDS = {
    "doapp": (-1872, 3328),
    "sfiii3n": (-1771, 3220),
    "tektagt": (-3276, 5824),
    "umk3": (-1992, 3652),
    "samsh5sp": (-1000, 1750),
    "kof98umh": (-1800, 2520),
}


def record(difficulty: str, reward: float, game: str = "doapp", **kwargs) -> dict:
    settings = DiambraSettings(game=game, difficulty=difficulty)
    return episode_record(
        settings, reward=reward, bounds=formula_bounds(game), seed=7, engine="mock", steps=100, **kwargs
    )


def test_difficulty_table_is_scorings():
    assert set(SCORED_GAMES) == set(DOCUMENTED_LEVELS)
    for game, (easy, medium, hard) in DOCUMENTED_LEVELS.items():
        assert GAMES[game].levels == {"easy": easy, "medium": medium, "hard": hard}
        for name, level in zip(("easy", "medium", "hard"), (easy, medium, hard), strict=True):
            assert DiambraSettings(game=game, difficulty=name).level == level


def test_formula_bounds_are_the_documented_values():
    for game, bounds in DOCUMENTED_BOUNDS.items():
        assert GAMES[game].formula_bounds() == bounds
        assert formula_bounds(game) == Bounds(bounds[0], bounds[1], "formula")


def test_worked_example_doapp_hard_and_medium():
    hard = record("hard", 1000.0)
    assert hard["k"] == pytest.approx(1 + 1 * 2872 / 5200)
    assert round(hard["k"], 4) == 1.5523
    assert round(hard["score"], 1) == 1552.3
    medium = record("medium", 1000.0)
    assert round(medium["score"], 1) == 1276.2
    assert medium["level"] == 3 and medium["easy_level"] == 2


def test_easy_scores_the_reward_itself():
    for reward in (-1872.0, -5.0, 0.0, 1000.0, 3328.0):
        easy = record("easy", reward)
        assert easy["k"] == 1.0
        assert easy["score"] == reward


def test_k_runs_from_one_to_the_level_ratio_and_is_clipped():
    low, high = -1872.0, 3328.0
    assert weight(low, low=low, high=high, level=4, easy_level=2) == 1.0
    assert weight(high, low=low, high=high, level=4, easy_level=2) == 2.0
    middle = (low + high) / 2
    assert weight(middle, low=low, high=high, level=4, easy_level=2) == pytest.approx(1.5)
    # outside the bounds, k stays at its ends
    assert weight(high + 500, low=low, high=high, level=4, easy_level=2) == 2.0
    assert weight(low - 500, low=low, high=high, level=4, easy_level=2) == 1.0
    assert record("hard", 5000.0)["score"] == 10000.0
    assert record("hard", -2000.0)["score"] == -2000.0


def test_timeout_scores_the_lowest_reward():
    timed_out = record("hard", 2500.0, timeout="step")
    assert timed_out["reward"] == -1872.0
    assert timed_out["partial_reward"] == 2500.0
    assert timed_out["k"] == 1.0 and timed_out["score"] == -1872.0
    assert not timed_out["finished"] and timed_out["timeout"] == "step"
    # whatever the agent had collected, stopping never beats playing the episode out
    assert timed_out["score"] <= record("hard", -1872.0)["score"]


def test_abandoned_and_unplayed_episodes_score_the_lowest_reward():
    abandoned = record("medium", 3000.0, abandoned=True)
    unplayed = record("medium", 0.0, played=False)
    for rec in (abandoned, unplayed):
        assert rec["reward"] == -1872.0 and rec["score"] == -1872.0 and not rec["finished"]


def test_record_holds_what_a_rescore_needs_and_is_plain_json():
    rec = record("hard", 1000.0, game="kof98umh", invalid_actions=3)
    for key in ("reward", "bounds", "bounds_source", "k", "difficulty", "level", "game", "settings", "seed", "engine"):
        assert key in rec
    assert rec["settings"]["difficulty"] == "hard" and rec["settings"]["game"] == "kof98umh"
    assert rec["invalid_actions"] == 3
    back = json.loads(json.dumps(rec))
    assert rescore(back) == (rec["k"], rec["score"])


def test_rule_means_rescored_episodes_not_stored_scores():
    records = [record("hard", 1000.0), record("hard", 0.0), record("hard", 0.0, timeout="planning")]
    expected = (1552.3077 + 0.0 * (1 + 1872 / 5200) + -1872.0) / 3
    records[0]["score"] = 1e9  # a stored score is never trusted
    rule = DifficultyWeightedRule()
    assert rule.primary(records) == pytest.approx(expected, abs=1e-3)
    aggregate = rule.aggregate(records)
    assert aggregate["primary"] == pytest.approx(expected, abs=1e-3)
    assert aggregate["secondary"] == pytest.approx((1000.0 + 0.0 - 1872.0) / 3)
    assert aggregate["timed_out"] == 1 and aggregate["episodes"] == 3
    assert aggregate["spread"]["primary"]["n"] == 3
    assert rule.primary([]) is None


def test_env_bounds_are_preferred_when_usable():
    assert choose_bounds("doapp", [-100.0, 200.0]) == Bounds(-100.0, 200.0, "env")
    for unusable in (None, [], [5.0, 5.0], [10.0, -10.0], [float("nan"), 1.0], [0.0, float("inf")]):
        assert choose_bounds("doapp", unusable) == Bounds(-1872.0, 3328.0, "formula")
