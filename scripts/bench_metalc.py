#!/usr/bin/env python3
"""Benchmark MetaLC's development phase through arbiter against the same phase in process.

    python scripts/bench_metalc.py [--tests DIR] [--agent-module agent] [--rounds 5] [--warmup 1]
                                   [--quick] [--json PATH] [--keep]

One agent of examples/metalc_agent (default ``agent``: rank the algorithms by their mean final
test score, then take turns among the top three, ten suggestions per dataset) plays the
development phase of one meta-dataset two ways:

  inprocess  arbiter's MetaLC env and the agent in one process (``local.play_phase``), as the
             challenge's ingestion program ran them: folds, meta-training data, episodes;
  arbiter    ``arbiter serve --competition metalc-wcci2022`` and the runner
             ``arbiter.client.metalc`` in another process, over a redis-server this script starts
             (its unix socket, as ``arbiter run``; ``--tcp``: a free loopback port).

The meta-dataset is ``--tests DIR`` (such as the round-1 ``input_data/``), else a synthetic one of
round 1's size (30 datasets, 20 algorithms) written by arbiter's generator. Each path runs in a
subprocess of its own (``--worker MODE``) that loads what it needs first and then measures: the
in-process path from the first fold's agent to the last dataset's last step; the arbiter path
from its first ENV_CREATE to the reply to the last dataset's last step (the handshake is set-up,
as loading the meta-dataset is; the folds' processes, which import the agent, are counted; the
final ENV_SUBMIT, which computes the scores the in-process path never does, is reported apart).
The paths alternate within each round; ratios are per round.
Every run must score exactly what the first in-process run scored (per dataset, the ALC and final
score; the evaluator's records too), else MISMATCH and exit 1.

Reported: wall time per path, the ratio arbiter / in process (target ≤ 2), the overhead per
``suggest`` ((arbiter − in process) / suggestions), the same without the runner's per-fold process
starts (each fold's agent is a fresh interpreter importing it), what those starts took, and the
round trip of one step as the runner sees it. ``--quick``: 1 round, no warm-up, a 12-dataset
set. Only 127.0.0.1 is used; every process this script starts (and its redis-server) is stopped by
pid on the way out.

Exit status: 0 checks passed; 1 MISMATCH; 2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import REPO, arbiter_rev, emit, machine_basics, percentile
from bench_procs import (
    BenchSession,
    Processes,
    brpop_clients,
    new_service_id,
    transport_label,
    wait_until_listening,
)

HERE = Path(__file__).resolve()
AGENTS_DIR = REPO / "examples" / "metalc_agent"
PRESET = "metalc-wcci2022"
PATHS = ("inprocess", "arbiter")
TARGET = 2.0  # arbiter's wall time over the in-process phase's
ROUND1_SIZE = {"datasets": 30, "algorithms": 20}
QUICK_SIZE = {"datasets": 12, "algorithms": 6}


# -- the measured processes ----------------------------------------------------------------------------


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
    from arbiter.protocol.messages import FLATLAND_RL

    step_s: list[float] = []
    last_step_at = [0.0]

    class TimedWire(Wire):
        """Times every ENV_STEP round trip as the runner sees it, and when the last one ended."""

        def request(self, type_: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
            if type_ != FLATLAND_RL.ENV_STEP:
                return super().request(type_, payload, *args, **kwargs)
            before = time.perf_counter()
            reply = super().request(type_, payload, *args, **kwargs)
            last_step_at[0] = time.perf_counter()
            step_s.append(last_step_at[0] - before)
            return reply

    began = time.perf_counter()
    wire = TimedWire(args.redis_url, args.service_id, reply_timeout_s=args.reply_timeout)
    runner = metalc.Runner(wire, metalc.Submission.checked(str(AGENTS_DIR), args.agent_module))
    setup = time.perf_counter() - began
    began = time.perf_counter()
    scores = runner.play()
    submit = time.perf_counter() - last_step_at[0]  # the last ENV_CREATE, and ENV_SUBMIT's scoring
    wall = last_step_at[0] - began
    wire.close()
    emit({"path": "arbiter", "setup_s": setup, "wall_s": wall, "submit_s": submit, "score": scores.get("score"),
          "suggests": len(step_s), "step_p50_s": percentile(step_s, 0.5), "step_p99_s": percentile(step_s, 0.99),
          "step_mean_s": statistics.fmean(step_s), "fold_start_s": sum(runner.fold_start_s),
          "folds": len(runner.fold_start_s)})  # fmt: skip
    return 0


WORKERS = {"inprocess": worker_inprocess, "arbiter": worker_arbiter}


# -- the conductor -------------------------------------------------------------------------------------


class MetaLCBench:
    def __init__(self, args: argparse.Namespace, workdir: Path, procs: Processes, redis_url: str):
        import redis

        self.args = args
        self.workdir = workdir
        self.procs = procs
        self.redis_url = redis_url
        self.conn = redis.Redis.from_url(redis_url, socket_timeout=10)

    def run(self, path: str, label: str) -> dict[str, Any]:
        options = ["--tests", self.args.tests, "--agent-module", self.args.agent_module]
        if path == "inprocess":
            worker = self.procs.worker(f"inprocess-{label}", "inprocess", *options)
            self.procs.wait([worker], self.args.timeout)
            return worker.result()
        service_id = new_service_id(label)
        results = self.workdir / "results" / service_id
        serve = [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", PRESET,
                 "--tests", self.args.tests, "--redis-url", self.redis_url, "--service-id", service_id,
                 "--results", str(results), "--quiet"]  # fmt: skip
        baseline = brpop_clients(self.conn)
        server = self.procs.start(f"serve-{label}", serve)
        wait_until_listening(self.conn, [server], baseline)
        connection = ["--redis-url", self.redis_url, "--service-id", service_id]
        timeout = ["--reply-timeout", str(self.args.reply_timeout)]
        worker = self.procs.worker(f"arbiter-{label}", "arbiter", *options, *connection, *timeout)
        self.procs.wait([worker, server], self.args.timeout)
        out = worker.result()
        summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
        lines = (results / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
        out["state"] = summary["state"]
        out["figures"] = figures([json.loads(line) for line in lines])
        timing = summary.get("timing") or {}
        out["server_step_mean_s"] = (timing.get("server_step_s") or {}).get("mean")
        return out


def check_runs(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    reference = runs["inprocess"][0]["figures"]
    problems = []
    for path in PATHS:
        for i, run in enumerate(runs[path], start=1):
            if run["figures"] != reference:
                problems.append(f"{path} round {i}: per-dataset figures differ from the in-process run's")
            if path == "arbiter" and run["state"] != "SUCCESS":
                problems.append(f"arbiter round {i}: evaluation state {run['state']}")
            if run["suggests"] != runs["inprocess"][0]["suggests"]:
                problems.append(f"{path} round {i}: {run['suggests']} suggestions")
    return problems


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    suggests = runs["inprocess"][0]["suggests"]
    pairs = list(zip(runs["arbiter"], runs["inprocess"], strict=True))
    ratio = [a["wall_s"] / b["wall_s"] for a, b in pairs]
    overhead = [(a["wall_s"] - b["wall_s"]) / suggests for a, b in pairs]
    # the same without the folds' process starts (a fresh interpreter importing the agent, per fold)
    overhead_in_folds = [(a["wall_s"] - a["fold_start_s"] - b["wall_s"]) / suggests for a, b in pairs]
    arbiter = runs["arbiter"]
    return {
        "suggests": suggests,
        "datasets": len(runs["inprocess"][0]["figures"]),
        "wall_s": {path: spread([r["wall_s"] for r in runs[path]]) for path in PATHS},
        "ratio_arbiter_over_inprocess": {**spread(ratio), "per_round": ratio},
        "overhead_per_suggest_s": spread(overhead),
        "overhead_per_suggest_without_fold_starts_s": spread(overhead_in_folds),
        "fold_start_s": {**spread([r["fold_start_s"] / r["folds"] for r in arbiter]), "folds": arbiter[0]["folds"]},
        "step_round_trip_s": {
            "p50": statistics.median(r["step_p50_s"] for r in arbiter),
            "p99": statistics.median(r["step_p99_s"] for r in arbiter),
            "mean": statistics.median(r["step_mean_s"] for r in arbiter),
        },
        "server_step_mean_s": statistics.median(r["server_step_mean_s"] or 0.0 for r in arbiter),
        "submit_s": statistics.median(r["submit_s"] for r in arbiter),
    }


def print_table(report: dict[str, Any]) -> None:
    cfg, s = report["config"], report["summary"]
    print()
    print(f"MetaLC benchmark — development phase, {s['datasets']} datasets, {s['suggests']} suggestions, agent "
          f"{cfg['agent_module']}, meta-dataset {cfg['tests_label']}; {cfg['rounds']} round(s) after "
          f"{cfg['warmup_rounds']} warm-up; {report['machine']['cpus']} CPUs, Python {report['machine']['python']}, "
          f"arbiter {report['machine']['arbiter_rev']}; {cfg['transport']}")  # fmt: skip
    for path in PATHS:
        wall = s["wall_s"][path]
        print(f"{path:<10} wall {wall['median'] * 1e3:8.1f} ms  [{wall['min'] * 1e3:.1f}–{wall['max'] * 1e3:.1f}]")
    ratio, overhead, trip = s["ratio_arbiter_over_inprocess"], s["overhead_per_suggest_s"], s["step_round_trip_s"]
    rounds = ", ".join(f"{v:.2f}" for v in ratio["per_round"])
    print(f"ratio arbiter / in process: median {ratio['median']:.2f} [{ratio['min']:.2f}–{ratio['max']:.2f}] "
          f"(per round: {rounds}); target ≤ {TARGET:g}: {'met' if report['target']['met'] else 'NOT met'}")  # fmt: skip
    print(f"overhead per suggest: {overhead['median'] * 1e6:.0f} µs [{overhead['min'] * 1e6:.0f}–"
          f"{overhead['max'] * 1e6:.0f}]; step round trip as the runner sees it: p50 {trip['p50'] * 1e6:.0f} µs, "
          f"p99 {trip['p99'] * 1e6:.0f} µs; the evaluator's own step "
          f"{s['server_step_mean_s'] * 1e6:.1f} µs mean")  # fmt: skip
    starts, in_folds = s["fold_start_s"], s["overhead_per_suggest_without_fold_starts_s"]
    print(f"of which the {starts['folds']} folds' process starts: {starts['median'] * 1e3:.0f} ms each "
          f"[{starts['min'] * 1e3:.0f}–{starts['max'] * 1e3:.0f}]; overhead per suggest without them: "
          f"{in_folds['median'] * 1e6:.0f} µs [{in_folds['min'] * 1e6:.0f}–{in_folds['max'] * 1e6:.0f}]")  # fmt: skip
    print(f"then the last ENV_CREATE and ENV_SUBMIT (the scores, with their bootstrap intervals): "
          f"{s['submit_s'] * 1e3:.1f} ms, not counted above")  # fmt: skip
    checks = report["checks"]
    if checks["match"]:
        print(f"figures: identical in all {checks['runs_checked']} runs (in process, the runner's and the evaluator's)")
    for line in checks["mismatches"]:
        print(f"  MISMATCH {line}")
    print(f"benchmark time: {report['total_s']:.1f} s; raw results: {report.get('json_path') or '(no --json)'}")


def run_benchmark(args: argparse.Namespace) -> int:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    began = time.monotonic()
    if args.quick:
        args.rounds, args.warmup = 1, 0
    with BenchSession("arbiter-bench-metalc-", script=HERE, keep=args.keep) as session:
        workdir, procs, redis_server = session.workdir, session.procs, session.redis
        tests_label = args.tests
        if args.tests is not None:
            args.tests = str(Path(args.tests).resolve())  # the workers run in the work folder
        if args.tests is None:
            size = QUICK_SIZE if args.quick else ROUND1_SIZE
            args.tests = str(workdir / "meta-dataset")
            write_meta_dataset(args.tests, GeneratorSettings(seed=args.seed, **size))
            tests_label = f"synthetic ({size['datasets']} datasets, {size['algorithms']} algorithms, seed {args.seed})"
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
        redis_server.start()
        bench = MetaLCBench(args, workdir, procs, session.redis_url(args.tcp))
        for round_ in range(1 - args.warmup, args.rounds + 1):
            label = f"r{round_}" if round_ > 0 else f"warmup{round_ + args.warmup}"
            for path in PATHS if round_ % 2 else tuple(reversed(PATHS)):
                result = bench.run(path, label)
                if round_ > 0:
                    runs[path].append(result)
                counted = "" if round_ > 0 else " (not counted)"
                name = f"round {round_}" if round_ > 0 else "warm-up"
                print(f"bench: {name} {path:<9} {result['wall_s'] * 1e3:8.1f} ms{counted}", flush=True)
    if session.failed():
        return 2
    mismatches = check_runs(runs)
    summary = summarise(runs)
    report = {
        "config": {
            "transport": transport_label(args.tcp),
            "preset": PRESET,
            "phase": "dev",
            "agent_module": args.agent_module,
            "tests_label": tests_label,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "quick": args.quick,
        },  # fmt: skip
        "machine": {**machine_basics(), "arbiter_rev": arbiter_rev()},
        "summary": summary,
        "target": {
            "ratio_arbiter_over_inprocess": TARGET,
            "met": summary["ratio_arbiter_over_inprocess"]["median"] <= TARGET,
        },  # fmt: skip
        "checks": {"match": not mismatches, "runs_checked": sum(map(len, runs.values())), "mismatches": mismatches},
        "raw_runs": {name: [{k: v for k, v in r.items() if k != "figures"} for r in runs[name]] for name in PATHS},
        "total_s": time.monotonic() - began,
        "json_path": args.json,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print_table(report)
    return 1 if mismatches else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tests", metavar="DIR", help="meta-dataset folder (default: a synthetic one of round 1's size)"
    )
    parser.add_argument("--agent-module", default="agent", help="agent of examples/metalc_agent (default agent)")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic meta-dataset's seed (default 0)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (inprocess, arbiter) (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1; --quick: 0)")
    parser.add_argument("--quick", action="store_true", help="1 round, no warm-up, a 12-dataset synthetic set")
    parser.add_argument("--tcp", action="store_true", help="loopback TCP, not the unix socket arbiter run uses")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    parser.add_argument("--reply-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.worker:
        return WORKERS[args.worker](args)
    if args.rounds < 1 or args.warmup < 0:
        print("bench: --rounds must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
