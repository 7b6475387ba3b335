#!/usr/bin/env python3
"""Benchmark MetaLC's development phase through arbiter against the same phase in process.

    python scripts/bench_metalc.py [--tests DIR] [--agent-module NAME] [--rounds R] [--warmup W]
                                   [--quick] [--profile DIR] [--json PATH] [--keep]

One agent of examples/metalc_agent (default ``agent``, which ranks the algorithms by their mean
final test score and takes turns among the best) plays the development phase of one
meta-dataset two ways:

  inprocess  arbiter's MetaLC env and the agent in one process (``local.play_phase``), as the
             challenge's ingestion program ran them: folds, meta-training data, episodes;
  arbiter    ``arbiter serve --competition metalc-wcci2022`` and the runner
             ``arbiter.client.metalc`` in another process, over a redis-server this script starts
             (its unix socket, as ``arbiter run``; ``--tcp``: a free loopback port).

The meta-dataset is ``--tests DIR`` (such as the round-1 ``input_data/``), else a synthetic one of
round 1's size (``ROUND1_SIZE``) written by arbiter's generator. Each path runs in a
subprocess of its own (``--worker MODE``) that loads what it needs first and then measures: the
in-process path from the first fold's agent to the last dataset's last step; the arbiter path
from its first ENV_CREATE to its ENV_SUBMIT (the handshake is set-up, as loading the
meta-dataset is; the folds' processes, which import the agent, are counted; the final ENV_SUBMIT,
which computes the scores the in-process path never does, is reported apart).
The paths alternate within each round; ratios are per round.
Every run must score exactly what the first in-process run scored (per dataset, the ALC and final
score; the evaluator's records too), else MISMATCH and exit 1.

Reported: wall time per path, the ratio arbiter / in process (its target: ``TARGET``), the overhead per
``suggest`` ((arbiter − in process) / suggestions), the same without the runner's per-fold process
starts (each fold's agent is a fresh interpreter importing it), what those starts took, and the
round trip of one step as the fold's process sees it. Then what arbiter adds apart from the folds'
processes, from the timings of their requests the runner reports (``Runner.round_trips``), each
judged on its least favourable round: per suggest inside a dataset (``SUGGEST_TARGET``: the step's
round trip and the agent's turn in the fold's process, less the in-process cost of a suggest and
its step) and per dataset (``DATASET_TARGET``, a mean over the datasets opened inside a fold: what
the step that ended the one before costs beyond a plain step, the finished item's record made
durable and the next dataset opened and brought along; for a dataset that followed a timeout, the
whole round trip of the ENV_CREATE the runner sent for it), with what the work folder's disk takes to make an
appended record durable, probed after each arbiter run (sync_cost.py): each dataset's figure
includes it. ``--quick``: a small, fast run for tests (``QUICK``);
``--profile DIR``: then one more arbiter run with the evaluator and the runner under py-spy.
Only 127.0.0.1 is used; every process this script starts (and its redis-server) is stopped by pid
on the way out.

Exit status: 0 checks passed; 1 MISMATCH; 2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_profile
import sync_cost
from bench_metalc_workers import WORKERS, figures
from figures import Threshold
from harness import (
    BenchSession,
    Runs,
    Target,
    add_run_options,
    alternate_rounds,
    checks_report,
    machine_info,
    machine_line,
    new_service_id,
    per_round_ratios,
    print_checks_and_time,
    read_results,
    run_main,
    serve_argv,
    spread,
    steal_share,
    write_json,
)

PRESET = "metalc-wcci2022"
PATHS = ("inprocess", "arbiter")
TARGET = Target("ratio_arbiter_over_inprocess", "arbiter", "the phase in process", "in wall time", 2.0, at_least=False)
# What arbiter adds, apart from the folds' processes: to each suggest inside a dataset (the step's
# round trip and the agent's turn in the fold's process, less what the suggest and its step cost in
# process), and to each dataset (what its last step costs beyond a plain one: the finished item's
# record, durable before the next dataset opens, and that dataset brought along; and any ENV_CREATE).
SUGGEST_TARGET = Threshold(name="suggest_overhead_us", what="arbiter's overhead per suggest", unit="µs",
                           bound=150, at_least=False)  # fmt: skip
DATASET_TARGET = Threshold(name="dataset_overhead_us", what="arbiter's overhead per dataset opened and closed",
                           unit="µs", bound=1000, at_least=False)  # fmt: skip
ROUND1_SIZE = {"datasets": 30, "algorithms": 20}
QUICK = {"rounds": 1, "warmup": 0, "datasets": 12, "algorithms": 6}
SYNC_PROBE_APPENDS = {False: 100, True: 30}  # after each arbiter run: what its disk takes to sync a record


# -- the conductor -------------------------------------------------------------------------------------


class MetaLCBench(Runs):
    def run(self, path: str, label: str) -> dict[str, Any]:
        options = ["--tests", self.args.tests, "--agent-module", self.args.agent_module]
        procs = self.procs
        if path == "inprocess":
            worker = procs.worker(f"inprocess-{label}", "inprocess", *options)
            procs.wait([worker], self.args.timeout)
            return worker.result()
        out = self.run_arbiter(label)
        # the disk the evaluator has just made every dataset's record durable on, as it is now
        out["disk_sync"] = sync_cost.measure(self.session.workdir, appends=SYNC_PROBE_APPENDS[self.args.quick])
        return out

    def run_arbiter(self, label: str, profile_dir: Path | None = None) -> dict[str, Any]:
        """One evaluation; with ``profile_dir``, the evaluator and the runner run under py-spy
        (the folds' processes are the agent's and run as they are)."""
        options = ["--tests", self.args.tests, "--agent-module", self.args.agent_module]
        service_id = new_service_id(label)
        results = self.results_dir(service_id)
        serve = serve_argv(self.redis_url, service_id, results, "--competition", PRESET, "--tests", self.args.tests)
        agent = self.procs.worker_argv("arbiter", *options, "--redis-url", self.redis_url, "--service-id",
                                       service_id, "--reply-timeout", str(self.args.reply_timeout))  # fmt: skip
        if profile_dir is not None:
            serve = bench_profile.wrap(serve, profile_dir / "server.txt")
            agent = bench_profile.wrap(agent, profile_dir / "runner.txt")
        out = self.session.evaluate(label, serve, agent, self.args.timeout)
        written = read_results(results)
        out["state"] = written["state"]
        out["figures"] = figures(written["records"])
        out["server_step_mean_s"] = written["server_step_mean_s"]
        # the evaluator's own timing of each dataset's record reaching the disk (part of its last step)
        out["record_durable_mean_s"] = written["record_durable_mean_s"] or 0.0
        return out

    def profile(self, profile_dir: Path) -> dict[str, Any]:
        profile_dir.mkdir(parents=True, exist_ok=True)
        out = self.run_arbiter("profile", profile_dir)
        return {
            "dir": str(profile_dir),
            "wall_s_under_py_spy": out["wall_s"],
            "runner": bench_profile.rank(profile_dir / "runner.txt"),
            "server": bench_profile.rank(profile_dir / "server.txt"),
        }


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


# the means each arbiter run reports of its requests' round trips (see worker_arbiter)
PARTS = ("steady_step_mean_s", "first_step_mean_s", "turn_mean_s", "create_mean_s", "closing_step_mean_s",
         "fold_create_mean_s", "record_durable_mean_s")  # fmt: skip


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    suggests = runs["inprocess"][0]["suggests"]
    pairs = list(zip(runs["arbiter"], runs["inprocess"], strict=True))
    overhead = [(a["wall_s"] - b["wall_s"]) / suggests for a, b in pairs]
    # the same without the folds' process starts (a fresh interpreter importing the agent, per fold)
    overhead_in_folds = [(a["wall_s"] - a["fold_start_s"] - b["wall_s"]) / suggests for a, b in pairs]
    # per round: what a suggest inside a dataset and what a dataset's opening and closing add
    per_suggest = [a["steady_step_mean_s"] + a["turn_mean_s"] - b["wall_s"] / suggests for a, b in pairs]
    per_dataset = [dataset_overhead_s(a) for a, _ in pairs]
    # the same less what the evaluator waited for the disk to make each dataset's record durable (a
    # mean over every dataset's record, a fold's last included, whose step brings the next fold's data)
    per_dataset_past_disk = [d - a["record_durable_mean_s"] for d, (a, _) in zip(per_dataset, pairs, strict=True)]
    # what a plain step costs when it is not a dataset's first (which waits for the last one's notices)
    others = [a["other_step_mean_s"] for a, _ in pairs]
    arbiter = runs["arbiter"]
    return {
        "suggests": suggests,
        "suggest_overhead_s": {**spread(per_suggest), "per_round": per_suggest},
        "dataset_overhead_s": {**spread(per_dataset), "per_round": per_dataset},
        "dataset_overhead_past_disk_s": {**spread(per_dataset_past_disk), "per_round": per_dataset_past_disk},
        "other_step_mean_s": {**spread(others), "per_round": others},
        "first_steps": max(r["first_steps"] for r in arbiter),
        "parts_s": {name: statistics.median(r[name] for r in arbiter) for name in PARTS},
        "creates_within_folds": max(r["creates"] for r in arbiter),
        "datasets": len(runs["inprocess"][0]["figures"]),
        "wall_s": {path: spread([r["wall_s"] for r in runs[path]]) for path in PATHS},
        "ratio_arbiter_over_inprocess": per_round_ratios(runs["arbiter"], runs["inprocess"], "wall_s"),
        "overhead_per_suggest_s": spread(overhead),
        "overhead_per_suggest_without_fold_starts_s": spread(overhead_in_folds),
        "fold_start_s": {**spread([r["fold_start_s"] / r["folds"] for r in arbiter]), "folds": arbiter[0]["folds"]},
        "step_round_trip_s": {
            "p50": statistics.median(r["step_p50_s"] for r in arbiter),
            "p99": statistics.median(r["step_p99_s"] for r in arbiter),
            "mean": statistics.median(r["step_mean_s"] for r in arbiter),
        },
        "server_step_mean_s": statistics.median(r["server_step_mean_s"] or 0.0 for r in arbiter),
        "disk_sync_us": [r["disk_sync"] for r in arbiter],
        "submit_s": statistics.median(r["submit_s"] for r in arbiter),
    }


def dataset_overhead_s(run: dict[str, Any]) -> float:
    """What opening and closing a dataset adds inside a fold, a mean over the datasets opened there.
    Most come with the step that ended the one before: that step's round trip less a plain step's.
    One that follows a dataset that timed out is asked for with an ENV_CREATE, the whole of whose
    round trip is overhead (the timed-out dataset's record was written at its deadline, off the
    agent's path)."""
    closings, creates = run["closing_steps"], run["creates"]
    if closings + creates == 0:
        return 0.0
    closing_extra_s = run["closing_step_mean_s"] - run["steady_step_mean_s"]
    return (closings * closing_extra_s + creates * run["create_mean_s"]) / (closings + creates)


def creates_phrase(mean_s: float, count: int) -> str:
    """The ENV_CREATEs the runner sent inside a fold (one follows a dataset that timed out), which
    count in the mean per dataset with their whole round trip; or that there were none: every
    dataset came with the step that ended the last."""
    if count == 0:
        return ", with no ENV_CREATE inside a fold (each dataset came with the step that ended the one before)"
    if count == 1:
        return (
            f", and for the one dataset that followed a timeout the ENV_CREATE the runner sent, {mean_s * 1e6:.0f} µs"
        )
    return (
        f", and for the {count} datasets that followed a timeout the ENV_CREATE the runner sent for each, "
        f"{mean_s * 1e6:.0f} µs (mean)"
    )


def print_table(report: dict[str, Any]) -> None:
    cfg, s = report["config"], report["summary"]
    print()
    print(f"MetaLC benchmark — development phase, {s['datasets']} datasets, {s['suggests']} suggestions, agent "
          f"{cfg['agent_module']}, meta-dataset {cfg['tests_label']}; {cfg['rounds']} round(s) after "
          f"{cfg['warmup_rounds']} warm-up; {machine_line(report['machine'])}; {cfg['transport']}")  # fmt: skip
    for path in PATHS:
        wall = s["wall_s"][path]
        print(f"{path:<10} wall {wall['median'] * 1e3:8.1f} ms  [{wall['min'] * 1e3:.1f}–{wall['max'] * 1e3:.1f}]")
    ratio, overhead, trip = s["ratio_arbiter_over_inprocess"], s["overhead_per_suggest_s"], s["step_round_trip_s"]
    rounds = ", ".join(f"{v:.2f}" for v in ratio["per_round"])
    print(f"ratio arbiter / in process: median {ratio['median']:.2f} [{ratio['min']:.2f}–{ratio['max']:.2f}] "
          f"(per round: {rounds})")  # fmt: skip
    print(TARGET.line(ratio))
    print(f"overhead per suggest: {overhead['median'] * 1e6:.0f} µs [{overhead['min'] * 1e6:.0f}–"
          f"{overhead['max'] * 1e6:.0f}]; step round trip as a fold's process sees it: "
          f"p50 {trip['p50'] * 1e6:.0f} µs, "
          f"p99 {trip['p99'] * 1e6:.0f} µs; the evaluator's own step "
          f"{s['server_step_mean_s'] * 1e6:.1f} µs mean")  # fmt: skip
    starts, in_folds = s["fold_start_s"], s["overhead_per_suggest_without_fold_starts_s"]
    print(f"of which the {starts['folds']} folds' process starts: {starts['median'] * 1e3:.0f} ms each "
          f"[{starts['min'] * 1e3:.0f}–{starts['max'] * 1e3:.0f}]; overhead per suggest without them: "
          f"{in_folds['median'] * 1e6:.0f} µs [{in_folds['min'] * 1e6:.0f}–{in_folds['max'] * 1e6:.0f}]")  # fmt: skip
    parts, suggest, dataset = s["parts_s"], s["suggest_overhead_s"], s["dataset_overhead_s"]
    print(f"inside a dataset, per suggest: the step's round trip {parts['steady_step_mean_s'] * 1e6:.0f} µs and the "
          f"agent's turn in the fold's process {parts['turn_mean_s'] * 1e6:.0f} µs (means), less the suggest and its "
          f"step in process: {suggest['median'] * 1e6:.0f} µs "
          f"[{suggest['min'] * 1e6:.0f}–{suggest['max'] * 1e6:.0f}]")  # fmt: skip
    others = s["other_step_mean_s"]
    print(f"of those steps, the {s['first_steps']} that open a dataset the step before brought (the evaluator gives "
          f"the last dataset's notices first: its event, results.csv's rows) "
          f"{parts['first_step_mean_s'] * 1e6:.0f} µs, the others {others['median'] * 1e6:.0f} µs (means)")  # fmt: skip
    print(f"per dataset: its last step {parts['closing_step_mean_s'] * 1e6:.0f} µs (the record written, the next "
          f"dataset opened and brought along) against a plain step's {parts['steady_step_mean_s'] * 1e6:.0f} µs"
          f"{creates_phrase(parts['create_mean_s'], s['creates_within_folds'])}: {dataset['median'] * 1e6:.0f} µs "
          f"[{dataset['min'] * 1e6:.0f}–{dataset['max'] * 1e6:.0f}]; a fold's first dataset arriving (its "
          f"meta-training data) {parts['fold_create_mean_s'] * 1e3:.1f} ms")  # fmt: skip
    past_disk = [v * 1e6 for v in s["dataset_overhead_past_disk_s"]["per_round"]]
    print(f"of which the evaluator waiting for the disk to make the dataset's record durable (summary.json's "
          f"record_durable_s) {parts['record_durable_mean_s'] * 1e6:.0f} µs mean; per dataset without that wait "
          f"{', '.join(f'{v:.0f}' for v in past_disk)} µs by round")  # fmt: skip
    print(sync_cost.line(s["disk_sync_us"]))
    for threshold, figure in ((SUGGEST_TARGET, suggest), (DATASET_TARGET, dataset)):
        values = [v * 1e6 for v in figure["per_round"]]
        print(threshold.line(values, [f"round {i}" for i in range(1, len(values) + 1)]))
    print(f"then ENV_SUBMIT (the scores, with their bootstrap intervals): "
          f"{s['submit_s'] * 1e3:.1f} ms, not counted above")  # fmt: skip
    print_checks_and_time(report, "figures", "in process, the runner's and the evaluator's")


def run_benchmark(args: argparse.Namespace) -> int:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    began = time.monotonic()
    machine = machine_info()
    if args.quick:
        args.rounds, args.warmup = QUICK["rounds"], QUICK["warmup"]
    with BenchSession("arbiter-bench-metalc-", script=Path(__file__).resolve(), keep=args.keep) as session:
        tests_label = args.tests
        if args.tests is not None:
            args.tests = str(Path(args.tests).resolve())  # the workers run in the work folder
        else:
            size = {"datasets": QUICK["datasets"], "algorithms": QUICK["algorithms"]} if args.quick else ROUND1_SIZE
            args.tests = str(session.workdir / "meta-dataset")
            write_meta_dataset(args.tests, GeneratorSettings(seed=args.seed, **size))
            tests_label = f"synthetic ({size['datasets']} datasets, {size['algorithms']} algorithms, seed {args.seed})"
        bench = MetaLCBench(args, session, session.start_redis(args.tcp))
        runs = alternate_rounds(args.rounds, args.warmup, (PATHS, PATHS[::-1]), bench.run,
                                lambda r: f"{r['wall_s'] * 1e3:8.1f} ms")  # fmt: skip
        profile = None
        if args.profile:
            print(f"bench: profiling one more arbiter run under py-spy into {args.profile}", flush=True)
            profile = bench.profile(Path(args.profile))
    if session.failed():
        return 2
    mismatches = check_runs(runs)
    summary = summarise(runs)
    report = {
        "config": {
            "transport": session.transport,
            "preset": PRESET,
            "phase": "dev",
            "agent_module": args.agent_module,
            "tests_label": tests_label,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "quick": args.quick,
        },  # fmt: skip
        "machine": machine,
        "summary": summary,
        "target": TARGET.report(summary[TARGET.ratio]),
        "thresholds": [
            SUGGEST_TARGET.report([v * 1e6 for v in summary["suggest_overhead_s"]["per_round"]]),
            DATASET_TARGET.report([v * 1e6 for v in summary["dataset_overhead_s"]["per_round"]]),
        ],
        "checks": checks_report(mismatches, runs),
        "raw_runs": {name: [{k: v for k, v in r.items() if k != "figures"} for r in runs[name]] for name in PATHS},
        "profile": profile,
        "total_s": time.monotonic() - began,
        "steal_share": steal_share(machine.get("cpu_ticks_start")),
        "json_path": args.json,
    }
    write_json(args.json, report)
    print_table(report)
    if profile:
        print(f"profile ({profile['wall_s_under_py_spy'] * 1e3:.0f} ms under py-spy; stacks in {profile['dir']}):")
        bench_profile.print_ranking("runner (arbiter.client.metalc)", profile["runner"])
        bench_profile.print_ranking("evaluator (arbiter serve)", profile["server"])
    return 1 if mismatches else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser, workers=WORKERS, rounds=5)
    parser.add_argument("--tests", metavar="DIR", help="meta-dataset folder (default: a synthetic one, round 1 sized)")
    parser.add_argument("--agent-module", default="agent", help="agent of examples/metalc_agent (default agent)")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic meta-dataset's seed (default 0)")
    parser.add_argument("--profile", metavar="DIR", help="then one arbiter run under py-spy: stacks and rankings")
    quick = ", ".join(f"{key} {value}" for key, value in QUICK.items())
    parser.add_argument("--quick", action="store_true", help=f"a small, fast run for tests: {quick}")
    return parser


def main() -> int:
    return run_main(build_parser().parse_args(), WORKERS, run_benchmark)


if __name__ == "__main__":
    sys.exit(main())
