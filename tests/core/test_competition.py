"""Competition specs (validated at load) and scoring rules (aggregation, spread)."""

from __future__ import annotations

import math

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.core.competition import CompetitionSpec, load_competition, preset_names, spec_from_dict
from arbiter.server.core.scoring import scoring_rule
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020


def test_presets_load_with_the_official_budgets():
    assert {"flatland-neurips2020", "flatland-debug", "flatland3"} <= set(preset_names())
    official = load_competition("flatland-neurips2020")
    assert official.budgets == BudgetPolicy(planning_s=300, step_s=5, overall_s=8 * 3600, idle_s=300)
    debug = load_competition("flatland-debug")
    assert debug.debug is True and debug.max_episodes == 28 and debug.budgets.overall_s == 48 * 60
    assert load_competition("flatland3").scoring == "flatland3"


def test_debug_mode_caps_episodes_and_overall_time():
    spec = load_competition().with_budgets(overall_s=60.0).with_debug()
    assert spec.debug and spec.max_episodes == 28 and spec.budgets.overall_s == 60.0
    assert load_competition().with_debug().budgets.overall_s == 48 * 60


def test_a_competition_file_is_validated(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('scoring = "flatland3"\nseed = 7\n[budgets]\nstep_s = 2.5\n')
    spec = load_competition(str(good))
    assert (spec.name, spec.scoring, spec.seed, spec.budgets.step_s) == ("mine", "flatland3", 7, 2.5)
    for text, message in [
        ('scorring = "neurips2020"\n', "unknown keys"),
        ("[budgets]\nstep = 5\n", "unknown budget keys"),
        ("[budgets]\nstep_s = -1\n", "positive"),
        ("[budgets]\nmax_successive_timeouts = 0\n", ">= 1"),
        ('scoring = "best"\n', "unknown scoring rule"),
        ('adapter = "atari"\n', "unknown format"),
        ('format = "atari"\n', "unknown format"),
        ("max_episodes = 0\n", "max_episodes"),
        ("seed = = 3\n", "mine.toml"),
    ]:
        good.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_competition(str(good))
    good.write_bytes('scoring = "flatland3"\n# caf\xe9\n'.encode("latin-1"))  # saved by a Latin-1 editor
    with pytest.raises(ConfigError, match="mine.toml is not UTF-8 text, as a TOML file must be"):
        load_competition(str(good))
    with pytest.raises(ConfigError, match="unknown competition"):
        load_competition("no-such-preset")
    with pytest.raises(ConfigError, match="--phase: competition 'flatland-neurips2020' .* has no phases"):
        load_competition("flatland-neurips2020", phase=1)
    assert load_competition("two-phase-cartpole", phase=1).options.phase == 1
    with pytest.raises(ConfigError, match="must be a table"):
        spec_from_dict("x", {"budgets": 3})


def test_an_unknown_key_is_told_with_every_key_the_file_may_hold(tmp_path):
    """A misspelt core key is named with the core keys and the format's own as the ones allowed,
    not with the format's alone (the core's would then look unknown too)."""
    mine = tmp_path / "mine.toml"
    for text, own in [("max_episode = 3\n", ["min_test_completion"]), ('format = "diambra"\nrecord = 1\n', ["game"])]:
        mine.write_text(text)
        with pytest.raises(ConfigError) as raised:
            load_competition(str(mine))
        message = str(raised.value)
        assert "unknown keys [" in message and "allowed: [" in message, message
        allowed = message.split("allowed: ", 1)[1]
        for key in ["accept_pickle", "budgets", "debug", "max_episodes", "record_episodes", "seed", "tests", *own]:
            assert f"'{key}'" in allowed, (key, message)


def test_a_relative_test_folder_is_the_competition_file_s_wherever_the_command_runs(tmp_path, monkeypatch):
    """A worker started in another folder than the organiser's reads the same data; a --set
    tests=... is a path of the command line, where it runs."""
    folder = tmp_path / "competition"
    folder.mkdir()
    (folder / "mine.toml").write_text('tests = "data/flatland"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_competition(str(folder / "mine.toml")).tests == str(folder / "data" / "flatland")
    assert load_competition("../competition/mine.toml").tests == str(folder / "data" / "flatland")
    assert load_competition(str(folder / "mine.toml"), ["tests=given"]).tests == "given"
    (folder / "mine.toml").write_text('tests = "/srv/tests"\n')
    assert load_competition(str(folder / "mine.toml")).tests == "/srv/tests"


def test_an_unknown_format_is_told_how_a_format_joins(tmp_path):
    """A competition naming a format not installed (its package's entry point missing) says, in
    one message, what is known and how a format kept outside arbiter joins."""
    mine = tmp_path / "chess.toml"
    mine.write_text('format = "chess"\n')
    joins = "joins by an 'arbiter.formats' entry point of its installed package, or with register_format"
    for load in (lambda: load_competition(str(mine)), lambda: spec_from_dict("chess", {"format": "chess"})):
        with pytest.raises(ConfigError) as raised:
            load()
        message = str(raised.value)
        assert message.count("unknown format 'chess'; known: flatland, two-phase, diambra, metalc") == 1, message
        assert joins in message, message
    with pytest.raises(ConfigError, match=f"unknown format 'chess'; known: .*{joins}"):
        CompetitionSpec(name="chess", format="chess")


def record(test: str, normalized: float, arrived: float) -> dict:
    return {"test": test, "normalized_return": normalized, "arrived_fraction": arrived, "reward": 0.0}


def test_neurips2020_episode_figures():
    rule = NeurIPS2020()
    assert rule.normalized_return(reward=-50.0, max_episode_steps=100, num_agents=2, finished=True) == -0.25
    assert rule.normalized_return(reward=0.0, max_episode_steps=100, num_agents=2, finished=True) == 0.0
    assert rule.normalized_return(reward=-3.0, max_episode_steps=100, num_agents=2, finished=False) == -1.0
    assert rule.arrived_fraction(arrived=1, num_agents=4, finished=False) == 0.25


def test_neurips2020_aggregates_means_per_test_and_spread():
    episodes = [record("Test_0", -0.5, 0.5), record("Test_0", -0.25, 1.0), record("Test_1", -1.0, 0.0)]
    scores = NeurIPS2020().aggregate(episodes)
    assert scores["primary"] == pytest.approx(-1.75 / 3)
    assert scores["secondary"] == pytest.approx(0.5)
    assert scores["per_test"]["primary"] == {"Test_0": -0.375, "Test_1": -1.0}
    assert scores["spread"]["primary"]["std"] == pytest.approx(
        math.sqrt(sum((x + 1.75 / 3) ** 2 for x in (-0.5, -0.25, -1.0)) / 3)
    )
    assert scores["spread"]["primary"]["ci95"] is None  # too few episodes for an interval


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    episodes = [record("Test_0", -i / 20, 0.5) for i in range(20)]
    first = NeurIPS2020().aggregate(episodes)["spread"]["primary"]["ci95"]
    low, high = first
    assert low < -0.475 < high
    assert NeurIPS2020().aggregate(episodes)["spread"]["primary"]["ci95"] == first


def test_flatland3_rule():
    rule = Flatland3()
    assert rule.normalized_return(reward=-50.0, max_episode_steps=100, num_agents=2, finished=True) == 0.75
    assert rule.normalized_return(reward=-50.0, max_episode_steps=100, num_agents=2, finished=False) == 0.0
    assert rule.arrived_fraction(arrived=2, num_agents=2, finished=False) == 0.0
    scores = rule.aggregate([record("Test_0", 0.75, 1.0), record("Test_0", 0.5, 0.5)])
    assert scores["primary"] == 1.25 and scores["secondary"] == 0.75


def test_unknown_rule_is_a_config_error():
    with pytest.raises(ConfigError, match="known: neurips2020, flatland3"):
        scoring_rule("flatland", "fastest")


@pytest.mark.parametrize("rule", [NeurIPS2020(), Flatland3()], ids=lambda r: r.name)
def test_the_running_primary_equals_the_aggregate_primary(rule):
    episodes = [record(f"Test_{i % 3}", -i / 37, (i % 5) / 4) for i in range(40)]
    for count in (1, 2, 17, 40):
        assert rule.primary(episodes[:count]) == rule.aggregate(episodes[:count])["primary"]
