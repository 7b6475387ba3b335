"""arbiter's MetaLC domain reproduces, figure for figure, what the challenge's own programs score.

How the figures in metalc_challenge_figures.py were produced (outside this repository, which
holds none of that code): the synthetic meta-dataset ``SETTINGS`` was written with
``arbiter generate --format metalc --out DATA --datasets 14 --algorithms 6
--seed 1 --missing-fraction 0.05 --duplicate-fraction 0.15``; then the ingestion and scoring
programs of the MetaLC round-1 post-challenge repository (github.com/LishengSun/
metaLC-post-challenge-analysis-1st-round, MIT) were run on DATA with each agent of
examples/metalc_agent as the submission, under Python 3.11, numpy 1.26.4, pandas 1.5.3 and
scikit-learn 1.9.1:
    development: ``python ingestion_program/ingestion.py DATA RES ingestion_program SUBMISSION``
                 then ``python scoring_program/score.py IN OUT`` (IN/ref = DATA, IN/res = RES);
    final:       ``python ingestion_program_2/ingestion.py - DATA RES ingestion_program_2 SUBMISSION``
                 then ``python scoring_program_2/score.py IN OUT``.
Each figure is the scoring program's printed per-dataset ``alc`` / ``final_score`` (every run)
and its averages, copied as printed (the shortest repr of the float).

The set has 14 datasets (uneven folds: 3, 3, 2, 2, 2, 2), names whose string order is not
their numeric order, 5 missing curves, curves that repeat a time, and 3-decimal scores whose
2-decimal rounding differs between numpy and Python; the random agent checks the seeding.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random

import numpy as np
import paths
import pytest
from metalc_challenge_figures import CHALLENGE_FIGURES, SETTINGS, same_float

from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import synthetic_files, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.scoring import phase_score

SETTINGS_DIGEST = "01cbb01cd36df91c730de24846ac36294b0b88d1655044cdad1f0ad458ce2064"
AGENTS_DIR = os.path.join(paths.EXAMPLES, "metalc_agent")


def files_digest(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()


def load_agent(name: str) -> type:
    spec = importlib.util.spec_from_file_location(f"metalc_{name}", os.path.join(AGENTS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Agent


@pytest.fixture(scope="module")
def meta(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc") / "data"
    write_meta_dataset(str(folder), SETTINGS)
    return load_meta_dataset(str(folder))


@pytest.fixture
def restore_global_rngs():
    """Playing a phase seeds this process like the challenge seeds its own: undo it afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def test_the_generator_still_writes_the_set_the_figures_come_from():
    assert files_digest(synthetic_files(SETTINGS)) == SETTINGS_DIGEST


def test_the_set_has_the_cases_the_figures_cover(meta):
    assert meta.datasets[:4] == ("syn0", "syn1", "syn10", "syn11")
    assert len(meta.missing_curves) == 5
    assert {split for split, _, _ in meta.missing_curves} == {"valid", "test"}
    repeated = [
        (d, a)
        for d in meta.datasets
        for a in meta.algorithms
        if len(set(meta.validation_curves[d][a].timestamps)) < len(meta.validation_curves[d][a].timestamps)
    ]
    assert repeated
    assert {meta.time_budget(d) for d in meta.datasets} == {100, 200, 300, 1200}


@pytest.mark.parametrize("phase", ["dev", "final"])
@pytest.mark.parametrize("agent", ["agent", "schedule_agent", "random_agent"])
def test_arbiter_reproduces_every_figure_of_the_challenge_programs(meta, restore_global_rngs, agent, phase):
    expected = CHALLENGE_FIGURES[(agent, phase)]
    score = phase_score(play_phase(meta, load_agent(agent), phase), phase)

    assert len(score.runs) == len(expected["per_dataset"])
    for run, wanted in zip(score.runs, expected["per_dataset"], strict=True):
        assert sorted(run.per_dataset) == sorted(wanted), f"run {run.run}"
        for name, (alc, final_score) in wanted.items():
            figures = run.per_dataset[name]
            assert final_score == figures["final_score"], f"run {run.run}, {name}"
            assert same_float(alc, figures["alc"]), f"run {run.run}, {name}: {figures['alc']!r} != {alc!r}"
    for got, (alc, final_score) in zip(score.runs, expected["runs"], strict=True):
        assert same_float(alc, got.average_alc) and final_score == got.average_final_score
    assert same_float(expected["reported"][0], score.average_alc)
    assert score.average_final_score == expected["reported"][1]
