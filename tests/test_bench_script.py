"""scripts/bench.py --quick runs end to end: four paths, matching trajectories, sound ratios."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "scripts" / "bench.py"


@pytest.mark.timeout(300)
def test_quick_benchmark_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out), "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert completed.returncode == 0, f"stdout:\n{completed.stdout[-4000:]}\nstderr:\n{completed.stderr[-4000:]}"
    report = json.loads(out.read_text(encoding="utf-8"))

    assert set(report["paths"]) == {"direct", "lean", "arbiter", "flatland"}
    for name, path in report["paths"].items():
        walls = [run["wall_s"] for run in path["runs"]]
        assert walls and all(w > 0 for w in walls), name
        assert path["wall_s"]["median"] == pytest.approx(statistics.median(walls)), name
        assert path["wall_s"]["min"] <= path["wall_s"]["median"] <= path["wall_s"]["max"], name
    for name in ("arbiter", "flatland"):
        assert report["paths"][name]["server_step_mean_s"] > 0, name

    assert report["trajectories_match"] is True
    assert report["trajectories"]["mismatches"] == []
    assert len(report["reference"]) == 2 and all(e["steps"] > 0 for e in report["reference"])

    medians = {name: report["paths"][name]["wall_s"]["median"] for name in report["paths"]}
    ratios = report["ratios"]
    assert math.isclose(ratios["arbiter_over_direct"], medians["arbiter"] / medians["direct"], rel_tol=1e-9)
    assert math.isclose(ratios["arbiter_over_lean"], medians["arbiter"] / medians["lean"], rel_tol=1e-9)
    assert math.isclose(ratios["arbiter_over_flatland"], medians["arbiter"] / medians["flatland"], rel_tol=1e-9)
    assert len(ratios["per_round"]) == report["config"]["rounds"] == 1
    assert report["config"]["warmup_rounds"] == 0
    paired = ratios["median_of_round_ratios"]  # one round: its own ratios
    assert paired["arbiter_over_direct"] == pytest.approx(ratios["per_round"][0]["arbiter_over_direct"])
    assert paired["arbiter_over_lean"] == pytest.approx(ratios["per_round"][0]["arbiter_over_lean"])
    assert paired["arbiter_over_flatland"] == pytest.approx(ratios["per_round"][0]["arbiter_over_flatland"])

    contention = report["contention"]  # two lean loops at once, each against the round's lean loop
    assert len(contention["pair_walls_s"]) == 1 and len(contention["pair_walls_s"][0]) == 2
    assert contention["factor_median"] == pytest.approx(
        statistics.fmean(contention["pair_walls_s"][0]) / report["paths"]["lean"]["runs"][0]["wall_s"]
    )
    assert report["protocol"]["steps_per_s"] > 0
    assert report["protocol"]["server_steps_read"] == report["protocol"]["n"]
    assert report["env_create"]["arbiter_s"] > 0 and report["env_create"]["flatland_s"] > 0
    assert report["memory"]["episodes_played"] == report["memory"]["episodes"] == 50
    assert report["scale"]["count"] == 2 and report["scale"]["consistent"] is True
    assert "arbiter/direct" in completed.stdout  # the table was printed
