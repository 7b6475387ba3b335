"""scripts/bench_targets.py runs the benchmarks of arbiter's evaluation paths one after the other and
prints every target they judged in one table: each verdict is the benchmark's own, its floor the
one that benchmark measured, and the table says so line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from benchmarks import run_benchmark

BENCH_TARGETS = paths.REPO / "scripts" / "bench_targets.py"
EVERY_BENCHMARK = {"flatland", "remote-env", "diambra", "metalc"}


def own_targets(name: str, report: dict) -> list[dict]:
    """The target dicts a benchmark's own report holds, in the order it judged them."""
    if name == "flatland":
        return report["targets"]
    if name == "remote-env":
        return [report["target"]]
    if name == "diambra":
        return [shape["target"] for shape in report["shapes"].values()]
    return [report["target"], *report["thresholds"]]


@pytest.mark.timeout(300)
def test_every_target_of_every_benchmark_is_judged_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "targets.json"
    completed = run_benchmark(BENCH_TARGETS.name, "--quick", "--json", str(out), cwd=tmp_path, timeout_s=270)
    combined = json.loads(out.read_text(encoding="utf-8"))
    assert set(combined["benchmarks"]) == EVERY_BENCHMARK
    verdicts = combined["verdicts"]

    for name, outcome in combined["benchmarks"].items():
        assert outcome["status"] == 0, name
        assert "--quick" in outcome["argv"] or outcome["argv"][-6:-2] == ["--steps", "200", "--warmup", "20"], name
        report = outcome["report"]
        mine = [v for v in verdicts if v["benchmark"] == name]
        targets = own_targets(name, report)
        assert len(mine) == len(targets) >= 1, name
        for verdict, target in zip(mine, targets, strict=True):
            bound = next(iter(target.values()))  # each target's dict starts with its name and bound
            assert verdict["judged"] == target["judged"], (name, verdict["target"])
            assert verdict["met"] is target["met"]
            # the benchmark's verdict, recomputed from its figure and bound
            assert target["met"] is (target["judged"] >= bound if target["at_least"] else target["judged"] <= bound)

    floors = {v["benchmark"]: v for v in verdicts if v["floor"] is not None}
    assert set(floors) == {"flatland", "remote-env"}  # the two benchmarks that measure a floor
    flatland = combined["benchmarks"]["flatland"]["report"]
    assert floors["flatland"]["floor"] == flatland["floor"]["factor_median"]
    assert floors["flatland"]["floor_met"] is (flatland["floor"]["factor_median"] <= 1.10)
    remote = combined["benchmarks"]["remote-env"]["report"]
    assert floors["remote-env"]["floor"] == remote["ratios"]["floor_over_async1"]["median"]
    assert floors["remote-env"]["floor_met"] is (floors["remote-env"]["floor"] >= 1.5)

    lines = completed.stdout.splitlines()
    for verdict in verdicts:
        (line,) = [line for line in lines if line.startswith(f"{verdict['benchmark']:<11} {verdict['target']} ")]
        said = line.rsplit("  ", 1)[1]
        assert said.startswith("met" if verdict["met"] else "NOT met"), line
        assert ("its floor misses it too" in said) is (verdict["floor_met"] is False), line
    assert f"targets met: {sum(v['met'] for v in verdicts)} of {len(verdicts)}" in completed.stdout

    # What the hypervisor took while each benchmark ran, measured around it and by the benchmark itself.
    counted = Path("/proc/stat").exists()
    for name, outcome in combined["benchmarks"].items():
        (line,) = [line for line in lines if line.startswith(f"{name}: checks passed, ")]
        for share in (outcome["steal_share"], outcome["report"]["steal_share"]):
            assert (share is not None and 0.0 <= share <= 1.0) if counted else share is None, (name, share)
        assert line.endswith("of the CPUs' time (steal)") is counted, line
    own_lines = [line for line in lines if line.startswith("benchmark time: ")]
    assert len(own_lines) == len(EVERY_BENCHMARK)
    assert all(("; the hypervisor took " in line) is counted for line in own_lines), own_lines


def test_it_refuses_an_unknown_benchmark_before_running_any(tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, str(BENCH_TARGETS), "--only", "metalc,flatlnd"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2
    assert "--only takes names among flatland, remote-env, diambra, metalc; got 'metalc,flatlnd'" in refused.stderr
    assert "bench_targets: " not in refused.stdout  # no benchmark started
    assert list(tmp_path.iterdir()) == []


def test_a_benchmark_that_fails_fails_the_run_and_the_table_says_so(tmp_path: Path) -> None:
    # RemoteEnv refuses a polling window that is not a number: the benchmark's agent cannot start
    failing = subprocess.run([sys.executable, str(BENCH_TARGETS), "--quick", "--only", "remote-env"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "ARBITER_SPIN_US": "soon"})  # fmt: skip
    assert failing.returncode == 2, failing.stdout[-3000:]
    assert "ARBITER_SPIN_US must be a number of microseconds" in failing.stdout + failing.stderr
    assert "remote-env: exit status 2, no report written" in failing.stdout
    assert "targets met: 0 of 0" in failing.stdout
