"""scripts/bench_farm.py in its quick mode: every farm evaluates every submission once, with
arbiter run's score, and reports figures that hold together and the target's verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import paths

BENCH_FARM = paths.REPO / "scripts" / "bench_farm.py"
PHASES = {"build_evaluator_s", "agent_start_s", "evaluation_s", "after_evaluation_s"}


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
        assert farm["attempts"] == [1] and farm["deliveries"] == [1]
        assert len(farm["scores"]) == 1 and farm["scores"] == farm["peer_scores"]
        assert farm["per_minute"] > 0
        assert 0 <= farm["farm"]["queue_wait_s"]["median"] <= farm["farm"]["queue_wait_s"]["max"]
        assert set(farm["farm"]) >= PHASES | {"cycle_s", "next_attempt_start_s"} and set(farm["peer"]) >= PHASES
        # a farm cycle holds its evaluation; an arbiter run's wall time holds its own
        assert farm["farm"]["cycle_s"]["min"] > farm["farm"]["evaluation_s"]["min"] > 0
        assert farm["peer"]["wall_s"]["min"] > farm["peer"]["evaluation_s"]["min"] > 0
        assert len(farm["ratio"]["per_round"]) == 1 and farm["ratio"]["median"] > 0
    assert [target["workers"] for target in report["targets"]] == [1, 2]
    for target in report["targets"]:
        assert target["farm_over_run"] == 1.02 and target["met"] == (target["median"] <= 1.02)
        verdict = "met" if target["met"] else "NOT met"
        assert f"{target['workers']} at a time: {verdict} (median {target['median']:.3f}" in done.stdout
    assert set(report["profile"]) == {"import_runner_s", "import_report_s", "write_report_s",
                                      "agent_interpreter_and_imports_s"}  # fmt: skip
    assert "checks: every submission finished once, with arbiter run's score" in done.stdout
