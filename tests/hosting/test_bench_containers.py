"""scripts/bench_containers.py in its quick mode: its output's structure and the arithmetic that
ties its figures together (not podman's speed)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import paths
import pytest
from containers import podman_or_skip

BENCH = paths.REPO / "scripts" / "bench_containers.py"


@pytest.mark.timeout(180)
def test_the_quick_container_benchmark_runs_and_reports(tmp_path) -> None:
    podman_or_skip()
    out = tmp_path / "containers.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=170, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["problems"] == []
    figures = report["figures"]
    for side in ("podman", "local"):
        assert figures[side]["states"] == ["finished"] and figures[side]["attempts"] == [1]
        assert figures[side]["cycle_s"]["median"] > 0
    assert figures["podman"]["scores"] == figures["local"]["scores"] != []
    # one round: the cost is the podman cycle's median less the local cycle's
    (cost,) = report["cost_s"]["per_round"]
    assert cost == pytest.approx(figures["podman"]["cycle_s"]["median"] - figures["local"]["cycle_s"]["median"])
    assert report["cost_s"]["median"] == pytest.approx(statistics.median([cost]))
    assert f"the container's cost per submission: median {cost:.3f} s" in done.stdout
    assert "checks: every submission finished once, with the same score on both backends" in done.stdout
