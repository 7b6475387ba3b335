"""Synthetic MetaLC meta-datasets: same layout as the real one, deterministic, and usable at scale."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import GeneratorSettings, main, synthetic_files, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.scoring import phase_score


def test_a_seed_names_one_meta_dataset():
    settings = GeneratorSettings(datasets=8, algorithms=4, seed=5)
    assert synthetic_files(settings) == synthetic_files(settings)
    assert synthetic_files(settings) != synthetic_files(GeneratorSettings(datasets=8, algorithms=4, seed=6))


def test_generated_folders_load_with_every_budget_and_saturating_curves(tmp_path):
    settings = GeneratorSettings(datasets=40, algorithms=10, seed=3, missing_fraction=0.1)
    write_meta_dataset(str(tmp_path / "data"), settings)
    meta = load_meta_dataset(str(tmp_path / "data"))
    assert len(meta.datasets) == 40 and meta.algorithms == ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")
    assert {meta.time_budget(d) for d in meta.datasets} == {100, 200, 300, 1200}
    assert 0 < len(meta.missing_curves) < 0.2 * 2 * 40 * 10
    assert not [m for m in meta.missing_curves if m[1] == meta.datasets[0]]  # it names the algorithms

    present = [
        meta.validation_curves[d][a]
        for d in meta.datasets
        for a in meta.algorithms
        if ("valid", d, a) not in meta.missing_curves
    ]
    for curve in present:
        assert np.all(np.diff(curve.timestamps) > 0) and np.all((curve.scores >= 0) & (curve.scores <= 1))
    long_curves = [c for c in present if len(c.timestamps) >= 5]
    gains = [c.scores[-1] - c.scores[0] for c in long_curves]
    late_gains = [c.scores[-1] - c.scores[-3] for c in long_curves]
    assert statistics.fmean(gains) > 0.1  # they learn ...
    assert statistics.fmean(late_gains) < statistics.fmean(gains) / 4  # ... and level off
    past_budget = [
        d
        for d in meta.datasets
        for a in meta.algorithms
        if meta.validation_curves[d][a].timestamps[-1] > meta.time_budget(d)
    ]
    assert past_budget  # some curves go on beyond the budget, as real ones do


def test_validation_and_test_curves_share_their_times_and_differ_by_noise():
    files = synthetic_files(GeneratorSettings(datasets=6, algorithms=3, seed=9))
    valid, test = files["valid/syn2/1/scores.txt"].splitlines(), files["test/syn2/1/scores.txt"].splitlines()
    assert valid[0] == test[0] and valid[0].startswith("times: [")
    assert valid[1] != test[1]


def test_impossible_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="at least 6 datasets"):
        GeneratorSettings(datasets=5)
    with pytest.raises(ConfigError, match="missing_fraction"):
        GeneratorSettings(missing_fraction=1.5)
    main(["--out", str(tmp_path / "m"), "--datasets", "6", "--algorithms", "2"])
    with pytest.raises(FileExistsError, match="exists and is not empty; give --overwrite to replace it"):
        write_meta_dataset(str(tmp_path / "m"), GeneratorSettings())


def test_a_folder_holding_anything_is_refused_or_replaced_whole_never_written_into(tmp_path):
    """`arbiter generate --format metalc --out DIR` into a folder with other files: refused as it
    is; with --overwrite the folder becomes the meta-dataset alone."""
    from arbiter.server.cli.main import main as arbiter

    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["generate", "--format", "metalc", "--out", str(out), "--datasets", "6", "--algorithms", "2"]
    assert arbiter(argv) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert arbiter([*argv, "--overwrite"]) == 0
    assert not (out / "notes.txt").exists() and (out / "test").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left beside it


def test_a_larger_generated_set_plays_through_both_phases(tmp_path):
    write_meta_dataset(str(tmp_path / "data"), GeneratorSettings(datasets=60, algorithms=20, seed=11))
    meta = load_meta_dataset(str(tmp_path / "data"))

    class FirstAlgorithm:  # explores algorithm 0 in tenths and credits it
        def __init__(self, number_of_algorithms):
            pass

        def meta_train(self, *data):
            pass

        def reset(self, dataset_meta_features, algorithms_meta_features):
            self.slice = int(dataset_meta_features["time_budget"]) / 10

        def suggest(self, observation):
            return (0, 0, self.slice)

    state = random.getstate(), np.random.get_state()
    try:
        for phase, runs in (("dev", 1), ("final", 3)):
            records = play_phase(meta, FirstAlgorithm, phase)
            assert len(records) == 60 * runs and all(r["steps"] == 10 and r["zero_because"] is None for r in records)
            score = phase_score(records, phase)
            assert 0 < score.average_alc < score.average_final_score <= 1
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
