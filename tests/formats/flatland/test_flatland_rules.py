"""Flatland's scoring rules (docs/formats/flatland.md, "Scoring"): the worked episode, timeouts,
and the figures over episodes and per Test, computed here from the page's formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arbiter.server.formats.flatland.rules import RULES, Flatland3, NeurIPS2020


def test_the_worked_episode_of_the_neurips2020_rule():
    rule = NeurIPS2020()
    # 2 agents, max_episode_steps 22: neither arrives → −44 / 44; one arrives at step 10 → −31 / 44
    assert rule.normalized_return(reward=-44.0, max_episode_steps=22, num_agents=2, finished=True) == -1.0
    assert rule.normalized_return(reward=-31.0, max_episode_steps=22, num_agents=2, finished=True) == -31 / 44
    assert rule.arrived_fraction(arrived=1, num_agents=2, finished=True) == 0.5


def test_an_unfinished_episode_scores_the_rules_worst_and_keeps_or_drops_its_arrivals():
    neurips, flatland3 = NeurIPS2020(), Flatland3()
    assert neurips.normalized_return(reward=-3.0, max_episode_steps=22, num_agents=2, finished=False) == -1.0
    assert neurips.arrived_fraction(arrived=1, num_agents=2, finished=False) == 0.5  # arrived before the timeout
    assert flatland3.normalized_return(reward=-3.0, max_episode_steps=22, num_agents=2, finished=False) == 0.0
    assert flatland3.arrived_fraction(arrived=1, num_agents=2, finished=False) == 0.0


def test_flatland3_adds_one_to_a_finished_episodes_normalized_reward():
    assert Flatland3().normalized_return(reward=-31.0, max_episode_steps=22, num_agents=2, finished=True) == (
        pytest.approx(1 - 31 / 44)
    )


EPISODES = [
    {"test": "Test_0", "normalized_return": -0.25, "arrived_fraction": 1.0},
    {"test": "Test_0", "normalized_return": -0.75, "arrived_fraction": 0.5},
    {"test": "Test_1", "normalized_return": -1.0, "arrived_fraction": 0.0},
]


def test_neurips2020_means_and_flatland3_sums_over_episodes_and_per_test():
    mean, total = NeurIPS2020().aggregate(EPISODES), Flatland3().aggregate(EPISODES)
    assert mean["primary"] == pytest.approx(-2.0 / 3) and total["primary"] == -2.0
    assert mean["secondary"] == total["secondary"] == pytest.approx(0.5)
    assert mean["per_test"]["primary"] == {"Test_0": -0.5, "Test_1": -1.0}
    assert total["per_test"]["primary"] == {"Test_0": -1.0, "Test_1": -1.0}
    assert mean["per_test"]["secondary"] == {"Test_0": 0.75, "Test_1": 0.0}
    assert mean["spread"]["primary"]["n"] == 3
    assert NeurIPS2020().primary(EPISODES) == mean["primary"]
    assert Flatland3().primary(EPISODES) == total["primary"]


def test_the_rules_are_known_by_name_with_their_reward_models():
    assert {name: rule.reward_model for name, rule in RULES.items()} == {
        "neurips2020": "neurips2020",
        "flatland3": "flatland",
    }
    assert all(rule.name == name for name, rule in RULES.items())


def flatlands_running_sum(step_rewards: list[float], max_episode_steps: int, num_agents: int) -> float:
    """flatland-rl 4.3.0's service (handle_env_step): from 0, each step's reward over steps × agents
    as the step comes, then 1.0 when the episode is done."""
    normalized = 0
    for reward in step_rewards:
        normalized += reward / (max_episode_steps * num_agents)
    normalized += 1.0
    return normalized


def test_flatland3_sums_an_episodes_normalized_reward_step_by_step_as_flatlands_service():
    steps = [-36.0, -15.0, -26.0, -33.0]  # one reward per step; the steps in between paid 0
    flatland = flatlands_running_sum(steps, 122, 2)
    assert flatland != sum(steps) / 244 + 1.0  # dividing once is a digit off
    rule = Flatland3()
    assert (
        rule.normalized_return(
            reward=sum(steps), max_episode_steps=122, num_agents=2, finished=True, step_rewards=steps
        )
        == flatland
        == 0.5491803278688524
    )
    # a record from before the steps' rewards were kept: its reward counts as one step's
    assert rule.normalized_return(reward=-110.0, max_episode_steps=122, num_agents=2, finished=True) == -110 / 244 + 1


def test_flatland3s_figures_are_pandas_over_flatlands_results_table_its_empty_rows_skipped():
    """flatland's service keeps one row per metadata.csv line (NaN until played) and reports
    pandas' sum and means of its columns; the rule computes them from the records alone."""
    import pandas as pd

    returns = [0.24, 0.9, 0.0, 0.41, 0.28, 0.41, 0.12, 0.83, 0.37, 0.04, 0.61, 0.09]
    arrived = [0.5, 1.0, 0.0, 0.25, 1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.5, 1 / 3]
    rows = len(returns) + 2  # two episodes not played, between the others
    unplayed = {3, 9}
    records, table = [], []
    played = iter(zip(returns, arrived, strict=True))
    for row in range(rows):
        base = {"test": f"Test_{row // 7}", "metadata_row": row, "metadata_rows": rows, "reward": -float(row)}
        if row in unplayed:
            records.append({**base, "normalized_return": 0.0, "arrived_fraction": 0.0, "ended": "not_played"})
            table.append({"reward": np.nan, "normalized_reward": np.nan, "percentage_complete": np.nan})
        else:
            value, fraction = next(played)
            records.append({**base, "normalized_return": value, "arrived_fraction": fraction, "ended": "finished"})
            table.append({"reward": -float(row), "normalized_reward": value, "percentage_complete": fraction})
    frame = pd.DataFrame(table)
    # neither a correctly rounded sum nor NumPy's over the played episodes alone is pandas' sum
    assert frame["normalized_reward"].sum() not in (math.fsum(returns), float(np.array(returns).sum()))
    score = Flatland3().aggregate(records)
    assert score["primary"] == frame["normalized_reward"].sum()
    assert score["secondary"] == frame["percentage_complete"].mean()
    assert Flatland3().primary(records) == score["primary"]
    assert Flatland3().legacy_figures(records) == {
        "mean_reward": frame["reward"].mean(),
        "mean_normalized_reward": frame["normalized_reward"].mean(),
        "sum_normalized_reward": frame["normalized_reward"].sum(),
        "mean_percentage_complete": frame["percentage_complete"].mean(),
    }
    per_test = frame.assign(test=[r["test"] for r in records]).groupby("test")["percentage_complete"].mean()
    assert score["per_test"]["secondary"] == pytest.approx(per_test.to_dict())


