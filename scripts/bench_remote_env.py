#!/usr/bin/env python3
"""Benchmark arbiter's RemoteEnv against stepping the same Gymnasium env in process and through
Gymnasium's own AsyncVectorEnv with one env.

    python scripts/bench_remote_env.py [--rounds R] [--warmup W] [--steps N] [--quick] [--json PATH]

One deterministic agent (push the cart the way the pole turns) plays CartPole-v1 for ``--steps``
env steps four ways, with the same seeded episodes:

  inprocess  ``gymnasium.make`` in the agent's process: the env's own cost;
  async1     ``gymnasium.vector.AsyncVectorEnv`` with one env: the env in a subprocess over pipes
             and shared memory, the closest peer with no network hop;
  remote     ``arbiter.client.RemoteEnv`` against ``arbiter serve`` (the two-phase format's
             CartPole preset, phase 2, one training run of ``--steps`` steps) over a
             redis-server this script starts: through its unix socket, as ``arbiter run``
             connects an agent, or with ``--tcp`` on a free loopback port, as containers that
             share a Redis meet;
  floor      the env stepped in a process of its own through the same redis-server, with
             arbiter's packets and Redis commands on both sides and bare msgpack lists for
             messages (bench_remote_floor.py): what remote costs without arbiter's protocol
             (codec checks, client gate, budgets, records), so remote/floor is that work's price.

Every path runs in a subprocess of its own (``--worker MODE``) that builds its env first and then
measures: wall time from the first reset to the last step, and every step and reset call. The
paths alternate within each round (inprocess first, then async1, remote and floor, their order
reversed every round) so that noise shows as spread; the ratios are taken per round. All runs must play
exactly the in-process run's episodes (seeds, steps, returns; the evaluator's records too), else
MISMATCH and exit 1.

The target (``TARGET``): RemoteEnv's steps/s against AsyncVectorEnv(1)'s, the median of the
per-round ratios. ``--quick`` is a small, fast version for tests (``QUICK``). Only 127.0.0.1 is
used; every process this script starts (and its redis-server) is stopped by pid on the way out.

Exit status: 0 all checks passed; 1 MISMATCH; 2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_profile
from bench_remote_floor import WORKERS as FLOOR_WORKERS
from bench_remote_workers import WORKERS as REMOTE_WORKERS
from harness import (
    BenchSession,
    Runs,
    Target,
    add_run_options,
    alternate_rounds,
    checks_report,
    machine_info,
    machine_line,
    median_of,
    new_service_id,
    per_round_ratios,
    percentile,
    print_checks_and_time,
    read_results,
    run_main,
    serve_argv,
    spread,
    steal_share,
    write_json,
)

WORKERS = {**REMOTE_WORKERS, **FLOOR_WORKERS}
ENV_ID = "CartPole-v1"
PRESET = "two-phase-cartpole"
SEED = 1001  # the preset's competition seed
PATHS = ("inprocess", "async1", "remote", "floor")
# goal 475 (the preset's) with a window of 1 fits in any run of at least 950 steps
MIN_STEPS = 950
TARGET = Target("remote_over_async1", "RemoteEnv", "AsyncVectorEnv(1)", "in steps/s", 1.5, at_least=True)
QUICK = {"rounds": 1, "warmup": 0, "steps": 1000}


def server_argv(redis_url: str, service_id: str, results: Path, steps: int) -> list[str]:
    """``arbiter serve`` on the CartPole preset: phase 2 only, one run of ``steps`` env steps and
    one evaluation episode after it."""
    overrides = ["phase=2", "num_episodes=1", "phase2.num_runs=1", f"phase2.max_steps={steps}",
                 "phase2.stability_window=1", f"seed={SEED}"]  # fmt: skip
    return serve_argv(redis_url, service_id, results, "--competition", PRESET, overrides=overrides)


class RemoteEnvBench(Runs):
    def worker_options(self) -> list[str]:
        return ["--steps", str(self.args.steps), "--seed", str(SEED), "--env-id", ENV_ID]

    def run_local(self, path: str, label: str) -> dict[str, Any]:
        agent = self.procs.worker(f"{path}-{label}", path, *self.worker_options())
        self.procs.wait([agent], self.args.timeout)
        return agent.result()

    def run_remote(self, label: str, profile_dir: Path | None = None) -> dict[str, Any]:
        """One evaluation; with ``profile_dir``, the evaluator and the agent run under py-spy."""
        service_id = new_service_id(label)
        results = self.results_dir(service_id)
        serve = server_argv(self.redis_url, service_id, results, self.args.steps)
        agent = self.procs.worker_argv("remote", *self.worker_options(), "--redis-url", self.redis_url,
                                               "--service-id", service_id, "--reply-timeout",
                                               str(self.args.reply_timeout))  # fmt: skip
        if profile_dir is not None:
            serve = bench_profile.wrap(serve, profile_dir / "server.txt")
            agent = bench_profile.wrap(agent, profile_dir / "agent.txt")
        out = self.session.evaluate(label, serve, agent, self.args.timeout)
        written = read_results(results)
        out.update({key: written[key] for key in ("state", "server_step_mean_s", "server_think_mean_s")})
        out["server_episodes"] = [{"seed": r["seed"], "steps": r["steps"], "return": r["return"]}
                                  for r in written["records"] if r["stage"] == "train"]  # fmt: skip
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

    def run_floor(self, label: str) -> dict[str, Any]:
        """The floor's two processes (bench_remote_floor.py), meeting on a key prefix of their own."""
        service_id = new_service_id(label)
        meet = ["--redis-url", self.redis_url, "--service-id", service_id,
                "--reply-timeout", str(self.args.reply_timeout)]  # fmt: skip
        env_side = self.procs.worker(f"floor-env-{label}", "floor-env", "--env-id", ENV_ID, *meet)
        agent = self.procs.worker(f"floor-{label}", "floor", *self.worker_options(), *meet)
        self.procs.wait([agent, env_side], self.args.timeout)
        return agent.result()

    def run(self, path: str, label: str) -> dict[str, Any]:
        runners = {"remote": self.run_remote, "floor": self.run_floor}
        out = runners[path](label) if path in runners else self.run_local(path, label)
        return {**out, "steps_per_s": out["steps"] / out["wall_s"]}


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


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path over its rounds: the spread of steps/s, per-call latencies as medians over rounds."""
    return {
        "steps_per_s": spread(run["steps_per_s"] for run in runs),
        "wall_s": spread(run["wall_s"] for run in runs),
        "step_p50_s": median_of(runs, lambda r: percentile(r["step_s"], 0.50)),
        "step_p99_s": median_of(runs, lambda r: percentile(r["step_s"], 0.99)),
        "step_mean_s": median_of(runs, lambda r: statistics.fmean(r["step_s"])),
        "step_max_s": median_of(runs, lambda r: max(r["step_s"])),
        "reset_p50_s": median_of(runs, lambda r: percentile(r["reset_s"], 0.50)),
        "setup_s": median_of(runs, lambda r: r["setup_s"]),
        "server_step_mean_s": median_of(runs, lambda r: r.get("server_step_mean_s")),
        "server_think_mean_s": median_of(runs, lambda r: r.get("server_think_mean_s")),
    }


RATIOS = {"remote_over_async1": ("remote", "async1"), "remote_over_inprocess": ("remote", "inprocess"),
          "async1_over_inprocess": ("async1", "inprocess"), "floor_over_async1": ("floor", "async1"),
          "remote_over_floor": ("remote", "floor")}  # fmt: skip


def us(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e6:.1f}"


def print_table(report: dict[str, Any]) -> None:
    cfg, mach, paths = report["config"], report["machine"], report["paths"]
    episodes = report["reference"]
    print()
    print(
        f"RemoteEnv benchmark — {cfg['env_id']}, {cfg['steps']} steps per path and round ({len(episodes)} episodes, "
        f"{min(e['steps'] for e in episodes)}–{max(e['steps'] for e in episodes)} steps); {cfg['rounds']} round(s) "
        f"after {cfg['warmup_rounds']} warm-up; {machine_line(mach)}; {cfg['transport']}"
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
    for name, (top, bottom) in RATIOS.items():
        values = ", ".join(f"{v:.3f}" for v in r[name]["per_round"])
        print(
            f"steps/s {top}/{bottom}: median {r[name]['median']:.3f} [{r[name]['min']:.3f}–{r[name]['max']:.3f}] "
            f"(per round: {values})"
        )
    print(TARGET.line(r[TARGET.ratio]))
    floor = r["floor_over_async1"]["median"]
    print(
        f"floor: arbiter's packets and Redis commands with no protocol reach {floor:.3f}× AsyncVectorEnv(1) "
        f"({'at' if floor >= TARGET.bound else 'below'} the target's {TARGET.bound:g}); remote runs at "
        f"{r['remote_over_floor']['median']:.3f}× the floor's steps/s"
    )
    remote = paths["remote"]
    if remote["server_step_mean_s"] is not None:
        print(
            f"evaluator (summary.json): step {us(remote['server_step_mean_s'])} µs mean; the agent's time between "
            f"steps as the evaluator sees it (step_think_s) {us(remote['server_think_mean_s'])} µs mean"
        )
    print_checks_and_time(report, "trajectories", "client side, and the evaluator's")


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> int:
    began = time.monotonic()
    if args.quick:
        args.rounds, args.warmup, args.steps = QUICK["rounds"], QUICK["warmup"], QUICK["steps"]
    machine = machine_info("gymnasium")
    profile = None
    with BenchSession("arbiter-bench-remote-", script=Path(__file__).resolve(), keep=args.keep) as session:
        bench = RemoteEnvBench(args, session, session.start_redis(args.tcp))
        # in-process first in every round, the others reversed each round
        orders = (PATHS, ("inprocess", "floor", "remote", "async1"))
        rate = lambda r: f"{r['steps_per_s']:>8.0f} steps/s"  # noqa: E731
        runs = alternate_rounds(args.rounds, args.warmup, orders, bench.run, rate)
        if args.profile:
            print(f"bench: profiling one more remote run under py-spy into {args.profile}", flush=True)
            profile = bench.profile(Path(args.profile))
    if session.failed():
        return 2

    mismatches = check_runs(runs, args.steps)
    ratios = {name: per_round_ratios(runs[top], runs[bottom], "steps_per_s") for name, (top, bottom) in RATIOS.items()}
    report = {
        "config": {
            "transport": session.transport,
            "env_id": ENV_ID,
            "preset": PRESET,
            "seed": SEED,
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "quick": args.quick,
            "agent": "int(observation[3] > 0)",
        },  # fmt: skip
        "machine": machine,
        "reference": runs["inprocess"][0]["episodes"],
        "paths": {name: summarise(runs[name]) for name in PATHS},
        "ratios": ratios,
        "target": TARGET.report(ratios[TARGET.ratio]),
        "checks": checks_report(mismatches, runs),
        "raw_runs": {
            name: [{k: v for k, v in run.items() if k not in ("step_s", "reset_s")} for run in runs[name]]
            for name in PATHS
        },  # fmt: skip
        "profile": profile,
        "total_s": time.monotonic() - began,
        "steal_share": steal_share(machine.get("cpu_ticks_start")),
        "json_path": args.json,
    }
    write_json(args.json, report)
    print_table(report)
    if profile:
        print()
        print(f"profile ({profile['steps_per_s_under_py_spy']:.0f} steps/s under py-spy; stacks in {profile['dir']}):")
        bench_profile.print_ranking("agent (RemoteEnv)", profile["agent"])
        bench_profile.print_ranking("evaluator (arbiter serve)", profile["server"])
    return 1 if mismatches else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser, workers=WORKERS, rounds=5)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per path and round (default 20000)")
    quick = ", ".join(f"{key} {value}" for key, value in QUICK.items())
    parser.add_argument("--quick", action="store_true", help=f"a small, fast run for tests: {quick}")
    parser.add_argument("--profile", metavar="DIR", help="then one remote run under py-spy: stacks and rankings")
    # Worker mode (internal): what one measured process of a path needs.
    parser.add_argument("--env-id", default=ENV_ID, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    too_few = not args.quick and args.steps < MIN_STEPS
    return run_main(args, WORKERS, run_benchmark, [(too_few, f"--steps must be at least {MIN_STEPS} (the goal must "
                                                             "stay reachable)")])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
