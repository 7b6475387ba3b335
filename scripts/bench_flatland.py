"""What the Flatland benchmark's processes share (scripts/bench.py): its reference levels and the
test sets made of them, the deterministic agent, and a few per-step figures."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path
from typing import Any

from harness import percentile

EVAL_SEED = 1001  # flatland's evaluation seed, arbiter's default --seed
TESTSET_SEED = 42  # the seed the reference levels are generated with
HOST = "127.0.0.1"
PATHS = ("direct", "lean", "arbiter", "flatland")
LOCAL_PATHS = ("direct", "lean")  # in-process loops: no evaluator, nothing to wait for

# The reference levels: growing sizes, one Test per size, to show how the evaluator scales with
# the number of agents and the grid (parameters of arbiter's test-set generator).
REFERENCE_LEVELS: list[dict[str, Any]] = [
    {"test": 0, "level": 0, "n_agents": 3, "dim": 30},
    {"test": 1, "level": 0, "n_agents": 10, "dim": 40, "n_cities": 3},
    {"test": 2, "level": 0, "n_agents": 20, "dim": 50, "n_cities": 4},
    {"test": 3, "level": 0, "n_agents": 30, "dim": 60, "n_cities": 5},
    {"test": 4, "level": 0, "n_agents": 40, "dim": 70, "n_cities": 6},
    {"test": 5, "level": 0, "n_agents": 50, "dim": 80, "n_cities": 7},
]


def reference_test_set(envs: int, cache_dir: str | None) -> Path:
    """The first ``envs`` reference levels (all with 0) as a test folder, generated on first use
    into the cache folder (arbiter's, unless ``cache_dir``) under a name that says what it holds."""
    from arbiter.server.formats.flatland.generate import cached_test_set

    levels = REFERENCE_LEVELS[:envs] if envs else REFERENCE_LEVELS
    return cached_test_set(seed=TESTSET_SEED, cache_dir=cache_dir, levels=levels)


def replicated_test_set(source: Path, out: Path, count: int) -> Path:
    """``Test_0/Level_0..count-1``: copies of ``source``'s envs, round-robin, with metadata rows."""
    from arbiter.server.formats.flatland.generate import list_env_paths

    sources = list_env_paths(source)
    with open(source / "metadata.csv", newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        by_path = {f"{row['test_id']}/{row['env_id']}.pkl": row for row in reader}
    (out / "Test_0").mkdir(parents=True)
    rows = []
    for level in range(count):
        rel = sources[level % len(sources)]
        shutil.copyfile(source / rel, out / "Test_0" / f"Level_{level}.pkl")
        rows.append({**by_path[rel], "test_id": "Test_0", "env_id": f"Level_{level}"})
    with open(out / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return out


def agent_actions(episode: int, step: int, num_agents: int) -> dict[int, int]:
    """The deterministic agent: the same dict of ints in every path."""
    return {handle: (episode * 7 + step * 3 + handle * 5) % 5 for handle in range(num_agents)}


AGENT_RULE = "(episode * 7 + step * 3 + handle * 5) % 5"  # agent_actions, as the report names it


def step_stats(times: list[float]) -> dict[str, float]:
    if not times:
        return {"n": 0, "mean": 0.0, "p99": 0.0, "max": 0.0, "total": 0.0}
    return {"n": len(times), "mean": math.fsum(times) / len(times), "p99": percentile(times, 0.99),
            "max": max(times), "total": math.fsum(times)}  # fmt: skip


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
