"""scripts/step_trace.py splits remote steps into the agent's, Redis's and the evaluator's parts from
the kernel's scheduler events: on a trace whose every step is known, and live where perf may record
scheduler events on every CPU, each run stopped once traced."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest

STEP_TRACE = paths.REPO / "scripts" / "step_trace.py"
AGENT, EVALUATOR, REDIS = 100, 200, 300
START_S = 1000.0


def wake(writer: int, cpu: int, at_us: float, target_cpu: int = 0) -> str:
    return (f"  {writer} [{cpu:03d}] {START_S + at_us / 1e6:.6f}: sched:sched_wakeup: comm=redis-server pid={REDIS} "
            f"prio=120 target_cpu={target_cpu:03d}")  # fmt: skip


def switch(cpu: int, at_us: float, prev: int, state: str, nxt: int) -> str:
    return (f"  {prev} [{cpu:03d}] {START_S + at_us / 1e6:.6f}: sched:sched_switch: prev_comm=x prev_pid={prev} "
            f"prev_prio=120 prev_state={state} ==> next_comm=y next_pid={nxt} next_prio=120")  # fmt: skip


def redis_asleep(at_us: float) -> str:
    return switch(0, at_us, REDIS, "S", EVALUATOR)


def step_marks(agent_at: float, request_done: float, evaluator_at: float, reply_done: float) -> list[str]:
    """One step's marks: the agent's write, Redis asleep, the evaluator's write, Redis asleep (µs)."""
    return [wake(AGENT, 1, agent_at), redis_asleep(request_done), wake(EVALUATOR, 0, evaluator_at),
            redis_asleep(reply_done)]  # fmt: skip


def known_trace() -> list[str]:
    """The agent alone on CPU 1, the evaluator and Redis on CPU 0; three whole steps, the second
    with a second write of the evaluator's, between marks that belong to no whole step."""
    return [
        switch(1, 0, 0, "R", AGENT),
        switch(0, 0, 0, "R", EVALUATOR),
        redis_asleep(-0.0),  # before any request: no step
        wake(EVALUATOR, 0, 1),  # a write with no request before it: no step
        "a line perf prints that is not an event",
        *step_marks(2, 12, 42, 54),  # agent 48, request 10, evaluator 30, reply 12, step 100
        # request 15, evaluator 45, reply 160 -> 178 (two writes), agent 42, step 120
        *step_marks(102, 117, 162, 172),
        wake(EVALUATOR, 0, 177),
        redis_asleep(180),
        *step_marks(222, 234, 264, 276),  # request 12, evaluator 30, reply 12, agent 56, step 110
        wake(AGENT, 1, 332),  # the next step, cut off by the end of the trace
        redis_asleep(343),
    ]


def run_step_trace(*options: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STEP_TRACE), *options], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_known_trace_splits_into_its_steps(tmp_path: Path) -> None:
    events = tmp_path / "events.txt"
    events.write_text("\n".join(known_trace()) + "\n", encoding="utf-8")
    out = tmp_path / "trace.json"
    completed = run_step_trace("--from-events", str(events), "--pids", f"{AGENT},{EVALUATOR},{REDIS}",
                               "--json", str(out), cwd=tmp_path, timeout_s=50)  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    result = json.loads(out.read_text(encoding="utf-8"))["trace"]

    assert result["steps"] == 3
    per_step = {"agent": (48, 42, 56), "request": (10, 15, 12), "evaluator": (30, 45, 30), "reply": (12, 18, 12),
                "step": (100, 120, 110)}  # fmt: skip
    for segment, values in per_step.items():
        figures = result["segments"][segment]
        assert figures["p50_us"] == pytest.approx(sorted(values)[1], abs=1e-3), segment
        assert figures["mean_us"] == pytest.approx(sum(values) / 3, abs=1e-3), segment
    assert math.isclose(sum(result["segments"][s]["mean_us"] for s in ("agent", "request", "evaluator", "reply")),
                        result["segments"]["step"]["mean_us"], abs_tol=1e-3)  # fmt: skip
    # The agent's four writes woke Redis on CPU 0 from CPU 1; the evaluator's, on its own CPU.
    assert result["woke_redis_on_another_cpu"] == {"agent": 1.0, "evaluator": 0.0}
    assert result["cpu_shares"]["agent"] == {"1": pytest.approx(1.0)}
    assert result["cpu_shares"]["evaluator"] == {"0": pytest.approx(1.0)}
    assert result["traced_s"] == pytest.approx(343e-6, abs=1e-9)
    assert result["traced_steps_per_s"] == pytest.approx(3 / 343e-6)
    assert "evaluator" in completed.stdout and "woke Redis on another CPU" in completed.stdout


def perf_refusal() -> str | None:
    """Why perf cannot record scheduler events on every CPU here, or None when it can."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: linux-perf)"
    probe = subprocess.run([perf, "record", "-q", "-e", "sched:sched_switch", "-a", "-o", "/dev/null", "--", "true"],
                           capture_output=True, text=True)  # fmt: skip
    return None if probe.returncode == 0 else f"perf may not record scheduler events here: {probe.stderr[-200:]}"


@pytest.mark.timeout(240)
def test_remote_and_floor_steps_traced_live(tmp_path: Path) -> None:
    refusal = perf_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    out = tmp_path / "trace.json"
    # Ten million steps would take either path many minutes: the runs end within the timeout only
    # because each is stopped once traced.
    completed = run_step_trace("--steps", "10000000", "--settle-s", "1.0", "--trace-s", "0.2", "--json", str(out),
                               cwd=tmp_path, timeout_s=220)  # fmt: skip
    assert completed.returncode == 0, f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    results = json.loads(out.read_text(encoding="utf-8"))
    assert set(results) == {"remote", "floor"}
    for path, result in results.items():
        assert result["steps"] >= 50, path
        assert result["traced_steps_per_s"] == pytest.approx(result["steps"] / result["traced_s"]), path
        segments = result["segments"]
        parts = sum(segments[s]["mean_us"] for s in ("agent", "request", "evaluator", "reply"))
        assert math.isclose(parts, segments["step"]["mean_us"], rel_tol=1e-9), path
        assert all(segments[s]["p50_us"] > 0 for s in segments), path
        # Whole steps come one after the other: they cannot take more than the traced time.
        assert result["steps"] * segments["step"]["mean_us"] <= result["traced_s"] * 1e6, path
        assert set(result["woke_redis_on_another_cpu"]) == {"agent", "evaluator"}, path
        for who in ("agent", "evaluator", "redis"):
            assert 0 < sum(result["cpu_shares"][who].values()) <= 1.0 + 1e-9, (path, who)
    assert "remote − floor" in completed.stdout
