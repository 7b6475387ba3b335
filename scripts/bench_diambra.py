#!/usr/bin/env python3
"""Benchmark the DIAMBRA format's env in process and through RemoteEnv, on diambra-arena's engine mock.

    python scripts/bench_diambra.py [--game GAME] [--steps N] [--rounds R] [--warmup N]
                                     [--shapes native,128x128] [--tcp] [--frames-through-redis]
                                     [--json PATH] [--profile DIR]

For each frame shape (the game's native frame, 128×128 in colour, 128×128 grayscale) one
deterministic agent (its action a pure function of the step number) plays ``--warmup`` untimed
steps, then ``--steps`` timed steps, resetting at each episode's end with the evaluator's seeds
(``env.episode_seed(seed, k)``), three ways:

  raw        diambra-arena's own ``DiambraGym1P`` on the mock, nothing of arbiter around it;
  inprocess  ``DiambraEnv``: the same env with arbiter's action check, observation conversion and
             private random generators, i.e. what the evaluator steps, in the agent's process;
  remote     ``arbiter.client.RemoteEnv`` against ``arbiter serve --competition diambra`` (a process
             of its own) over a redis-server this script starts (its unix socket, as ``arbiter
             run``; ``--tcp``: a free loopback port): every step's reply carries DIAMBRA's
             observation (frame and RAM states), its large arrays through shared memory as for
             any agent on the evaluator's machine (``--frames-through-redis``: all of it through
             Redis, as for an agent in another container).

Every run is a process of its own (``--worker PATH``: bench_diambra_workers.py); the paths
alternate within a round. Reported per shape: steps per second (median over rounds), the
remote/in-process ratio (median of the per-round ratios; ``TARGET`` is judged on the least
favourable round), the bytes of one
step reply as arbiter's codec encodes it, and the bytes Redis received and sent per step in the
remote runs (its ``total_net_input_bytes`` and ``total_net_output_bytes``: requests, replies,
protocol overhead and the handshake included).
The remote runs must play exactly the in-process runs' episodes (seeds, steps, rewards), else
MISMATCH and exit status 1.

The mock sleeps a short fixed time per step (set by diambra-arena's default frame rate and the
step ratio) to stand in for the emulator; a real engine's step costs far more (the emulator,
gRPC, the frame's transfer), so these figures bound arbiter's own cost, not a real evaluation's
speed. ``--profile DIR`` adds one remote run per shape under py-spy and ranks where the agent's
and the evaluator's time goes. Needs ``pip install -e ".[diambra]"``; only 127.0.0.1 is used, and
every process started here (redis-server included) is stopped by its pid on the way out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_profile
from bench_diambra_workers import DIFFICULTY, PATHS, SEED, SHAPES, WORKERS
from harness import (
    BenchSession,
    Runs,
    Target,
    add_run_options,
    alternate_rounds,
    benchmark_time_line,
    machine_info,
    machine_line,
    new_service_id,
    per_round_ratios,
    read_results,
    run_main,
    serve_argv,
    steal_share,
    write_json,
)

TARGET = Target(
    "remote_over_inprocess", "RemoteEnv", "the env in process", "in steps/s", 0.6, at_least=True, every_round=True
)
MOCK_FPS = 1000  # diambra-arena's default frame rate, which its engine mock sleeps by


class Bench(Runs):
    def options(self, shape: str) -> list[str]:
        a = self.args
        return ["--shape", shape, "--game", a.game, "--steps", str(a.steps), "--warmup", str(a.warmup)]

    def run(self, path: str, shape: str, label: str, profile_dir: Path | None = None) -> dict[str, Any]:
        procs = self.procs
        if path != "remote":
            proc = procs.worker(f"{path}-{label}", path, *self.options(shape))
            procs.wait([proc], self.args.timeout)
            return proc.result()
        service_id = new_service_id(label)
        results = self.results_dir(service_id)
        height, width, channels = SHAPES[shape]
        episodes = (self.args.warmup + self.args.steps) // 50 + 2  # mock episodes last 150+ steps
        overrides = [f"game={self.args.game}", f"difficulty={DIFFICULTY}", f"seed={SEED}", f"episodes={episodes}",
                     f"frame_shape=[{height}, {width}, {channels}]"]  # fmt: skip
        serve = serve_argv(self.redis_url, service_id, results, "--competition", "diambra", overrides=overrides)
        agent = procs.worker_argv("remote", *self.options(shape), "--redis-url", self.redis_url,
                                  "--service-id", service_id)  # fmt: skip
        if self.args.frames_through_redis:
            agent.append("--frames-through-redis")
        if profile_dir is not None:
            serve = bench_profile.wrap(serve, profile_dir / f"server-{label}.txt")
            agent = bench_profile.wrap(agent, profile_dir / f"agent-{label}.txt")
        stats: list[dict[str, Any]] = []  # Redis's byte counters once the evaluator listens, and at the end
        out = self.session.evaluate(label, serve, agent, self.args.timeout,
                                    listening=lambda: stats.append(self.session.conn.info("stats")))  # fmt: skip
        before, after = stats[0], self.session.conn.info("stats")
        played = self.args.warmup + self.args.steps
        out["redis_in_bytes_per_step"] = (after["total_net_input_bytes"] - before["total_net_input_bytes"]) / played
        out["redis_out_bytes_per_step"] = (after["total_net_output_bytes"] - before["total_net_output_bytes"]) / played
        written = read_results(results)
        out["state"] = written["state"]
        out["summary_engine"] = (written["summary"].get("score") or {}).get("engine")
        out["server_step_mean_s"] = written["server_step_mean_s"]
        out["agent_think_mean_s"] = written["server_think_mean_s"]
        return out


def check(shape: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every in-process and remote run plays the first in-process run's episodes exactly; every
    remote evaluation succeeds, on the mock, and says so."""
    reference = runs["inprocess"][0]["episodes"]
    problems = []
    for path in ("inprocess", "remote"):
        for i, run in enumerate(runs[path], start=1):
            if run["episodes"] != reference:
                problems.append(f"{shape}: {path} round {i} played other episodes than the in-process run")
            if path == "remote" and (run["state"] != "SUCCESS" or run["summary_engine"] != "mock"):
                problems.append(f"{shape}: remote round {i}: state {run['state']}, engine {run['summary_engine']}")
    return problems


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def rates(path: str) -> list[float]:
        return [run["steps_per_s"] for run in runs[path]]

    ratio = per_round_ratios(runs["remote"], runs["inprocess"], "steps_per_s")
    remote = runs["remote"]
    return {
        "frame_shape": runs["inprocess"][0]["frame_shape"],
        "steps_per_s": {path: statistics.median(rates(path)) for path in PATHS},
        "steps_per_s_all": {path: rates(path) for path in PATHS},
        "remote_over_inprocess": ratio["median"],
        "remote_over_inprocess_all": ratio["per_round"],
        "frame_bytes": runs["inprocess"][0]["bytes"]["frame"],
        "observation_encoded_bytes": runs["inprocess"][0]["bytes"]["encoded"],
        "redis_in_bytes_per_step": statistics.median(r["redis_in_bytes_per_step"] for r in remote),
        "redis_out_bytes_per_step": statistics.median(r["redis_out_bytes_per_step"] for r in remote),
        "server_step_mean_s": statistics.median(r["server_step_mean_s"] for r in remote),
        "agent_think_mean_s": statistics.median(r["agent_think_mean_s"] for r in remote),
        "target": TARGET.report(ratio),
        "met": TARGET.met(TARGET.judged(ratio)),
    }


