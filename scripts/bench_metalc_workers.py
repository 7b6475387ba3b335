"""The measured processes of bench_metalc.py (its hidden ``--worker MODE``): the development phase
played in process, and through ``arbiter serve`` by the runner, which also times its own requests."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from harness import REPO, emit, percentile

AGENTS_DIR = REPO / "examples" / "metalc_agent"


def load_agent_class(module: str) -> type:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{module}", AGENTS_DIR / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded.Agent


def figures(records: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r["dataset"], r["alc"], r["final_score"], r["steps"]] for r in records]


def worker_inprocess(args: argparse.Namespace) -> int:
    from arbiter.server.formats.metalc.data import load_meta_dataset
    from arbiter.server.formats.metalc.local import play_phase

    began = time.perf_counter()
    meta = load_meta_dataset(args.tests)
    agent_class = load_agent_class(args.agent_module)
    setup = time.perf_counter() - began
    began = time.perf_counter()
    records = play_phase(meta, agent_class, "dev")
    wall = time.perf_counter() - began
    emit({"path": "inprocess", "setup_s": setup, "wall_s": wall, "figures": figures(records),
          "suggests": sum(r["steps"] for r in records)})  # fmt: skip
    return 0


def mean_of(row: dict[str, Any]) -> float:
    return row["total_s"] / row["count"] if row["count"] else 0.0


def worker_arbiter(args: argparse.Namespace) -> int:
    from arbiter.client import metalc
    from arbiter.client.wire import Wire
    from arbiter.protocol.messages import FLATLAND_RL

    submitted_at = [0.0]

    class TimedWire(Wire):
        """Notes when ENV_SUBMIT goes out: the phase's play ends there (every step before it went
        out from the folds' processes, which time their own requests: ``Runner.round_trips``)."""

        def request(self, type_: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
            if type_ == FLATLAND_RL.ENV_SUBMIT:
                submitted_at[0] = time.perf_counter()
            return super().request(type_, payload, *args, **kwargs)

    began = time.perf_counter()
    wire = TimedWire(args.redis_url, args.service_id, reply_timeout_s=args.reply_timeout)
    runner = metalc.Runner(wire, metalc.Submission.checked(str(AGENTS_DIR), args.agent_module))
    setup = time.perf_counter() - began
    began = time.perf_counter()
    scores = runner.play()
    submit = time.perf_counter() - submitted_at[0]  # ENV_SUBMIT's scoring
    wall = submitted_at[0] - began
    wire.close()
    trips = runner.round_trips
    # the steps, by what they did: every step, and the steady ones (neither ending a dataset nor
    # bringing a fold's first), which split into a dataset's first when the step before brought it
    # (the evaluator gives the last dataset's notices, its event and results.csv's rows, first) and
    # the rest; "closing": a step that ended a dataset and brought the fold's next one
    steps = [s for kind in ("step", "first", "closing", "last") for s in trips[kind]["samples"]]
    steady = [*trips["step"]["samples"], *trips["first"]["samples"]]
    emit({"path": "arbiter", "setup_s": setup, "wall_s": wall, "submit_s": submit, "score": scores.get("score"),
          "suggests": len(steps), "step_p50_s": percentile(steps, 0.5), "step_p99_s": percentile(steps, 0.99),
          "step_mean_s": statistics.fmean(steps), "fold_start_s": sum(runner.fold_start_s),
          "folds": len(runner.fold_start_s), "steady_step_mean_s": statistics.fmean(steady),
          "first_step_mean_s": mean_of(trips["first"]), "first_steps": trips["first"]["count"],
          "other_step_mean_s": mean_of(trips["step"]),
          "closing_step_mean_s": mean_of(trips["closing"]), "closing_steps": trips["closing"]["count"],
          "creates": trips["create"]["count"],
          "create_mean_s": mean_of(trips["create"]), "fold_create_mean_s": mean_of(trips["fold_create"]),
          "last_step_mean_s": mean_of(trips["last"]), "turn_mean_s": mean_of(trips["suggest"])})  # fmt: skip
    return 0


WORKERS = {"inprocess": worker_inprocess, "arbiter": worker_arbiter}
