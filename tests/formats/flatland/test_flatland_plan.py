"""The Flatland plan (docs/formats/flatland.md): one item per episode of the test folder, records
scored by the competition's rule, flatland-rl's result columns, and its submit figures."""

from __future__ import annotations

import csv
import os
import statistics
import types

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.formats.flatland import FORMAT
from arbiter.server.formats.flatland.plan import FLATLAND_RESULT_COLUMNS

SEED = 11


def make_plan(tests, scoring="neurips2020", max_episodes=None):
    spec = types.SimpleNamespace(seed=SEED, max_episodes=max_episodes, debug=False, options=None, name="flatland-test")
    return FORMAT.make_plan(spec, FORMAT.rules[scoring](None), tests=tests)


def metadata_rows(tests):
    with open(os.path.join(tests, "metadata.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def test_one_item_per_episode_named_by_its_env_file(tiny_tests):
    plan = make_plan(tiny_tests)
    rows = metadata_rows(tiny_tests)
    assert [i.unit for i in plan.items] == [f"{r['test_id']}/{r['env_id']}.pkl" for r in rows]
    assert plan.items[0].fields == {
        "env": plan.items[0].unit,
        "test": rows[0]["test_id"],
        "level": rows[0]["env_id"],
        "metadata_row": 0,  # where flatland's results table holds it, of how many rows
        "metadata_rows": len(rows),
    }
    assert len(make_plan(tiny_tests, max_episodes=1).items) == 1
    assert plan.handshake() == {"reward_model": "neurips2020"}
    assert make_plan(tiny_tests, "flatland3").handshake() == {"reward_model": "flatland"}


def test_a_plan_without_a_test_folder_says_how_to_give_one():
    with pytest.raises(ConfigError, match=r"needs a test folder \(--tests DIR\)"):
        make_plan(None)


def test_a_played_episode_is_recorded_with_its_raw_fields_and_the_rules_figures(tiny_tests):
    plan = make_plan(tiny_tests)
    opened = plan.open(plan.items[1])
    try:
        payload = opened.create_payload()
        assert payload["random_seed"] == SEED and payload["env_file_path"] == plan.items[1].unit
        extension = payload[EXTENSION_KEY]
        assert (extension["episode"], extension["episodes"], extension["reward_model"]) == (1, 3, "neurips2020")
        agents = opened.num_agents
        actions, invalid = opened.sanitize({0: 0, 99: 1})
        assert (actions, invalid) == ({0: 0}, 1)
        opened.step(actions)
        opened.step({})
        assert opened.step_reply(0) == {"done": False, "step": 2, "invalid_actions": 0}
        [record] = opened.records(finished=False, timeout="step", abandoned=False)
    finally:
        opened.close()
    assert (record["steps"], record["reward"], record["num_agents"], record["seed"]) == (2, -2.0 * agents, agents, SEED)
    assert record["normalized_return"] == -1.0  # a timed-out episode scores the worst
    assert record["arrived_fraction"] == 0.0 and record["max_episode_steps"] > 2


@pytest.mark.parametrize("scoring,worst", [("neurips2020", -1.0), ("flatland3", 0.0)])
def test_an_unplayed_episode_scores_the_rules_worst(tiny_tests, scoring, worst):
    plan = make_plan(tiny_tests, scoring)
    [record] = plan.unplayed(plan.items[2])
    assert (record["normalized_return"], record["arrived_fraction"], record["steps"]) == (worst, 0.0, 0)
    assert record["ended"] == "not_played" and record["num_agents"] is None


def test_the_csv_has_the_folders_metadata_then_flatland_rls_columns(tiny_tests):
    plan = make_plan(tiny_tests)
    rows = metadata_rows(tiny_tests)
    metadata = ["filename", *rows[0]]  # flatland's table's index first: the env file
    assert plan.csv_columns[: len(metadata)] == metadata
    assert plan.csv_columns[len(metadata) : len(metadata) + len(FLATLAND_RESULT_COLUMNS)] == FLATLAND_RESULT_COLUMNS
    record = {**plan.unplayed(plan.items[0])[0], "wall_s": 0.5, "timed_out": False, "index": 0}
    row = plan.csv_row({**record, "step_think_s": {"min": 0.1, "mean": 0.2, "max": 0.3}})
    assert row["filename"] == plan.items[0].unit
    assert row["n_agents"] == rows[0]["n_agents"]  # the metadata row of this episode
    assert (row["normalized_reward"], row["percentage_complete"], row["simulation_time"]) == (-1.0, 0.0, 0.5)
    assert (row["controller_inference_time_min"], row["controller_inference_time_max"]) == (0.1, 0.3)
    assert row["nb_deadlocked_trains"] == ""  # none counted: the episode did not finish
    finished = plan.csv_row({**record, "ended": "finished", "deadlocked": 2})
    assert finished["nb_deadlocked_trains"] == 2
    # flatland3: a row not played is empty, as flatland's NaN row, which its figures skip
    empty = make_plan(tiny_tests, "flatland3").csv_row(record)
    assert {empty[c] for c in FLATLAND_RESULT_COLUMNS} == {""} and empty["filename"] == plan.items[0].unit


def test_the_submit_figures_are_flatland_rls_four(tiny_tests):
    plan = make_plan(tiny_tests)
    records = [
        {"reward": -10.0, "normalized_return": -0.5, "arrived_fraction": 1.0},
        {"reward": -30.0, "normalized_return": -1.0, "arrived_fraction": 0.0},
    ]
    assert plan.submit_fields(records) == {
        "mean_reward": -20.0,
        "mean_normalized_reward": -0.75,
        "sum_normalized_reward": -1.5,
        "mean_percentage_complete": statistics.fmean([1.0, 0.0]),
    }
    assert set(plan.submit_fields([]).values()) == {None}


@pytest.mark.parametrize("scoring", ["neurips2020", "flatland3"])
def test_the_submit_figures_are_rounded_as_flatlands_service_rounds_them(tiny_tests, scoring):
    """flatland's compute_mean_scores: ``round`` of pandas' NumPy floats, to 2, 5 and 3 digits;
    the sum is sent as it is. arbiter's own ``score`` beside them is not rounded."""
    plan = make_plan(tiny_tests, scoring)
    records = [
        {"test": "Test_0", "reward": -10.004, "normalized_return": 0.123456789, "arrived_fraction": 1 / 3},
        {"test": "Test_0", "reward": -30.0, "normalized_return": 0.2, "arrived_fraction": 0.0},
        {"test": "Test_0", "reward": -1.001, "normalized_return": 0.7, "arrived_fraction": 2 / 3},
    ]
    mean = lambda key: np.float64(sum(r[key] for r in records)) / 3  # noqa: E731
    fields = plan.submit_fields(records)
    assert fields == {
        "mean_reward": float(round(mean("reward"), 2)),
        "mean_normalized_reward": float(round(mean("normalized_return"), 5)),
        "sum_normalized_reward": pytest.approx(1.023456789, abs=1e-15),
        "mean_percentage_complete": float(round(mean("arrived_fraction"), 3)),
    }
    assert (fields["mean_reward"], fields["mean_normalized_reward"], fields["mean_percentage_complete"]) == (
        -13.67,
        0.34115,
        0.333,
    )