def print_table(report: dict[str, Any]) -> None:
    cfg, machine = report["config"], report["machine"]
    print()
    print(
        f"DIAMBRA benchmark — {cfg['game']} ({cfg['difficulty']}) on diambra-arena's engine mock, {cfg['steps']} "
        f"timed steps after {cfg['warmup']} per run, {cfg['rounds']} round(s); {machine_line(machine)}; "
        f"{cfg['transport']}; frames: {cfg['frames']}"
    )
    header = (
        f"{'shape':<15} {'frame':>11} {'raw/s':>7} {'in-proc/s':>9} {'remote/s':>9} {'remote÷in':>9} "
        f"{'reply B':>8} {'Redis in B/step':>15} {'out B/step':>10} {'eval step µs':>12} {'agent µs':>9}"
    )
    print(header)
    print("-" * len(header))
    for shape, s in report["shapes"].items():
        rate = s["steps_per_s"]
        print(
            f"{shape:<15} {'x'.join(map(str, s['frame_shape'])):>11} {rate['raw']:>7.0f} {rate['inprocess']:>9.0f} "
            f"{rate['remote']:>9.0f} {s['remote_over_inprocess']:>9.2f} {s['observation_encoded_bytes']:>8} "
            f"{s['redis_in_bytes_per_step']:>15.0f} {s['redis_out_bytes_per_step']:>10.0f} "
            f"{s['server_step_mean_s'] * 1e6:>12.0f} {s['agent_think_mean_s'] * 1e6:>9.0f}"
        )
    print(
        "(steps/s: median over rounds; remote÷in: median of the per-round ratios; reply B: one step's observation as "
        "the codec encodes it; Redis B/step: bytes Redis received and sent per step; eval step: the evaluator's "
        "env step; agent: the time between a reply and the next step, as the evaluator measures it)"
    )
    for shape, s in report["shapes"].items():
        ratio = {"median": s["remote_over_inprocess"], "per_round": s["remote_over_inprocess_all"]}
        print(TARGET.line(ratio, where=f" at {shape}"))
    if report["mismatches"]:
        for line in report["mismatches"]:
            print(f"  MISMATCH {line}")
    else:
        print("trajectories: every in-process and remote run played the same episodes (seeds, steps, rewards)")
    print(benchmark_time_line(report))


