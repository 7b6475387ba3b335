#!/usr/bin/env python3
"""Benchmark arbiter's RemoteEnv against stepping the same Gymnasium env in process and through
Gymnasium's own AsyncVectorEnv with one env.

    python scripts/bench_remote_env.py [--rounds 5] [--warmup 1] [--steps 20000] [--quick] [--json PATH]

One deterministic agent (push the cart the way the pole turns) plays CartPole-v1 for ``--steps``
env steps three ways, with the same seeded episodes:

  inprocess  ``gymnasium.make`` in the agent's process: the env's own cost;
  async1     ``gymnasium.vector.AsyncVectorEnv`` with one env: the env in a subprocess over pipes
             and shared memory, the closest peer with no network hop;
  remote     ``arbiter.client.RemoteEnv`` against ``arbiter serve`` (the two-phase format's
             CartPole preset, phase 2, one training run of ``--steps`` steps) over a
             redis-server this script starts: through its unix socket, as ``arbiter run``
             connects an agent, or with ``--tcp`` on a free loopback port, as containers that
             share a Redis meet.

Every path runs in a subprocess of its own (``--worker MODE``) that builds its env first and then
measures: wall time from the first reset to the last step, and every step and reset call. The
paths alternate within each round (inprocess first, then async1 and remote, their order swapped
every round) so that noise shows as spread; the ratios are taken per round. All runs must play
exactly the in-process run's episodes (seeds, steps, returns; the evaluator's records too), else
MISMATCH and exit 1.

``--quick`` is a small, fast version for tests: 1 round, no warm-up, 1000 steps. Only 127.0.0.1
is used; every process this script starts (and its redis-server) is stopped by pid on the way out.

Exit status: 0 all checks passed; 1 MISMATCH; 2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_profile
from bench_common import arbiter_rev, machine_basics, percentile
from bench_procs import (
    BenchSession,
    Processes,
    brpop_clients,
    new_service_id,
    run_with_sigterm_as_interrupt,
    transport_label,
    wait_until_listening,
)
from bench_remote_workers import WORKERS

HERE = Path(__file__).resolve()
ENV_ID = "CartPole-v1"
PRESET = "two-phase-cartpole"
SEED = 1001  # the preset's competition seed
PATHS = ("inprocess", "async1", "remote")
# goal 475 (the preset's) with a window of 1 fits in any run of at least 950 steps
MIN_STEPS = 950
TARGET = 1.0  # RemoteEnv's steps/s against AsyncVectorEnv(1)'s


def server_argv(redis_url: str, service_id: str, results: Path, steps: int) -> list[str]:
    """``arbiter serve`` on the CartPole preset: phase 2 only, one run of ``steps`` env steps and
    one evaluation episode after it."""
    overrides = ["phase=2", "num_episodes=1", "phase2.num_runs=1", f"phase2.max_steps={steps}",
                 "phase2.stability_window=1", f"seed={SEED}"]  # fmt: skip
    argv = [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", PRESET]
    for item in overrides:
        argv += ["--set", item]
    return argv + ["--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet"]


def read_server_results(results: Path) -> dict[str, Any]:
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (results / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]
    timing = summary.get("timing") or {}
    return {
        "state": summary.get("state"),
        "server_step_mean_s": (timing.get("server_step_s") or {}).get("mean"),
        "server_think_mean_s": (timing.get("step_think_s") or {}).get("mean"),
        "server_episodes": [
            {"seed": r["seed"], "steps": r["steps"], "return": r["return"]} for r in records if r["stage"] == "train"
        ],
    }


class RemoteEnvBench:
    def __init__(self, args: argparse.Namespace, workdir: Path, procs: Processes, redis_url: str):
        import redis

        self.args = args
        self.workdir = workdir
        self.procs = procs
        self.redis_url = redis_url
        self.conn = redis.Redis.from_url(redis_url, socket_timeout=10)

    def worker_options(self) -> list[str]:
        return ["--steps", str(self.args.steps), "--seed", str(SEED), "--env-id", ENV_ID]

    def run_local(self, path: str, label: str) -> dict[str, Any]:
        agent = self.procs.worker(f"{path}-{label}", path, *self.worker_options())
        self.procs.wait([agent], self.args.timeout)
        return agent.result()

    def run_remote(self, label: str, profile_dir: Path | None = None) -> dict[str, Any]:
        """One evaluation; with ``profile_dir``, the evaluator and the agent run under py-spy."""
        service_id = new_service_id(label)
        results = self.workdir / "results" / service_id
        serve = server_argv(self.redis_url, service_id, results, self.args.steps)
        agent_argv = [sys.executable, str(HERE), "--worker", "remote", *self.worker_options(),
                      "--redis-url", self.redis_url, "--service-id", service_id,
                      "--reply-timeout", str(self.args.reply_timeout)]  # fmt: skip
        if profile_dir is not None:
            serve = bench_profile.wrap(serve, profile_dir / "server.txt")
            agent_argv = bench_profile.wrap(agent_argv, profile_dir / "agent.txt")
        baseline = brpop_clients(self.conn)
        server = self.procs.start(f"serve-{label}", serve)
        wait_until_listening(self.conn, [server], baseline)
        agent = self.procs.start(f"remote-{label}", agent_argv)
        self.procs.wait([agent, server], self.args.timeout)
        out = agent.result()
        out.update(read_server_results(results))
        return out

    def profile(self, profile_dir: Path) -> dict[str, Any]:
        profile_dir.mkdir(parents=True, exist_ok=True)
        out = self.run_remote("profile", profile_dir)
        return {
            "dir": str(profile_dir),
            "steps_per_s_under_py_spy": out["steps"] / out["wall_s"],
            "agent": bench_profile.rank(profile_dir / "agent.txt"),
            "server": bench_profile.rank(profile_dir / "server.txt"),
        }

    def run(self, path: str, label: str) -> dict[str, Any]:
        return self.run_remote(label) if path == "remote" else self.run_local(path, label)


# ----------------------------------------------------------------------------------------
# Checks and summaries
# ----------------------------------------------------------------------------------------


def check_runs(runs: dict[str, list[dict[str, Any]]], steps: int) -> list[str]:
    """Every run against the first in-process run: the same episodes, and the evaluator's own
    records of the remote runs; the evaluator ended each remote run exactly at ``steps``."""
    reference = runs["inprocess"][0]["episodes"]
    problems = []
    for path in PATHS:
        for i, run in enumerate(runs[path], start=1):
            seen = {"client": run["episodes"]}
            if "server_episodes" in run:
                seen["server"] = run["server_episodes"]
            for side, episodes in seen.items():
                if episodes != reference:
                    problems.append(f"{path} round {i} ({side}): episodes differ from the in-process run's")
            if run["steps"] != steps:
                problems.append(f"{path} round {i}: {run['steps']} steps, expected {steps}")
            if path == "remote":
                if run["state"] != "SUCCESS":
                    problems.append(f"remote round {i}: evaluation state {run['state']}")
                if run["stage_over_at"] != [steps] or not run["stop_iteration_after_run"]:
                    problems.append(f"remote round {i}: run ended after {run['stage_over_at']}, expected [{steps}]")
    return problems


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path over its rounds: the spread of steps/s, per-call latencies as medians over rounds."""

    def median_of(get: Any) -> float | None:
        values = [v for v in (get(run) for run in runs) if v is not None]
        return statistics.median(values) if values else None

    return {
        "steps_per_s": spread([run["steps"] / run["wall_s"] for run in runs]),
        "wall_s": spread([run["wall_s"] for run in runs]),
        "step_p50_s": median_of(lambda r: percentile(r["step_s"], 0.50)),
        "step_p99_s": median_of(lambda r: percentile(r["step_s"], 0.99)),
        "step_mean_s": median_of(lambda r: statistics.fmean(r["step_s"])),
        "step_max_s": median_of(lambda r: max(r["step_s"])),
        "reset_p50_s": median_of(lambda r: percentile(r["reset_s"], 0.50)),
        "setup_s": median_of(lambda r: r["setup_s"]),
        "server_step_mean_s": median_of(lambda r: r.get("server_step_mean_s")),
        "server_think_mean_s": median_of(lambda r: r.get("server_think_mean_s")),
    }


def ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Steps/s ratios per round (the round's paths ran back to back: slow drift cancels)."""
    pairs = {"remote_over_async1": ("remote", "async1"), "remote_over_inprocess": ("remote", "inprocess"),
             "async1_over_inprocess": ("async1", "inprocess")}  # fmt: skip
    rate = {path: [run["steps"] / run["wall_s"] for run in runs[path]] for path in PATHS}
    per_round = {name: [a / b for a, b in zip(rate[top], rate[bot], strict=True)] for name, (top, bot) in pairs.items()}
    return {name: {**spread(values), "per_round": values} for name, values in per_round.items()}


def us(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e6:.1f}"


def print_table(report: dict[str, Any]) -> None:
    cfg, mach, paths = report["config"], report["machine"], report["paths"]
    episodes = report["reference"]
    print()
    print(
        f"RemoteEnv benchmark — {cfg['env_id']}, {cfg['steps']} steps per path and round ({len(episodes)} episodes, "
        f"{min(e['steps'] for e in episodes)}–{max(e['steps'] for e in episodes)} steps); {cfg['rounds']} round(s) "
        f"after {cfg['warmup_rounds']} warm-up; {mach['cpus']} CPUs, Python {mach['python']}, gymnasium "
        f"{mach['gymnasium']}, arbiter {mach['arbiter_rev']}; load average at start {mach['loadavg_start']}; "
        f"{cfg['transport']}"
    )
    header = (
        f"{'path':<10} {'steps/s: median [min–max]':<28} {'step µs p50':>11} {'p99':>8} {'mean':>8} "
        f"{'reset µs p50':>12} {'setup ms':>9}"
    )
    print(header)
    print("-" * len(header))
    for name in PATHS:
        p = paths[name]
        rate = p["steps_per_s"]
        print(
            f"{name:<10} {rate['median']:>8.0f} [{rate['min']:.0f}–{rate['max']:.0f}]{'':<8} "
            f"{us(p['step_p50_s']):>11} {us(p['step_p99_s']):>8} {us(p['step_mean_s']):>8} "
            f"{us(p['reset_p50_s']):>12} {p['setup_s'] * 1e3:>9.1f}"
        )
    print("(step and reset µs: each call as the agent sees it, median over rounds; setup: env built or handshake)")
    r = report["ratios"]
    for name, label in (("remote_over_async1", "remote/async1"), ("remote_over_inprocess", "remote/inprocess"),
                        ("async1_over_inprocess", "async1/inprocess")):  # fmt: skip
        values = ", ".join(f"{v:.3f}" for v in r[name]["per_round"])
        print(
            f"steps/s {label}: median {r[name]['median']:.3f} [{r[name]['min']:.3f}–{r[name]['max']:.3f}] "
            f"(per round: {values})"
        )
    met = r["remote_over_async1"]["median"] >= TARGET
    print(f"target RemoteEnv ≥ {TARGET:.1f}× AsyncVectorEnv(1) in steps/s: {'met' if met else 'NOT met'}")
    remote = paths["remote"]
    if remote["server_step_mean_s"] is not None:
        print(
            f"evaluator (summary.json): step {us(remote['server_step_mean_s'])} µs mean; the agent's time between "
            f"steps as the evaluator sees it (step_think_s) {us(remote['server_think_mean_s'])} µs mean"
        )
    checks = report["checks"]
    if checks["match"]:
        print(f"trajectories: identical in all {checks['runs_checked']} runs (client side, and the evaluator's)")
    for line in checks["mismatches"]:
        print(f"  MISMATCH {line}")
    print(f"benchmark time: {report['total_s']:.1f} s; raw results: {report.get('json_path') or '(no --json)'}")


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    began = time.monotonic()
    if args.quick:
        args.rounds, args.warmup, args.steps = 1, 0, 1000
    machine = {**machine_basics(), "gymnasium": version("gymnasium"), "arbiter_rev": arbiter_rev()}
    with BenchSession("arbiter-bench-remote-", script=HERE, keep=args.keep) as session:
        workdir, procs, redis_server = session.workdir, session.procs, session.redis
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
        profile = None
        redis_server.start()
        bench = RemoteEnvBench(args, workdir, procs, session.redis_url(args.tcp))
        for round_ in range(1 - args.warmup, args.rounds + 1):
            label = f"r{round_}" if round_ > 0 else f"warmup{round_ + args.warmup}"
            order = PATHS if round_ % 2 else ("inprocess", "remote", "async1")
            for path in order:
                result = bench.run(path, label)
                if round_ > 0:
                    runs[path].append(result)
                print(
                    f"bench: {'round ' + str(round_) if round_ > 0 else 'warm-up'} {path:<9} "
                    f"{result['steps'] / result['wall_s']:>8.0f} steps/s{'' if round_ > 0 else ' (not counted)'}",
                    flush=True,
                )
        if args.profile:
            print(f"bench: profiling one more remote run under py-spy into {args.profile}", flush=True)
            profile = bench.profile(Path(args.profile))
    if session.failed():
        return 2

    mismatches = check_runs(runs, args.steps)
    report = {
        "config": {
            "transport": transport_label(args.tcp),
            "env_id": ENV_ID,
            "preset": PRESET,
            "seed": SEED,
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "quick": args.quick,
            "agent": "int(observation[3] > 0)",
        },
        "machine": machine,
        "reference": runs["inprocess"][0]["episodes"],
        "paths": {name: summarise(runs[name]) for name in PATHS},
        "ratios": ratios(runs),
        "checks": {"match": not mismatches, "runs_checked": sum(map(len, runs.values())), "mismatches": mismatches},
        "raw_runs": {
            name: [{k: v for k, v in run.items() if k not in ("step_s", "reset_s")} for run in runs[name]]
            for name in PATHS
        },
        "profile": profile,
        "total_s": time.monotonic() - began,
        "json_path": args.json,
    }
    report["target"] = {"remote_over_async1": TARGET, "met": report["ratios"]["remote_over_async1"]["median"] >= TARGET}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print_table(report)
    if profile:
        print()
        print(f"profile ({profile['steps_per_s_under_py_spy']:.0f} steps/s under py-spy; stacks in {profile['dir']}):")
        bench_profile.print_ranking("agent (RemoteEnv)", profile["agent"])
        bench_profile.print_ranking("evaluator (arbiter serve)", profile["server"])
    return 1 if mismatches else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (inprocess, async1, remote) (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1; --quick: 0)")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per path and round (default 20000)")
    parser.add_argument("--quick", action="store_true", help="1 round, no warm-up, 1000 steps")
    parser.add_argument("--tcp", action="store_true", help="loopback TCP, not the unix socket arbiter run uses")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    parser.add_argument("--profile", metavar="DIR", help="then one remote run under py-spy: stacks and rankings")
    parser.add_argument("--reply-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    # Worker mode (internal): one measured process of a path.
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--env-id", default=ENV_ID, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return WORKERS[args.worker](args)
    if args.rounds < 1 or args.warmup < 0:
        print("bench: --rounds must be at least 1 and --warmup at least 0", file=sys.stderr)
        return 2
    if args.profile and bench_profile.py_spy() is None:
        print("bench: --profile needs py-spy (pip install py-spy)", file=sys.stderr)
        return 2
    if not args.quick and args.steps < MIN_STEPS:
        print(f"bench: --steps must be at least {MIN_STEPS} (the goal must stay reachable)", file=sys.stderr)
        return 2

    return run_with_sigterm_as_interrupt(run_benchmark, args)


if __name__ == "__main__":
    sys.exit(main())
