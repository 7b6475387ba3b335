"""Playing agent objects in this process through a whole MetaLC phase (server/formats/metalc/local.py),
as the challenge's ingestion program does: per run and fold a fresh agent meta-trained on the other
folds, then every meta-test dataset played to its end or cut off."""

from __future__ import annotations

import random

import numpy as np
import pytest

from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.env import folds, run_seeds
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase


@pytest.fixture(scope="module")
def meta(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-local") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(datasets=12, algorithms=4, seed=3))
    return load_meta_dataset(str(folder))


@pytest.fixture
def restore_process():
    """play_phase seeds the process as the challenge did: undo it afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


class QuarterAgent:
    """Explores algorithm 0 a quarter of the budget at a time, noting what it was given and a
    random draw at its construction (which shows how the process was seeded)."""

    made: list[QuarterAgent] = []

    def __init__(self, number_of_algorithms):
        self.number_of_algorithms = number_of_algorithms
        self.draw = random.random()
        self.trained_on: list[str] = []
        self.played: list[str] = []
        QuarterAgent.made.append(self)

    def meta_train(self, dataset_meta_features, algorithms_meta_features, validation_curves, test_curves):
        self.trained_on = sorted(dataset_meta_features)

    def reset(self, dataset_meta_features, algorithms_meta_features):
        self.played.append(dataset_meta_features["name"])
        self.slice = float(dataset_meta_features["time_budget"]) / 4

    def suggest(self, observation):
        return (0, 0, self.slice)


class IdleAgent(QuarterAgent):
    def suggest(self, observation):
        return (None, 0, 0.0)  # never spends its budget


@pytest.fixture
def agents():
    QuarterAgent.made = []
    return QuarterAgent.made


def test_every_fold_gets_a_fresh_agent_meta_trained_on_the_other_folds(meta, agents, restore_process):
    records = play_phase(meta, QuarterAgent, "dev")
    fold_list = folds(meta.datasets)
    assert len(agents) == len(fold_list) and {a.number_of_algorithms for a in agents} == {len(meta.algorithms)}
    for agent, fold in zip(agents, fold_list, strict=True):
        assert agent.played == list(fold.meta_test)
        assert agent.trained_on == sorted(fold.meta_train)
        assert not set(agent.trained_on) & set(fold.meta_test)
    assert [r["dataset"] for r in records] == [d for f in fold_list for d in f.meta_test]
    assert all(r["steps"] == 4 and not r["timed_out"] for r in records)  # four quarters spend the budget


def test_the_final_phase_plays_every_run_and_seeds_each_as_documented(meta, agents, restore_process):
    records = play_phase(meta, QuarterAgent, "final")
    runs = run_seeds("final")
    assert len(records) == len(runs) * len(meta.datasets)
    assert [r["run"] for r in records[:: len(meta.datasets)]] == [s.run for s in runs]
    first_of_run = agents[:: len(folds(meta.datasets))]
    for agent, run_seed in zip(first_of_run, runs, strict=True):
        run_seed.apply()
        assert agent.draw == random.random()  # the run's seed applied before its first fold's agent


def test_fold_seeding_seeds_again_at_every_fold(meta, agents, restore_process):
    play_phase(meta, QuarterAgent, "dev", seeding="fold")
    assert len({a.draw for a in agents}) == 1  # each fold's agent starts from the run's seed
    agents.clear()
    play_phase(meta, QuarterAgent, "dev", seeding="run")
    assert len({a.draw for a in agents}) == len(agents)
    with pytest.raises(ValueError, match="seeding is 'run' or 'fold'"):
        play_phase(meta, QuarterAgent, "dev", seeding="dataset")


def test_a_dataset_that_never_ends_is_cut_off_and_recorded_timed_out(meta, agents, restore_process):
    records = play_phase(meta, IdleAgent, "dev", max_steps_per_dataset=5)
    assert len(records) == len(meta.datasets)
    assert all(r["timed_out"] and r["steps"] == 5 for r in records)
    assert all(r["alc"] == 0.0 for r in records)  # a cut-off dataset scores nothing
