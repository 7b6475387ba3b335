"""Flatland's scoring rules (docs/formats/flatland.md, "Scoring"): the worked episode, timeouts,
and the figures over episodes and per Test, computed here from the page's formulas."""

from __future__ import annotations

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
