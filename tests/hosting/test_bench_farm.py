"""scripts/bench_farm.py in its quick mode: every farm evaluates every submission once, with the
same score, and reports figures that hold together."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import paths

BENCH_FARM = paths.REPO / "scripts" / "bench_farm.py"


def test_the_quick_farm_benchmark_runs_and_reports(tmp_path) -> None:
    out = tmp_path / "farm.json"
    done = subprocess.run(
        [sys.executable, str(BENCH_FARM), "--quick", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=110, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [farm["workers"] for farm in report["farms"]] == [1, 2]
    assert report["problems"] == []
    for farm in report["farms"]:
        assert farm["submissions"] == 4 and farm["states"] == ["finished"]
        assert farm["attempts"] == [1] and farm["deliveries"] == [1] and len(farm["scores"]) == 1
        assert farm["per_minute"] > 0 and 0 <= farm["queue_wait_s"]["median"] <= farm["queue_wait_s"]["max"]
        assert farm["farm_cost_s"]["median"] <= farm["farm_cost_s"]["max"]
    assert "checks: every submission finished once, with the same score" in done.stdout