def run_benchmark(args: argparse.Namespace) -> int:
    began = time.monotonic()
    machine = machine_info()
    wanted = args.shapes.split(",") if args.shapes else [""]
    shapes = [shape for shape in SHAPES if any(word.strip() in shape for word in wanted)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    profiles: dict[str, Any] = {}
    with BenchSession("arbiter-bench-diambra-", script=Path(__file__).resolve(), keep=args.keep) as session:
        bench = Bench(args, session, session.start_redis(args.tcp))
        for shape in shapes:
            print(f"bench: frames {shape}", flush=True)
            runs[shape] = alternate_rounds(
                args.rounds, 0, (PATHS, PATHS[::-1]),
                lambda path, label, shape=shape: bench.run(path, shape, f"{shape.split()[0]}-{path}-{label}"),
                lambda r: f"{r['steps_per_s']:>7.0f} steps/s",
            )  # fmt: skip
            if args.profile:
                folder = Path(args.profile)
                folder.mkdir(parents=True, exist_ok=True)
                label = f"{shape.split()[0]}-{'-'.join(shape.split()[1:]) or 'frame'}"
                bench.run("remote", shape, label, profile_dir=folder)
                profiles[shape] = {
                    "agent": bench_profile.rank(folder / f"agent-{label}.txt"),
                    "server": bench_profile.rank(folder / f"server-{label}.txt"),
                }
    if session.failed():
        return 2
    mismatches = [line for shape in shapes for line in check(shape, runs[shape])]
    report = {
        "config": {
            "transport": session.transport,
            "frames": "through Redis" if args.frames_through_redis else "large arrays through shared memory",
            "game": args.game,
            "difficulty": DIFFICULTY,
            "seed": SEED,
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "mock_fps": MOCK_FPS,
        },  # fmt: skip
        "machine": machine,
        "shapes": {shape: summarise(runs[shape]) for shape in shapes},
        "mismatches": mismatches,
        "profiles": profiles,
        "total_s": time.monotonic() - began,
        "steal_share": steal_share(machine.get("cpu_ticks_start")),
    }
    write_json(args.json, report)
    print_table(report)
    for shape, profile in profiles.items():
        print()
        bench_profile.print_ranking(f"{shape}: agent (RemoteEnv)", profile["agent"])
        bench_profile.print_ranking(f"{shape}: evaluator (arbiter serve)", profile["server"])
    return 1 if mismatches else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    add_run_options(parser, workers=WORKERS, rounds=3, warmup_rounds=None)
    parser.add_argument("--game", default="doapp")
    parser.add_argument("--steps", type=int, default=3000, help="timed steps per run (default 3000)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed steps at the start of every run")
    parser.add_argument(
        "--shapes", help=f"only the shapes of {list(SHAPES)} named (or partly named) in this comma-separated list"
    )
    parser.add_argument(
        "--frames-through-redis",
        action="store_true",
        help="no shared frames: every frame through Redis, as for an agent in another container",
    )
    parser.add_argument("--profile", metavar="DIR", help="then one remote run per shape under py-spy: rankings")
    parser.add_argument("--shape", choices=list(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return run_main(args, WORKERS, run_benchmark, [(args.steps < 1, "--steps must be at least 1")])


if __name__ == "__main__":
    sys.exit(main())
