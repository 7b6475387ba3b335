"""MetaLC's dataset episode, folds and run seeds (docs/formats/metalc.md), one rule at a time."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError, InvalidAction
from arbiter.server.formats.metalc.data import LearningCurve, MetaDataset
from arbiter.server.formats.metalc.env import DatasetEpisode, folds, meta_training_data, run_seeds
from arbiter.server.formats.metalc.scoring import AlcRule, record_figures

# -- one dataset's steps -----------------------------------------------------------------------------


def tiny_meta(valid, test=None, budget=100, extra_datasets=0):
    """One dataset 'd' (plus filler datasets) with the given {algorithm: (times, scores)} curves."""
    test = valid if test is None else test
    names = ["d"] + [f"e{i}" for i in range(extra_datasets)]
    algorithms = tuple(sorted(valid))
    return MetaDataset(
        datasets=tuple(sorted(names)),
        algorithms=algorithms,
        dataset_meta_features={n: {"name": n, "time_budget": str(budget)} for n in names},
        algorithms_meta_features={a: {"meta_feature_0": "0"} for a in algorithms},
        validation_curves={n: {a: LearningCurve(*valid[a]) for a in algorithms} for n in names},
        test_curves={n: {a: LearningCurve(*test[a]) for a in algorithms} for n in names},
    )


def play(episode: DatasetEpisode, *actions: tuple) -> list[Any]:
    """Every step of ``actions`` as the episode saw it (it keeps only the scored ones)."""
    steps = []
    for action in actions:
        episode.step(action)
        steps.append(episode.last_step)
    return steps


def test_delta_t_is_clipped_to_what_remains_and_spending_it_all_ends_the_dataset():
    episode = DatasetEpisode(tiny_meta({"0": ([10.0, 30.0], [0.3, 0.6])}), "d", "dev")
    observation, done = episode.step((None, 0, -5))
    assert (observation, done, episode.remaining_budget) == ((0, 0.0, 0.0), False, 100.0)
    assert episode.last_step.time == 0.0
    observation, done = episode.step((None, 0, 1000))
    assert (observation, done, episode.remaining_budget) == ((0, 30.0, 0.6), True, 0.0)
    assert (episode.last_step.time, episode.step_count) == (100.0, 2)
    with pytest.raises(InvalidAction, match="spent"):
        episode.step((None, 0, 1))


def test_unused_time_is_lost_and_the_counter_moves_to_the_point_reached():
    episode = DatasetEpisode(tiny_meta({"0": ([10.0, 30.0], [0.3, 0.6])}), "d", "dev")
    assert episode.step((None, "0", 25))[0] == ("0", 10.0, 0.3)  # 15 of the 25 are lost
    assert episode.step((None, "0", 15))[0] == ("0", 10.0, 0.3)  # 10 + 15 < 30: no new point
    assert episode.step((None, "0", 20))[0] == ("0", 30.0, 0.6)
    assert episode.remaining_budget == 40.0


def test_an_algorithm_whose_next_point_is_beyond_each_slice_never_advances():
    episode = DatasetEpisode(tiny_meta({"0": ([50.0], [0.9])}), "d", "dev")
    for _ in range(4):  # 80 spent in all, yet each 20 falls short of the first point
        assert episode.step((None, 0, 20))[0] == (0, 0.0, 0.0)
    assert episode.counters["0"] == 0.0


def test_a_star_is_credited_with_its_point_as_of_the_step_before():
    episode = DatasetEpisode(tiny_meta({"0": ([10.0, 30.0], [0.3, 0.6])}), "d", "dev")
    # explores 0 up to 10, but credits 0 as it was: nothing yet; then the point the step before reached
    steps = play(episode, (0, 0, 10), (0, 0, 20), (0, 0, 70))
    assert [(s.credited_time, s.score) for s in steps] == [(0.0, 0.0), (10.0, 0.3), (30.0, 0.6)]
    assert [s.time for s in steps] == [10.0, 30.0, 100.0]


def test_step_times_are_rounded_to_two_decimals():
    episode = DatasetEpisode(tiny_meta({"0": ([1.0], [0.5])}), "d", "dev")
    assert [s.time for s in play(episode, (None, 0, 100 / 3), (None, 0, 100 / 3))] == [33.33, 66.67]


def test_the_development_phase_credits_validation_scores_and_the_final_phase_test_scores():
    meta = tiny_meta({"0": ([10.0], [0.4])}, test={"0": ([10.0], [0.7])})
    scores = {}
    for phase in ("dev", "final"):
        episode = DatasetEpisode(meta, "d", phase)
        episode.step((None, 0, 10))
        episode.step((0, 0, 90))
        scores[phase] = episode.last_step.score
    assert scores == {"dev": 0.4, "final": 0.7}


def test_a_repeated_time_credits_its_first_point_and_observes_its_last():
    episode = DatasetEpisode(tiny_meta({"0": ([5.0, 5.0, 9.0], [0.3, 0.4, 0.5])}), "d", "dev")
    assert episode.step((None, 0, 6))[0] == (0, 5.0, 0.4)
    episode.step((0, 0, 94))
    assert episode.last_step.score == 0.3


def test_crediting_a_time_the_validation_curve_lacks_makes_the_dataset_score_zero():
    meta = tiny_meta({"0": ([10.0], [0.4])}, test={"0": ([8.0], [0.7])})
    episode = DatasetEpisode(meta, "d", "dev")
    episode.step((None, 0, 10))
    episode.step((0, 0, 90))  # credits test time 8.0, absent from the validation curve
    record = episode.record()
    assert (record["scores"], record["step_numbers"], record["steps"]) == ([None], [2], 2)  # the step that spoilt it
    assert (record["alc"], record["final_score"]) == (0.0, 0.0)
    assert "missing from" in record["zero_because"]


@pytest.mark.parametrize(
    "action,message",
    [((None, 7, 10), "A 7 is no algorithm"), (("9", 0, 10), "A_star '9'"), ((None, 0, float("nan")), "NaN"),
     ((None, 0, True), "must be a number"), ((None, 0), "is \\(A_star, A, delta_t\\)"), ((None, 0.0, 5), "A 0.0")],
)  # fmt: skip
def test_an_invalid_action_is_refused_and_changes_nothing(action, message):
    episode = DatasetEpisode(tiny_meta({"0": ([10.0], [0.4])}), "d", "dev")
    with pytest.raises(InvalidAction, match=message):
        episode.step(action)
    assert (episode.step_count, episode.last_step) == (0, None)
    assert (episode.remaining_budget, episode.counters) == (100.0, {"0": 0.0})


def test_algorithms_are_named_by_str_so_numpy_ints_and_strings_agree():
    episode = DatasetEpisode(tiny_meta({"0": ([5.0], [0.2]), "1": ([5.0], [0.9])}), "d", "dev")
    episode.step((None, np.int64(1), 5))
    episode.step(("1", 0, 95))
    assert episode.last_step.score == 0.9


# -- folds, meta-training data and seeds -------------------------------------------------------------


def test_folds_are_six_contiguous_blocks_in_string_order():
    names = tuple(sorted(f"d{i}" for i in range(14)))
    found = folds(names)
    assert [len(f.meta_test) for f in found] == [3, 3, 2, 2, 2, 2]
    assert sum((f.meta_test for f in found), ()) == names
    assert found[1].meta_test == ("d11", "d12", "d13")  # d0 d1 d10 | d11 d12 d13 | d2 d3 | ...
    assert found[2].meta_test == ("d2", "d3") and found[2].meta_train == names[:6] + names[8:]
    assert [len(f.meta_test) for f in folds([str(i) for i in range(30)])] == [5] * 6
    with pytest.raises(ConfigError, match="at least 6 datasets"):
        folds(["a", "b", "c", "d", "e"])


def test_a_fold_meta_trains_on_the_other_folds_validation_and_test_curves():
    meta = tiny_meta({"0": ([10.0], [0.4])}, test={"0": ([10.0], [0.7])}, extra_datasets=6)
    fold = folds(meta.datasets)[0]
    data = meta_training_data(meta, fold)
    assert list(data.datasets_meta_features) == list(fold.meta_train) == list(data.test_learning_curves)
    assert fold.meta_test[0] not in data.validation_learning_curves
    name = fold.meta_train[0]
    assert data.validation_learning_curves[name]["0"].scores.tolist() == [0.4]
    assert data.test_learning_curves[name]["0"].scores.tolist() == [0.7]
    assert data.to_plain()["test_learning_curves"][name]["0"] == {"timestamps": [10.0], "scores": [0.7]}


def test_runs_are_seeded_like_the_challenge_seeds_its_process():
    dev, final = run_seeds("dev"), run_seeds("final")
    assert [(s.run, s.seed, s.numpy) for s in dev] == [(0, 208, False)]
    assert [(s.run, s.seed, s.numpy, s.torch) for s in final] == [(r, r + 1, True, True) for r in range(3)]
    saved = random.getstate(), np.random.get_state()
    try:
        final[1].apply()
        assert (random.random(), np.random.random()) == (random.Random(2).random(), np.random.RandomState(2).random())
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def test_a_record_recomputes_to_the_figures_it_carries():
    episode = DatasetEpisode(tiny_meta({"0": ([10.0, 30.0], [0.3, 0.6])}), "d", "final", run=2, fold=4)
    for action in [(None, 0, 10), (0, 0, 20), (0, 0, 70)]:
        episode.step(action)
    carried = episode.record()
    assert (carried["run"], carried["fold"], carried["steps"], carried["zero_because"]) == (2, 4, 3, None)
    assert record_figures(carried) == (carried["alc"], carried["final_score"], None)
    assert carried["final_score"] == 0.6
    assert episode.record(cut_short=True)["alc"] == 0.0
    aggregate = AlcRule(phase="final").aggregate([carried])
    assert (aggregate["primary"], aggregate["secondary"]) == (carried["alc"], 0.6)