def test_flatland3_stops_after_a_test_whose_finished_episodes_arrived_too_little():
    """flatland's service, at an ENV_CREATE for another Test than the last episode's: the mean
    fraction arrived over that Test's finished episodes (0.0 if none) below 0.25 stops it."""
    rule = Flatland3()

    def record(test: str, fraction: float, ended: str = "finished") -> dict:
        return {"test": test, "arrived_fraction": fraction, "ended": ended}

    poor = [record("Test_0", 0.2), record("Test_0", 0.25)]
    assert rule.stop_before(poor, "Test_0") is None  # within a Test: never checked
    assert "Test_0 (2 finished episodes) was 0.225, below 0.25" in rule.stop_before(poor, "Test_1")
    assert rule.stop_before([record("Test_0", 0.25), record("Test_0", 0.25)], "Test_1") is None
    # a timed-out episode's fraction is not among the finished ones
    assert rule.stop_before([record("Test_0", 0.5), record("Test_0", 0.0, "step_timeout")], "Test_1") is None
    assert "was 0.000" in rule.stop_before([record("Test_0", 0.0, "step_timeout")], "Test_1")
    assert rule.stop_before([], "Test_0") is None
    assert NeurIPS2020().stop_before(poor, "Test_1") is None  # not under neurips2020
