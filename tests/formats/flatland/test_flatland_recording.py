"""Recording the first N episodes' actions (``--record N``, docs/formats/flatland.md): a recorded
episode's applied actions land in ``replays/episode-<index>.json`` with what a replay needs; the
other episodes are the plan's own items, and a failed write costs the evaluation nothing."""

from __future__ import annotations

import collections
import json
import os
import types

import pytest

from arbiter.server.formats.flatland import FORMAT
from arbiter.server.formats.flatland.plan import FlatlandItem
from arbiter.server.formats.flatland.recording import REPLAY_FORMAT, recording_plan
from arbiter.server.service.results import ResultsStore

SEED = 3


@pytest.fixture
def recording(tiny_tests, tmp_path):
    spec = types.SimpleNamespace(seed=SEED, max_episodes=None, debug=False, options=None, name="flatland-test")
    plan = FORMAT.make_plan(spec, FORMAT.rules["flatland3"](None), tests=tiny_tests)
    store = ResultsStore(str(tmp_path / "results"), plan.csv_columns, plan.csv_row)
    return recording_plan(plan, store, record_episodes=1), store


def evaluation():
    return types.SimpleNamespace(counters=collections.Counter())


def played(opened, steps):
    for step in steps:
        actions, _ = opened.sanitize(step)
        opened.step(actions)
    record = opened.records(finished=False, timeout=None, abandoned=True)[0]
    opened.close()
    return record


def test_a_recorded_episode_writes_its_applied_actions_and_what_replays_it(recording):
    plan, store = recording
    opened = plan.open(plan.items[0])
    record = played(opened, [{0: 2, 1: 9}, {1: 4}, {}])  # 9 is no action: it is dropped, not recorded
    plan.episode_ended({**record, "index": 0, "skipped": False}, evaluation())
    with open(os.path.join(store.replays_dir, "episode-0.json"), encoding="utf-8") as handle:
        replay = json.load(handle)
    assert replay == {
        "format": REPLAY_FORMAT, "index": 0, "env": plan.items[0].unit, "seed": SEED, "reward_model": "flatland",
        "num_agents": record["num_agents"], "steps": 3, "actions": [{"0": 2}, {"1": 4}, {}],
    }  # fmt: skip


def test_episodes_beyond_the_first_n_are_the_plans_own_items_and_write_nothing(recording):
    plan, store = recording
    opened = plan.open(plan.items[1])
    assert type(opened) is FlatlandItem
    record = played(opened, [{0: 2}])
    plan.episode_ended({**record, "index": 1, "skipped": False}, evaluation())
    assert not os.path.exists(store.replays_dir)


def test_an_unplayed_recorded_episode_writes_nothing(recording):
    plan, store = recording
    plan.open(plan.items[0]).close()
    [record] = plan.unplayed(plan.items[0])
    plan.episode_ended({**record, "index": 0, "skipped": True}, evaluation())
    assert not os.path.exists(store.replays_dir)


def test_a_replay_that_cannot_be_written_is_counted_and_the_evaluation_goes_on(recording):
    plan, store = recording
    with open(store.replays_dir, "w") as blocker:  # a file where the replays folder should be
        blocker.write("")
    record = played(plan.open(plan.items[0]), [{0: 2}])
    running = evaluation()
    plan.episode_ended({**record, "index": 0, "skipped": False}, running)
    assert running.counters["replays_unwritten"] == 1
