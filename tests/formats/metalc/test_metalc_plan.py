"""The MetaLC plan, driven directly through the format seam (open → create_payload → sanitize →
step → step_reply → records); the runner driving it is tested in test_metalc_runner.py."""

from __future__ import annotations

import os
import random
import types
from typing import Any

import numpy as np
import paths
import pytest

from arbiter.protocol import codec
from arbiter.protocol.errors import ConfigError, InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import action_for, space_from_wire
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.formats.base import options_from_dict
from arbiter.server.formats.metalc import FORMAT
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.options import MetaLCOptions
from arbiter.server.formats.metalc.plan import MetaLCPlan

AGENTS_DIR = os.path.join(paths.EXAMPLES, "metalc_agent")
SETTINGS = GeneratorSettings(datasets=14, algorithms=6, seed=1, missing_fraction=0.05, duplicate_fraction=0.15)
BUDGETS = BudgetPolicy(planning_s=2.0, step_s=1.0, overall_s=100.0, idle_s=5.0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc") / "data"
    write_meta_dataset(str(folder), SETTINGS)
    return str(folder)


@pytest.fixture(scope="module")
def meta(data_dir):
    return load_meta_dataset(data_dir)


@pytest.fixture
def restore_process():
    """``play_phase`` seeds this process as the challenge seeded its own: undo it afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def make_spec(max_episodes: int | None = None, **options: Any) -> Any:
    """What the core hands make_plan: the spec's name, budgets, limit and validated options."""
    return types.SimpleNamespace(
        name="metalc-test",
        budgets=BUDGETS,
        seed=208,
        max_episodes=max_episodes,
        options=options_from_dict(MetaLCOptions, options, "test"),
    )


def make_plan(data_dir: str, max_episodes: int | None = None, **options: Any) -> MetaLCPlan:
    spec = make_spec(max_episodes, **options)
    return FORMAT.make_plan(spec, FORMAT.rules["alc"](spec.options), tests=data_dir)


def load_agent(name: str) -> type:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"metalc_{name}", os.path.join(AGENTS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Agent


# -- plan --------------------------------------------------------------------------------------------


def test_items_follow_the_challenge_order_runs_folds_datasets(data_dir, meta):
    dev = make_plan(data_dir)
    assert [i.fields["dataset"] for i in dev.items] == list(meta.datasets)  # folds are contiguous blocks
    assert [i.fields["fold"] for i in dev.items] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert dev.items[0].unit == "dev/run0/fold0/syn0" and dev.seed == 208
    assert dev.items[0].fields == {"phase": "dev", "run": 0, "fold": 0, "dataset": "syn0",
                                   "time_budget": meta.time_budget("syn0"), "seed": 208}  # fmt: skip

    final = make_plan(data_dir, phase="final")
    assert len(final.items) == 3 * len(meta.datasets)
    assert [(i.fields["run"], i.fields["seed"]) for i in final.items[:: len(meta.datasets)]] == [(0, 1), (1, 2), (2, 3)]
    assert len({i.unit for i in final.items}) == len(final.items)
    assert [i.index for i in final.items] == list(range(len(final.items)))


def test_a_debug_run_plays_the_first_datasets_only(data_dir):
    shortened = make_plan(data_dir, max_episodes=4).items
    assert [i.unit for i in shortened] == [i.unit for i in make_plan(data_dir).items[:4]]


def test_a_folds_first_dataset_gets_the_meta_training_time(data_dir):
    plan = make_plan(data_dir, meta_train_s=30.0, dataset_s=5.0)
    firsts = [i for i in plan.items if i.budgets is not None]
    assert [i.fields["dataset"] for i in firsts] == [f.meta_test[0] for f in plan.folds]
    assert {i.budgets.planning_s for i in firsts} == {BUDGETS.planning_s + 30.0}
    assert {i.budgets.step_s for i in firsts} == {BUDGETS.step_s}
    assert plan.open(plan.items[0]).stage_budget_s == 35.0
    assert plan.open(plan.items[1]).stage_budget_s == 5.0
    assert make_plan(data_dir, dataset_s=0).open(plan.items[1]).stage_budget_s is None


def test_without_a_meta_dataset_the_error_says_where_to_get_one():
    spec = make_spec()
    with pytest.raises(ConfigError) as caught:
        MetaLCPlan(spec, FORMAT.rules["alc"](spec.options), tests=None)
    message = str(caught.value)
    assert "--tests DIR" in message and "input_data" in message
    assert "metaLC-post-challenge-analysis-1st-round" in message
    assert "arbiter generate --format metalc --out DIR" in message


def test_meta_training_data_travels_with_a_folds_first_dataset_and_after_a_handshake(data_dir, meta):
    plan = make_plan(data_dir)
    carried, lasts = [], []
    for item in plan.items:
        ext = plan.open(item).create_payload()[EXTENSION_KEY]
        carried.append("meta_train" in ext)
        assert ext["first_of_fold"] == (item.fields["dataset"] == plan.folds[item.fields["fold"]].meta_test[0])
        lasts.append(ext["last_of_fold"])
    assert carried == [i.budgets is not None for i in plan.items]
    # the fold's last dataset says so (its process does not ask for the next fold's with a step)
    assert lasts == [later is None or later.fields["fold"] != item.fields["fold"]
                     for item, later in zip(plan.items, [*plan.items[1:], None], strict=True)]  # fmt: skip
    assert sum(lasts) == len(plan.folds)

    plan.handshake()  # a client joins mid-fold (a resumed evaluation): its next item carries its fold's data
    payload = plan.open(plan.items[4]).create_payload()
    data = payload[EXTENSION_KEY]["meta_train"]
    assert sorted(data["datasets_meta_features"]) == sorted(set(meta.datasets) - set(plan.folds[1].meta_test))
    assert "meta_train" not in plan.open(plan.items[5]).create_payload()[EXTENSION_KEY]
    assert payload["observation"] is None
    assert payload["info"]["dataset_meta_features"] == meta.dataset_meta_features[plan.items[4].fields["dataset"]]


def test_actions_are_refused_or_resolved_as_documented(data_dir):
    plan = make_plan(data_dir)
    item = plan.open(plan.items[0])
    assert item.sanitize((None, "3", 5))[0] == (None, "3", 5.0, "3")
    assert item.sanitize([np.int64(2), 4, np.float32(1.5)])[0] == ("2", "4", 1.5, 4)
    assert item.sanitize([-1, np.array(0), np.array(2.0)])[0][:3] == (None, "0", 2.0)
    for bad, message in [
        ((None, "3"), r"\[A_star, A, delta_t\]"),
        ((None, None, 1.0), "A None names no algorithm"),
        (("x", "3", 1.0), "A_star 'x' names no algorithm"),
        ((None, 6, 1.0), "A 6 names no algorithm"),
        ((None, True, 1.0), "A True names no algorithm"),
        ((None, "1", "10"), "delta_t must be a number"),
        ((None, "1", float("nan")), "NaN"),
    ]:
        with pytest.raises(InvalidAction, match=message):
            item.sanitize(bad)
    assert item.episode.step_count == 0


def test_sampled_actions_of_the_handshakes_spaces_are_all_accepted(data_dir):
    plan = make_plan(data_dir)
    wire = codec.decode(codec.encode(plan.handshake()["spaces"]), codec.REPLY_LIMITS)
    action_space, observation_space = space_from_wire(wire["action"]), space_from_wire(wire["observation"])
    action_space.seed(3)
    item = plan.open(plan.items[0])
    while not item.step(item.sanitize(codec.decode(codec.encode(list(action_space.sample()))))[0]):
        observation = item.step_reply(0)["observation"]
        assert action_for(observation_space, observation) is not None
    assert item.episode.done


def test_a_step_reply_echoes_the_algorithm_and_hides_the_credited_score(data_dir, meta):
    plan = make_plan(data_dir, phase="final")
    item = plan.open(plan.items[0])
    budget = meta.time_budget("syn0")
    assert item.step(item.sanitize((None, 2, budget / 2))[0]) is False
    reply = item.step_reply(0)
    score, reached = meta.validation_curves["syn0"]["2"].last_point_within(budget / 2, 0.0)
    assert reply["observation"] == [2, reached, score]
    assert (reply["reward"], reply["done"], reply["terminated"], reply["step"]) == (0.0, False, False, 1)
    assert reply[EXTENSION_KEY] == {"stage_over": False, "remaining_budget": budget / 2}
    assert item.step(item.sanitize(("2", 2, budget))[0]) is True
    assert item.step_reply(0)["terminated"] is True


def test_a_timed_out_dataset_scores_zero_and_says_why(data_dir):
    plan = make_plan(data_dir)
    item = plan.open(plan.items[1])
    item.step(item.sanitize((None, 0, 1e9))[0])  # finished: its figures are real
    finished = item.records(finished=True, timeout=None, abandoned=False)[0]
    assert finished["finished"] and finished["ended"] == "finished" and finished["zero_because"] is None

    item = plan.open(plan.items[1])
    item.step(item.sanitize(("0", 0, 1.0))[0])
    (record,) = item.records(finished=False, timeout="step", abandoned=False)
    assert (record["alc"], record["final_score"], record["ended"]) == (0.0, 0.0, "step_timeout")
    assert record["zero_because"] == "not finished" and record["steps"] == 1 and record["seed"] == 208
    abandoned = plan.open(plan.items[1]).records(finished=False, timeout=None, abandoned=True)[0]
    assert (abandoned["alc"], abandoned["zero_because"], abandoned["ended"]) == (0.0, "not finished", "abandoned")
    unplayed = plan.unplayed(plan.items[2])[0]
    assert (unplayed["dataset"], unplayed["alc"], unplayed["steps"], unplayed["ended"]) == (
        plan.items[2].fields["dataset"], 0.0, 0, "not_played")  # fmt: skip


def test_max_steps_ends_an_agent_that_never_spends_its_budget(data_dir):
    plan = make_plan(data_dir, max_steps=50)
    item = plan.open(plan.items[0])
    steps = 0
    while not item.step(item.sanitize(("1", 1, 0.0))[0]):
        steps += 1
    assert steps + 1 == 50 and item.step_reply(0)["truncated"] is True and not item.episode.done
    (record,) = item.records(finished=True, timeout=None, abandoned=False)
    assert record["ended"] == "step_limit" and record["alc"] == 0.0 and record["zero_because"] == "not finished"


def test_csv_rows_start_with_the_challenges_dataset_and_alc(data_dir):
    plan = make_plan(data_dir)
    item = plan.open(plan.items[0])
    item.step(item.sanitize(("1", 1, 1e9))[0])
    row = plan.csv_row(item.records(finished=True, timeout=None, abandoned=False)[0])
    assert list(row)[:2] == ["dataset", "alc"] and list(row) == plan.csv_columns
    assert row["dataset"] == "syn0" and row["run"] == 0


# -- scores and report -------------------------------------------------------------------------------


def test_the_rule_reports_the_worst_run_of_the_final_phase(data_dir, meta, restore_process):
    records = play_phase(meta, load_agent("random_agent"), "final")
    score = FORMAT.rules["alc"](MetaLCOptions(phase="final")).aggregate(records)
    averages = [r["average_alc"] for r in score["runs"]]
    assert len(averages) == 3 and score["primary"] == min(averages)
    assert score["reported_run"] == averages.index(min(averages))
    assert score["spread"]["primary"]["n"] == len(meta.datasets)
