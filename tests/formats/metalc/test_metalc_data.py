"""MetaLC's meta-dataset loader (docs/formats/metalc.md): folder layout, curves, meta-features, errors."""

from __future__ import annotations

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.metalc.data import load_meta_dataset, parse_curve, parse_info

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


def test_a_curves_lookups_follow_the_challenges_rules_on_any_curve():
    """Against the rules read straight off the numpy arrays, on sorted, unsorted and NaN-holding
    curves: the first point out of reach decides, and a time is found only where it is equal."""
    import math

    import numpy as np

    from arbiter.server.formats.metalc.data import LearningCurve

    def reached(times, scores, reach):
        out = np.flatnonzero(reach < times)
        if not len(out):
            return float(scores[-1]), float(times[-1])
        return (0.0, 0.0) if out[0] == 0 else (float(scores[out[0] - 1]), float(times[out[0] - 1]))

    def at(times, scores, time):
        hits = np.flatnonzero(times == time)
        return float(scores[hits[0]]) if len(hits) else None

    def same(got, expected):  # equal, NaN for NaN
        return len(got) == len(expected) and all(
            a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(got, expected, strict=True)
        )

    rng = np.random.default_rng(7)
    for case in range(300):
        size = int(rng.integers(1, 12))
        times = np.round(rng.uniform(0, 100, size), 2)
        if case % 3 == 0:
            times.sort()
        if case % 5 == 0:
            times[rng.integers(0, size)] = np.nan
        scores = rng.uniform(0, 1, size)
        curve = LearningCurve(times, scores)
        for counter, delta_t in zip(rng.uniform(0, 60, 8).tolist(), rng.uniform(0, 60, 8).tolist(), strict=True):
            assert same(curve.last_point_within(delta_t, counter), reached(times, scores, counter + delta_t))
        for time in [*times.tolist(), 0.0, -0.0, 101.0, math.nan]:
            got, expected = curve.score_at(time), at(times, scores, time)
            assert got == expected and type(got) is type(expected), (times, time)


def test_a_meta_dataset_that_is_no_folder_is_said_as_such(tmp_path):
    """A typo in --tests was said as a meta-dataset missing its dataset_meta_features/ folder."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_meta_dataset(str(tmp_path / "nowhere"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        load_meta_dataset(str(tmp_path / "a-file"))
