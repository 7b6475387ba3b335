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


def worker_arbiter(args: argparse.Namespace) -> int:
    from arbiter.client import metalc
    from arbiter.client.wire import Wire
    from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL

    step_s: list[float] = []  # every ENV_STEP round trip as the runner sees it
    # those whose reply ended a dataset: its record written, and the next dataset opened and
    # brought along (the runner asks for it), unless that one is a fold's first
    closing_s: list[float] = []
    steady_s: list[float] = []  # the others, which split into
    # a dataset's first step when the step before ended the fold's previous dataset and brought
    # this one (the evaluator gives the ended item's notices, its event and results.csv's rows,
    # first), and the rest
    first_s: list[float] = []
    other_s: list[float] = []
    after_closing = [False]
    create_s: list[float] = []  # the ENV_CREATE round trips that opened a dataset within a fold
    # what brought a fold's first dataset (its meta-training data): an ENV_CREATE, or an ending step
    fold_create_s: list[float] = []
    relay_s: list[float] = []  # the runner's requests to the fold's process for an action
    last_step_at = [0.0]

    class TimedWire(Wire):
        """Times every ENV_STEP and ENV_CREATE round trip as the runner sees it, and when the
        last step ended."""

        def request(self, type_: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
            if type_ not in (FLATLAND_RL.ENV_STEP, FLATLAND_RL.ENV_CREATE):
                return super().request(type_, payload, *args, **kwargs)
            before = time.perf_counter()
            reply = super().request(type_, payload, *args, **kwargs)
            after = time.perf_counter()
            body = reply.get("payload") or {}
            if type_ == FLATLAND_RL.ENV_CREATE:
                ext = body.get(EXTENSION_KEY) or {}
                if not ext.get("finished"):
                    (fold_create_s if "meta_train" in ext else create_s).append(after - before)
                return reply
            last_step_at[0] = after
            step_s.append(after - before)
            brought = (body.get(EXTENSION_KEY) or {}).get("next") or {}
            fold_first = "meta_train" in (brought.get(EXTENSION_KEY) or {})
            if fold_first:
                fold_create_s.append(after - before)
            elif body.get("done"):
                closing_s.append(after - before)
            else:
                steady_s.append(after - before)
                (first_s if after_closing[0] else other_s).append(after - before)
            after_closing[0] = bool(body.get("done") and brought) and not fold_first
            return reply

    class TimedFold(metalc.FoldProcess):
        def request(self, message: list[Any], expected: str) -> list[Any]:
            before = time.perf_counter()
            answer = super().request(message, expected)
            if message[0] == "observe":
                relay_s.append(time.perf_counter() - before)
            return answer

    metalc.FoldProcess = TimedFold  # the runner makes its folds' processes through the module
    began = time.perf_counter()
    wire = TimedWire(args.redis_url, args.service_id, reply_timeout_s=args.reply_timeout)
    runner = metalc.Runner(wire, metalc.Submission.checked(str(AGENTS_DIR), args.agent_module))
    setup = time.perf_counter() - began
    began = time.perf_counter()
    scores = runner.play()
    submit = time.perf_counter() - last_step_at[0]  # ENV_SUBMIT's scoring (and any last ENV_CREATE)
    wall = last_step_at[0] - began
    wire.close()
    emit({"path": "arbiter", "setup_s": setup, "wall_s": wall, "submit_s": submit, "score": scores.get("score"),
          "suggests": len(step_s), "step_p50_s": percentile(step_s, 0.5), "step_p99_s": percentile(step_s, 0.99),
          "step_mean_s": statistics.fmean(step_s), "fold_start_s": sum(runner.fold_start_s),
          "folds": len(runner.fold_start_s), "steady_step_mean_s": statistics.fmean(steady_s),
          "first_step_mean_s": statistics.fmean(first_s) if first_s else 0.0, "first_steps": len(first_s),
          "other_step_mean_s": statistics.fmean(other_s),
          "closing_step_mean_s": statistics.fmean(closing_s), "creates": len(create_s),
          "create_mean_s": statistics.fmean(create_s) if create_s else 0.0,
          "fold_create_mean_s": statistics.fmean(fold_create_s),
          "relay_mean_s": statistics.fmean(relay_s)})  # fmt: skip
    return 0


WORKERS = {"inprocess": worker_inprocess, "arbiter": worker_arbiter}
