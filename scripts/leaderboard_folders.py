"""The results folders bench_leaderboard.py builds boards of: a few real Flatland evaluations of
small levels, copied into many submissions that differ only by who submitted them and when (a few
marked debug, a few failed, as a farm has them), so every figure on the board is a real one."""

from __future__ import annotations

import datetime
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

from harness import BenchError, BenchSession

COMPETITION = "bench-leaderboard"  # the competition file's name: its results are under RESULTS_ROOT/<it>/
START = datetime.datetime(2026, 11, 2, 9, 0, tzinfo=datetime.UTC)  # the first copy's submission time
SUBMISSION_SPACING = datetime.timedelta(minutes=3)
STOPPED = "stopped by SIGTERM"  # an INTERRUPTED copy's cause, as an evaluator writes it
DEBUG_EVERY, INTERRUPTED_EVERY = 50, 100  # one copy in so many is marked so (at least one of each)

# A Flatland agent in a process of its own: ``forward`` (every train always moves forward), or
# ``random SEED`` (uniform actions from its own seeded generator).
AGENT = """
import sys
import numpy as np
from arbiter.client import RemoteClient
forward = sys.argv[1] == "forward"
rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
client = RemoteClient()
while client.env_create()[0]:
    while True:
        handles = range(client.env.get_num_agents())
        if client.env_step({h: 2 if forward else int(rng.integers(0, 5)) for h in handles})[2]["__all__"]:
            break
client.submit()
"""


def competition_file(folder: Path, tests: Path) -> Path:
    path = folder / f"{COMPETITION}.toml"
    path.write_text(
        f'format = "flatland"\nscoring = "neurips2020"\ntests = {json.dumps(str(tests))}\n'
        "[budgets]\nplanning_s = 30\nstep_s = 5\noverall_s = 600\nidle_s = 60\n"
        # flatland-neurips2020's board, which the checks hold the rows to
        '[leaderboard]\ncolumns = ["normalized_return", "arrived_fraction"]\nranking = "lexicographic"\n',
        encoding="utf-8",
    )
    return path


def evaluate_agents(session: BenchSession, redis_url: str, competition: Path, agents: int,
                    timeout_s: float) -> list[Path]:  # fmt: skip
    """One real evaluation per agent, one after another; their results folders."""
    folders = []
    for number in range(agents):
        policy = ["forward"] if number == 0 else ["random", str(number)]
        results = session.workdir / "evaluations" / f"agent-{number}"
        argv = [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", str(competition),
                "--redis-url", redis_url, "--service-id", f"bench-leaderboard-agent-{number}", "--results",
                str(results), "--participant", f"agent-{number}", "--quiet", "--",
                sys.executable, "-c", AGENT, *policy]  # fmt: skip
        session.procs.wait([session.procs.start(f"evaluation-agent-{number}", argv)], timeout_s)
        summary = results / "summary.json"
        state = json.loads(summary.read_text(encoding="utf-8"))["state"] if summary.is_file() else "without a summary"
        if state != "SUCCESS":
            raise BenchError(f"the evaluation of agent {number} ended {state}; see {results}")
        folders.append(results)
    return folders


def make_submissions(evaluations: list[Path], root: Path, count: int, participants: int, seed: int) -> dict[str, Any]:
    """``count`` copies of the evaluations under ``root/<competition>/<submission id>/``, each with
    its own identity; a few debug, a few INTERRUPTED. What was made, for the checks."""
    chooser = random.Random(seed)
    debug_count = max(1, count // DEBUG_EVERY)
    marked = chooser.sample(range(count), debug_count + max(1, count // INTERRUPTED_EVERY))
    debug, interrupted = set(marked[:debug_count]), set(marked[debug_count:])
    submissions = []
    for index in range(count):
        source = chooser.randrange(len(evaluations))
        submitted = START + index * SUBMISSION_SPACING
        identity = {
            "participant": f"participant-{index % participants:04d}",
            "id": f"sub-{submitted:%Y%m%d}-{index:04x}{chooser.getrandbits(32):08x}",
            "submitted_at": submitted.isoformat(timespec="seconds"),
            "debug": index in debug,
        }
        folder = root / COMPETITION / identity["id"]
        shutil.copytree(evaluations[source], folder)
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        summary["submission"] = identity
        summary["debug"] = identity["debug"]
        if index in interrupted:
            summary["state"], summary["termination_cause"] = "INTERRUPTED", STOPPED
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        submissions.append({**identity, "source": source, "interrupted": index in interrupted})
    scored = [s for s in submissions if not s["debug"] and not s["interrupted"]]
    return {
        "folders": count,
        "debug": len(debug),
        "interrupted": len(interrupted),
        "participants": participants,
        "ranked_participants": len({s["participant"] for s in scored}),
        "submissions": submissions,
    }
