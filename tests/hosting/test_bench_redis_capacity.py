"""scripts/bench_redis_capacity.py in its quick mode: its output's structure and the arithmetic
that ties its figures together (not Redis's speed, nor whether this machine drives the modelled
evaluations at the pace asked: it is checked that the benchmark says so when it does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import paths
import pytest

BENCH = paths.REPO / "scripts" / "bench_redis_capacity.py"


def edge_error(level: dict, calls_per_step: float) -> float:
    """How far a command's calls per agent step can be off by the window's edges alone. Commands
    are counted in the window and steps by when their reply came: an agent's step under way at
    either edge has its commands counted and not its reply, or its reply and not its commands.
    The agents all start at one signal and think alike, so they may all be under way at once."""
    return calls_per_step * level["evaluations"] / level["agent_steps"]


def test_the_quick_redis_capacity_benchmark_runs_and_reports(tmp_path) -> None:
    out = tmp_path / "capacity.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=110, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode in (0, 1), output
    report = json.loads(out.read_text(encoding="utf-8"))
    # The one problem a busy machine may cause: modelled agents that could not keep the pace asked,
    # whose figures the benchmark then refuses (exit 1). It must be reported exactly where the
    # figures show it, and nothing else may be.
    pace_asked = 1 / report["think_s"]
    slow = [model for model in report["models"] if model["steps_per_s_per_evaluation"] < 0.85 * pace_asked]
    assert report["problems"] == [
        f"{model['evaluations']} modelled: {model['steps_per_s_per_evaluation']:.1f} steps/s each, under 85% of "
        "the pace asked (this machine could not drive them)"
        for model in slow
    ], output
    assert done.returncode == (1 if slow else 0), output
    levels = report["levels"]
    assert [level["evaluations"] for level in levels] == [2, 4]
    for level in levels:
        assert level["states"] == ["SUCCESS"] and level["agents_covering_window"] == level["evaluations"]
        assert level["agent_steps"] > 0 and level["redis_cpu_share"] > 0
        assert level["redis_cpu_per_step_s"] == pytest.approx(
            level["redis_cpu_share"] * level["window_s"] / level["agent_steps"]
        )
        assert level["evaluations_per_core"] == pytest.approx(1 / (20 * level["redis_cpu_per_step_s"]))
        # each step is a request and a reply through Redis: at least one command each way
        commands = level["commands_per_step"]
        assert sum(stat["calls"] for stat in commands.values()) >= 2
        assert all(stat["calls"] > 0 and stat["usec"] >= 0 for stat in commands.values())
        # an agent that thinks 50 ms before each request makes at most one more than window / 50 ms in it
        assert 0 < level["steps_per_s_per_evaluation"] <= 20 + 1 / level["window_s"]
    # the floor: bare exchanges at the largest count, four commands a step and nothing else
    floor = report["floor"]
    assert floor["evaluations"] == 4 and floor["askers_covering_window"] == 4
    assert floor["commands_per_step"]["lpush"] == pytest.approx(2, abs=0.05 + edge_error(floor, 2))
    assert floor["commands_per_step"]["blpop"] == pytest.approx(2, abs=0.05 + edge_error(floor, 2))
    per_step = floor["redis_cpu_share"] * floor["window_s"] / floor["agent_steps"]
    assert floor["redis_cpu_per_step_s"] == pytest.approx(per_step)
    assert floor["evaluations_per_core"] == pytest.approx(1 / (20 * floor["redis_cpu_per_step_s"]))
    ratio = levels[-1]["redis_cpu_per_step_s"] / floor["redis_cpu_per_step_s"]
    assert f"cost Redis {ratio:.2f} × the bare exchange" in done.stdout
    prediction = report["prediction"]
    assert prediction["predicted_share"] == pytest.approx(levels[-1]["steps_per_s"] * levels[0]["redis_cpu_per_step_s"])
    models = report["models"]
    assert [model["evaluations"] for model in models] == [4, 40]
    real = levels[-1]
    real_calls = {name: stat["calls"] for name, stat in real["commands_per_step"].items()}
    for model in models:
        per_step = model["redis_cpu_share"] * model["window_s"] / model["agent_steps"]
        assert model["redis_cpu_per_step_s"] == pytest.approx(per_step)
        # the model sends what the real evaluator and client send, command for command, each step
        model_calls = {name: stat["calls"] for name, stat in model["commands_per_step"].items()}
        for name in ("evalsha", "blmove", "blpop", "lpush", "rpush", "expire", "client", "rpop"):
            allowed = 0.05 + edge_error(real, real_calls[name]) + edge_error(model, model_calls[name])
            assert model_calls[name] == pytest.approx(real_calls[name], abs=allowed), name
    calibration = report["calibration"]
    assert calibration["evaluations"] == 4
    assert calibration["ratio"] == pytest.approx(models[0]["redis_cpu_per_step_s"] / levels[-1]["redis_cpu_per_step_s"])
    target = report["target"]
    assert target["evaluations_per_redis_core"] == 1000
    judged = [models[-1]] if report["model_trusted"] else levels
    assert report["model_trusted"] == (0.67 <= calibration["ratio"] <= 1.5)
    assert target["judged"] == min(level["evaluations_per_core"] for level in judged)
    assert target["met"] == (target["judged"] >= 1000)
    verdict = "met" if target["met"] else "NOT met"
    assert f"target evaluations one Redis core carries at 20 steps/s ≥ 1,000 evaluations: {verdict}" in done.stdout
    assert f"Redis's work per agent step at {levels[-1]['evaluations']} at once:" in done.stdout
    if slow:
        assert "checks: " + "; ".join(report["problems"]) in done.stdout
    else:
        assert "checks: every agent stepped through the window; every evaluation ended SUCCESS" in done.stdout
