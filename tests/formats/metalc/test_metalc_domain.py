"""The MetaLC domain's rules, one at a time (SCORING.md §4): loader, step, folds, seeds, scores."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError, InvalidAction
from arbiter.server.formats.metalc.data import LearningCurve, MetaDataset, load_meta_dataset, parse_curve, parse_info
from arbiter.server.formats.metalc.env import DatasetEpisode, folds, meta_training_data, run_seeds
from arbiter.server.formats.metalc.scoring import AlcRule, alc, phase_score, record_figures

# -- a meta-dataset on disk --------------------------------------------------------------------------


def write_folder(root, curves, budgets, algorithm_files=None):
    """curves: {(split, dataset, algorithm): (times, scores) or None for a missing scores.txt}."""
    for dataset, budget in budgets.items():
        path = root / "dataset_meta_features" / f"{dataset}_public.info"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"usage = 'test'\nname = '{dataset}'\ntime_budget =   {budget}\n")
    algorithms = sorted({a for (_, _, a) in curves})
    for algorithm in algorithm_files if algorithm_files is not None else algorithms:
        path = root / "algorithms_meta_features" / f"{algorithm}.info"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("meta_feature_0 = 1\nmeta_feature_1 = 0.5\n")
    for (split, dataset, algorithm), curve in curves.items():
        folder = root / split / dataset / algorithm
        folder.mkdir(parents=True, exist_ok=True)
        if curve is not None:
            (folder / "scores.txt").write_text(f"times: {list(curve[0])}\nscores: {list(curve[1])}\n")
    return root


def both_splits(datasets, algorithms, curve=((1.0, 2.0), (0.5, 0.6))):
    return {(s, d, a): curve for s in ("valid", "test") for d in datasets for a in algorithms}


def test_datasets_and_algorithms_load_in_string_order_and_hidden_entries_are_skipped(tmp_path):
    root = write_folder(
        tmp_path, both_splits(["b", "a10", "a2"], ["0", "1", "10", "2"]), {"b": 100, "a10": 200, "a2": 300}
    )
    (tmp_path / "test" / ".DS_Store").write_text("")
    meta = load_meta_dataset(str(root))
    assert meta.datasets == ("a10", "a2", "b")
    assert meta.algorithms == ("0", "1", "10", "2")
    assert list(meta.validation_curves["a2"]) == ["0", "1", "10", "2"]
    assert meta.dataset_meta_features["b"] == {"usage": "test", "name": "b", "time_budget": "100"}
    assert meta.time_budget("a10") == 200


def test_a_missing_scores_file_is_the_single_point_zero_zero(tmp_path):
    curves = both_splits(["d1", "d2"], ["0", "1"])
    curves[("test", "d2", "1")] = None
    meta = load_meta_dataset(str(write_folder(tmp_path, curves, {"d1": 100, "d2": 100})))
    curve = meta.test_curves["d2"]["1"]
    assert curve.timestamps.tolist() == [0.0] and curve.scores.tolist() == [0.0]
    assert meta.missing_curves == (("test", "d2", "1"),)
    assert meta.validation_curves["d2"]["1"].scores.tolist() == [0.5, 0.6]


def test_curves_are_rounded_to_two_decimals_with_numpy_rounding():
    curve = parse_curve("times: [1.004, 2.5]\nscores: [0.015, 0.025]\n", "x")
    assert curve.timestamps.tolist() == [1.0, 2.5]
    # numpy scales and rounds half to even: 0.015 → 0.02 and 0.025 → 0.02, where Python's
    # round gives 0.01 and 0.03
    assert curve.scores.tolist() == [0.02, 0.02]


def test_meta_feature_values_lose_spaces_and_quotes():
    assert parse_info("name = 'ad ult'\ntime_budget =    1200\n\n", "x") == {"name": "adult", "time_budget": "1200"}


@pytest.mark.parametrize(
    "text,message",
    [
        ("times: [1, 2]\nscores: [0.5]\n", "2 times but 1 scores"),
        ("times: []\nscores: []\n", "non-empty list"),
        ("times: [1, 2\nscores: [0.5, 0.6]\n", "not a JSON list"),
        ("scores: [0.5]\n", "no 'times:' line"),
        ("times: [1, NaN]\nscores: [0.5, 0.6]\n", "finite numbers"),
        ('times: [1, "2"]\nscores: [0.5, 0.6]\n', "finite numbers"),
    ],
)
def test_a_malformed_curve_file_is_refused_by_name(text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        parse_curve(text, "valid/d/0/scores.txt")
    assert "valid/d/0/scores.txt" in str(caught.value)


def test_malformed_folders_get_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="no dataset_meta_features/ folder"):
        load_meta_dataset(str(tmp_path))

    base = both_splits(["d1"], ["0", "1"])
    with pytest.raises(ConfigError, match="needs one <algorithm>.info per algorithm"):
        load_meta_dataset(str(write_folder(tmp_path / "a", base, {"d1": 100}, algorithm_files=["0"])))
    with pytest.raises(ConfigError, match="time_budget must be a whole number"):
        load_meta_dataset(str(write_folder(tmp_path / "b", base, {"d1": "12.5"})))
    with pytest.raises(ConfigError, match="cannot contain '_'"):
        load_meta_dataset(str(write_folder(tmp_path / "c", both_splits(["my_set"], ["0"]), {"my_set": 100})))
    uneven = {**base, ("valid", "d2", "0"): ((1.0,), (0.5,))}
    with pytest.raises(ConfigError, match="same dataset folders"):
        load_meta_dataset(str(write_folder(tmp_path / "d", uneven, {"d1": 100, "d2": 100})))
    root = write_folder(tmp_path / "e", base, {"d1": 100})
    (root / "dataset_meta_features" / "d1_public.info").unlink()
    with pytest.raises(ConfigError, match="d1_public.info: missing"):
        load_meta_dataset(str(root))
    with pytest.raises(ConfigError, match="line 2: expected 'key = value'"):
        parse_info("a = 1\nb = c = d\n", "x.info")


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
    assert "missing from" in record["failure"]


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


# -- scores ------------------------------------------------------------------------------------------


def test_alc_by_hand_on_a_tiny_curve():
    def t(x):
        return math.log(1 + x / 60) / math.log(1 + 100 / 60)

    # best-so-far 0.2, 0.5, 0.5: the drop to 0.4 adds nothing
    assert alc([10.0, 50.0, 100.0], [0.2, 0.5, 0.4], 100) == pytest.approx(
        0.2 * (1 - t(10)) + 0.3 * (1 - t(50)), abs=1e-15
    )
    assert alc([100.0], [0.9], 100) == 0.0  # a score first reached at the very end counts nothing


def record(run, dataset, times, scores, *, phase="final", timed_out=False, budget=100):
    return {"phase": phase, "run": run, "fold": 0, "dataset": dataset, "time_budget": budget, "steps": len(times),
            "finished": True, "timed_out": timed_out, "times": times, "scores": scores}  # fmt: skip


def test_the_final_phase_reports_the_first_of_its_worst_runs():
    records = [
        record(0, "d", [0.0], [0.5]),  # ALC 0.5, final 0.5
        record(1, "d", [100.0], [0.5]),  # ALC 0, final 0.5
        record(2, "d", [100.0], [0.3]),  # ALC 0 too, final 0.3
    ]
    score = phase_score(records, "final")
    assert [(r.average_alc, r.average_final_score) for r in score.runs] == [(0.5, 0.5), (0.0, 0.5), (0.0, 0.3)]
    assert (score.reported_run, score.average_alc, score.average_final_score) == (1, 0.0, 0.5)


def test_final_phase_figures_are_rounded_and_timeouts_and_unplayed_datasets_count_zero():
    records = [
        record(0, "a", [10.0, 100.0], [0.333, 0.666]),
        record(0, "b", [10.0], [0.9], timed_out=True),
    ]
    score = phase_score(records, "final", datasets=["a", "b", "c"])
    per_dataset = score.runs[0].per_dataset
    assert per_dataset["a"] == {"alc": round(alc([10.0, 100.0], [0.333, 0.666], 100), 2), "final_score": 0.67}
    assert per_dataset["b"] == per_dataset["c"] == {"alc": 0.0, "final_score": 0.0}
    assert score.average_final_score == 0.22  # 0.67 / 3, rounded
    dev = phase_score([dict(r, phase="dev") for r in records], "dev")
    assert dev.average_final_score == 0.666 / 2  # unrounded, over the 2 datasets recorded


def test_a_record_recomputes_to_the_figures_it_carries():
    episode = DatasetEpisode(tiny_meta({"0": ([10.0, 30.0], [0.3, 0.6])}), "d", "final", run=2, fold=4)
    for action in [(None, 0, 10), (0, 0, 20), (0, 0, 70)]:
        episode.step(action)
    carried = episode.record()
    assert (carried["run"], carried["fold"], carried["steps"], carried["failure"]) == (2, 4, 3, None)
    assert record_figures(carried) == (carried["alc"], carried["final_score"], None)
    assert carried["final_score"] == 0.6
    assert episode.record(timed_out=True)["alc"] == 0.0
    aggregate = AlcRule(phase="final").aggregate([carried])
    assert (aggregate["primary"], aggregate["secondary"]) == (carried["alc"], 0.6)
