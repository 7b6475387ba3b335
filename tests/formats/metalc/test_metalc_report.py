"""MetaLC's report sections (docs/formats/metalc.md): a best-so-far curve per dataset, runs side by side."""

from __future__ import annotations

import os
import random

import numpy as np
import paths
import pytest

from arbiter.server.formats.metalc import FORMAT
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.options import MetaLCOptions
from arbiter.server.formats.metalc.report import best_so_far_points, report_sections

AGENTS_DIR = os.path.join(paths.EXAMPLES, "metalc_agent")
SETTINGS = GeneratorSettings(datasets=14, algorithms=6, seed=1, missing_fraction=0.05, duplicate_fraction=0.15)


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


def load_agent(name: str) -> type:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"metalc_{name}", os.path.join(AGENTS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Agent


def test_the_drawn_curve_encloses_the_datasets_alc(data_dir, meta, restore_process):
    for record in play_phase(meta, load_agent("schedule_agent"), "dev"):
        points = best_so_far_points(record)
        area = sum((x1 - x0) * y0 for (x0, y0), (x1, _) in zip(points, points[1:], strict=False))
        assert area == pytest.approx(record["alc"], abs=1e-12)


@pytest.mark.parametrize("phase", ["dev", "final"])
def test_the_report_has_a_curve_per_dataset_and_the_runs_side_by_side(data_dir, meta, restore_process, phase):
    records = play_phase(meta, load_agent("agent"), phase)
    records[0] = {**records[0], "timed_out": True, "ended": "step_timeout", "alc": 0.0}
    score = FORMAT.rules["alc"](MetaLCOptions(phase=phase)).aggregate(records)
    html = FORMAT.report_sections({"score": score}, records)
    assert html == report_sections({"score": score}, records)
    for dataset in meta.datasets:
        assert f'data-chart="metalc-curve-{dataset}"' in html
    runs = 3 if phase == "final" else 1
    assert html.count('class="area') == len(meta.datasets)  # one shaded run per dataset
    assert html.count("<polyline") == runs * len(meta.datasets)
    assert "step budget ran out" in html
    if phase == "final":
        assert "ALC run 2" in html and "(reported)" in html


def test_the_report_survives_a_record_without_its_curve(data_dir, meta, restore_process):
    records = play_phase(meta, load_agent("schedule_agent"), "dev")
    broken = {k: v for k, v in records[1].items() if k not in ("times", "time_budget")}
    html = report_sections({"score": {}}, [records[0], broken, *records[2:]])
    assert f"{broken['dataset']}: no curve" in html
    assert f'data-chart="metalc-curve-{records[0]["dataset"]}"' in html
