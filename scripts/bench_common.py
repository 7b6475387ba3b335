"""What the benchmarks' processes share: the Flatland benchmark's constants (scripts/bench.py),
its deterministic agent and the evaluation order of a test set; the line every worker reports its
result on; percentiles; the machine a benchmark ran on."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT_MARK = "BENCH_RESULT "
EVAL_SEED = 1001  # flatland's evaluation seed, arbiter's default --seed
TESTSET_SEED = 42  # the reference test set: preset generated with this seed
HOST = "127.0.0.1"
PATHS = ("direct", "lean", "arbiter", "flatland")
LOCAL_PATHS = ("direct", "lean")  # in-process loops: no evaluator, nothing to wait for


class BenchError(RuntimeError):
    """A worker failed, timed out or produced no result."""


def agent_actions(episode: int, step: int, num_agents: int) -> dict[int, int]:
    """The deterministic agent: the same dict of ints in every path."""
    return {handle: (episode * 7 + step * 3 + handle * 5) % 5 for handle in range(num_agents)}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the definition arbiter's summary uses)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def step_stats(times: list[float]) -> dict[str, float]:
    if not times:
        return {"n": 0, "mean": 0.0, "p99": 0.0, "max": 0.0, "total": 0.0}
    return {
        "n": len(times),
        "mean": math.fsum(times) / len(times),
        "p99": percentile(times, 0.99),
        "max": max(times),
        "total": math.fsum(times),
    }


def ordered_env_paths(tests_dir: str) -> list[str]:
    """``Test_<t>/Level_<l>.pkl`` in flatland's evaluation order (t * 1000 + l), relative."""
    found = []
    for test_dir in Path(tests_dir).glob("Test_*"):
        for level in test_dir.glob("Level_*.pkl"):
            t, lv = int(test_dir.name.split("_")[1]), int(level.stem.split("_")[1])
            found.append((t, lv, f"{test_dir.name}/{level.name}"))
    return [rel for _, _, rel in sorted(found)]


def arrived_count(env: Any) -> int:
    from flatland.envs.step_utils.states import TrainState

    return sum(1 for agent in env.agents if agent.state == TrainState.DONE)


def vm_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def emit(result: dict[str, Any]) -> None:
    print(RESULT_MARK + json.dumps(result), flush=True)


def arbiter_rev() -> str:
    """The checkout's ``git describe`` (``-dirty`` with local changes), else "unknown"."""
    try:
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return rev or "unknown"


def machine_basics() -> dict[str, Any]:
    return {
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
