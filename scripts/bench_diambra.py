#!/usr/bin/env python3
"""Benchmark the DIAMBRA format's env in process and through RemoteEnv, on diambra-arena's engine mock.

    python scripts/bench_diambra.py [--game doapp] [--steps 3000] [--rounds 3] [--warmup 300]
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

Every run is a process of its own; the paths alternate within a round. Reported per shape: steps
per second (median over rounds), the remote/in-process ratio (median of the per-round ratios;
target ≥ 0.5), the bytes of one step reply as arbiter's codec encodes it, and the bytes Redis
received and sent per step in the remote runs (its ``total_net_input_bytes`` and
``total_net_output_bytes``: requests, replies, protocol overhead and the handshake included).
The remote runs must play exactly the in-process runs' episodes (seeds, steps, rewards), else
MISMATCH and exit status 1.

The mock sleeps 1 / (step_ratio × 1000) s per step (diambra-arena's default 1000 fps: 0.17 ms
at step ratio 6) to stand in for the emulator; a real engine's step costs far more (the emulator,
gRPC, the frame's transfer), so these figures bound arbiter's own cost, not a real evaluation's
speed. ``--profile DIR`` adds one remote run per shape under py-spy and ranks where the agent's
and the evaluator's time goes. Needs ``pip install -e ".[diambra]"``; only 127.0.0.1 is used, and
every process started here (redis-server included) is stopped by its pid on the way out.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_profile
from bench_common import BenchError, arbiter_rev, emit, machine_basics
from bench_procs import (
    BenchSession,
    Processes,
    brpop_clients,
    new_service_id,
    run_with_sigterm_as_interrupt,
    transport_label,
    wait_until_listening,
)

HERE = Path(__file__).resolve()
SHAPES = {"native": [0, 0, 0], "128x128 colour": [128, 128, 0], "128x128 gray": [128, 128, 1]}
PATHS = ("raw", "inprocess", "remote")
SEED = 1234
DIFFICULTY = "medium"
TARGET = 0.5  # RemoteEnv's steps/s against the in-process env's


def action_at(step: int, nvec: list[int]) -> list[int]:
    """A deterministic button sequence: every move and attack in turn, attacks a third of the time."""
    return [step % nvec[0], (step // 3) % nvec[1] if step % 3 == 0 else 0]


def play(reset: Any, step: Any, nvec: list[int], warmup: int, steps: int) -> dict[str, Any]:
    """``warmup`` untimed steps, then ``steps`` timed ones; episode k starts with ``reset(k)``.
    Returns the rate and every episode played (its seed, steps and reward: the trajectory check)."""
    episodes: list[dict[str, Any]] = []
    total = warmup + steps
    done = 0
    started = time.perf_counter()
    while done < total:
        seed = reset(len(episodes))
        episode = {"seed": seed, "steps": 0, "reward": 0.0}
        episodes.append(episode)
        while done < total:
            if done == warmup:
                started = time.perf_counter()  # first steps pay for allocations and caches
            reward, ended = step(action_at(done, nvec))
            done += 1
            episode["steps"] += 1
            episode["reward"] += reward
            if ended:
                break
    wall = time.perf_counter() - started
    return {"steps_per_s": steps / wall, "wall_s": wall, "episodes": episodes}


def observation_bytes(observation: dict[str, Any]) -> dict[str, int]:
    """The frame's bytes, and the bytes of one step reply's observation as arbiter's codec encodes it."""
    from arbiter.protocol import codec

    return {"frame": int(observation["frame"].nbytes), "encoded": len(codec.encode({"observation": observation}))}


# -- the measured processes (--worker PATH) ---------------------------------------------------------


def worker_local(args: argparse.Namespace) -> int:
    from arbiter.server.formats.diambra.engine import MockEngine, build_single_player_env
    from arbiter.server.formats.diambra.env import DiambraEnv, arena_settings, episode_seed
    from arbiter.server.formats.diambra.settings import DiambraSettings

    settings = DiambraSettings(game=args.game, difficulty=DIFFICULTY, frame_shape=SHAPES[args.shape])
    if args.worker == "raw":
        env = build_single_player_env(arena_settings(settings, None), lambda *_: MockEngine(settings.level))
    else:
        env = DiambraEnv(settings)
    seen: dict[str, Any] = {}

    def reset(episode: int) -> int | None:
        seed = episode_seed(SEED, episode)
        seen["observation"] = env.reset(seed=seed)[0]
        return seed

    def step(action: list[int]) -> tuple[float, bool]:
        _, reward, terminated, truncated, _ = env.step(action)
        return float(reward), terminated or truncated

    played = play(reset, step, [int(n) for n in env.action_space.nvec], args.warmup, args.steps)
    observation = seen["observation"]
    env.close()
    emit({**played, "frame_shape": list(observation["frame"].shape), "bytes": observation_bytes(observation)})
    return 0


def worker_remote(args: argparse.Namespace) -> int:
    from arbiter.client.remote_env import RemoteEnv
    from arbiter.server.formats.diambra.env import episode_seed

    env = RemoteEnv(
        redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=60,
        shared_frames=not args.frames_through_redis,
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def reset(episode: int) -> int | None:
        observation, info = env.reset()
        if info["env_done"]:
            raise BenchError("the evaluation ran out of episodes before the benchmark's steps")
        seen["observation"] = observation
        return episode_seed(SEED, episode)  # the evaluator names a seed only once its episode is over

    def step(action: list[int]) -> tuple[float, bool]:
        _, reward, terminated, truncated, _ = env.step(action)
        return reward, terminated or truncated

    played = play(reset, step, [int(n) for n in env.action_space.nvec], args.warmup, args.steps)
    env.submit()
    env.close()
    observation = seen["observation"]
    emit({**played, "frame_shape": list(observation["frame"].shape), "bytes": observation_bytes(observation),
          "engine": env.server_info.get("engine")})  # fmt: skip
    return 0


# -- the orchestrator -------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path, procs: Processes, redis_url: str):
        import redis

        self.args = args
        self.workdir = workdir
        self.procs = procs
        self.redis_url = redis_url
        self.conn = redis.Redis.from_url(redis_url, socket_timeout=10)

    def options(self, shape: str) -> list[str]:
        a = self.args
        return ["--shape", shape, "--game", a.game, "--steps", str(a.steps), "--warmup", str(a.warmup)]

    def run(self, path: str, shape: str, label: str, profile_dir: Path | None = None) -> dict[str, Any]:
        if path != "remote":
            proc = self.procs.worker(f"{path}-{label}", path, *self.options(shape))
            self.procs.wait([proc], self.args.timeout)
            return proc.result()
        service_id = new_service_id(label)
        results = self.workdir / "results" / service_id
        height, width, channels = SHAPES[shape]
        episodes = (self.args.warmup + self.args.steps) // 50 + 2  # mock episodes last 150+ steps
        overrides = [f"game={self.args.game}", f"difficulty={DIFFICULTY}", f"seed={SEED}", f"episodes={episodes}",
                     f"frame_shape=[{height}, {width}, {channels}]"]  # fmt: skip
        serve = [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", "diambra"]
        for item in overrides:
            serve += ["--set", item]
        serve += ["--redis-url", self.redis_url, "--service-id", service_id, "--results", str(results), "--quiet"]
        agent = [sys.executable, str(HERE), "--worker", "remote", *self.options(shape),
                 "--redis-url", self.redis_url, "--service-id", service_id]  # fmt: skip
        if self.args.frames_through_redis:
            agent.append("--frames-through-redis")
        if profile_dir is not None:
            serve = bench_profile.wrap(serve, profile_dir / f"server-{label}.txt")
            agent = bench_profile.wrap(agent, profile_dir / f"agent-{label}.txt")
        baseline = brpop_clients(self.conn)
        server = self.procs.start(f"serve-{label}", serve)
        wait_until_listening(self.conn, [server], baseline)
        before = self.conn.info("stats")
        agent_proc = self.procs.start(f"remote-{label}", agent)
        self.procs.wait([agent_proc, server], self.args.timeout)
        after = self.conn.info("stats")
        out = agent_proc.result()
        played = self.args.warmup + self.args.steps
        out["redis_in_bytes_per_step"] = (after["total_net_input_bytes"] - before["total_net_input_bytes"]) / played
        out["redis_out_bytes_per_step"] = (after["total_net_output_bytes"] - before["total_net_output_bytes"]) / played
        summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
        timing = summary.get("timing") or {}
        out["state"] = summary.get("state")
        out["summary_engine"] = (summary.get("score") or {}).get("engine")
        out["server_step_mean_s"] = (timing.get("server_step_s") or {}).get("mean")
        out["agent_think_mean_s"] = (timing.get("step_think_s") or {}).get("mean")
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


def summarise(shape: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def rates(path: str) -> list[float]:
        return [run["steps_per_s"] for run in runs[path]]

    ratio = [r / i for r, i in zip(rates("remote"), rates("inprocess"), strict=True)]
    remote = runs["remote"]
    return {
        "frame_shape": runs["inprocess"][0]["frame_shape"],
        "steps_per_s": {path: statistics.median(rates(path)) for path in PATHS},
        "steps_per_s_all": {path: rates(path) for path in PATHS},
        "remote_over_inprocess": statistics.median(ratio),
        "remote_over_inprocess_all": ratio,
        "frame_bytes": runs["inprocess"][0]["bytes"]["frame"],
        "observation_encoded_bytes": runs["inprocess"][0]["bytes"]["encoded"],
        "redis_in_bytes_per_step": statistics.median(r["redis_in_bytes_per_step"] for r in remote),
        "redis_out_bytes_per_step": statistics.median(r["redis_out_bytes_per_step"] for r in remote),
        "server_step_mean_s": statistics.median(r["server_step_mean_s"] for r in remote),
        "agent_think_mean_s": statistics.median(r["agent_think_mean_s"] for r in remote),
        "met": statistics.median(ratio) >= TARGET,
    }


def print_table(report: dict[str, Any]) -> None:
    cfg, machine = report["config"], report["machine"]
    print()
    print(
        f"DIAMBRA benchmark — {cfg['game']} ({cfg['difficulty']}) on diambra-arena's engine mock, {cfg['steps']} "
        f"timed steps after {cfg['warmup']} per run, {cfg['rounds']} round(s); {machine['cpus']} CPUs, Python "
        f"{machine['python']}, arbiter {machine['arbiter_rev']}; load average at start {machine['loadavg_start']}; "
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
        ratios = ", ".join(f"{r:.2f}" for r in s["remote_over_inprocess_all"])
        print(
            f"target RemoteEnv ≥ {TARGET}× in process at {shape}: {'met' if s['met'] else 'NOT met'} "
            f"(per round {ratios})"
        )
    if report["mismatches"]:
        for line in report["mismatches"]:
            print(f"  MISMATCH {line}")
    else:
        print("trajectories: every in-process and remote run played the same episodes (seeds, steps, rewards)")
    print(f"benchmark time: {report['total_s']:.1f} s")


def run_benchmark(args: argparse.Namespace) -> int:

    began = time.monotonic()
    wanted = args.shapes.split(",") if args.shapes else [""]
    shapes = [shape for shape in SHAPES if any(word.strip() in shape for word in wanted)]
    with BenchSession("arbiter-bench-diambra-", script=HERE, keep=False) as session:
        workdir, procs, redis_server = session.workdir, session.procs, session.redis
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {shape: {path: [] for path in PATHS} for shape in shapes}
        profiles: dict[str, Any] = {}
        redis_server.start()
        bench = Bench(args, workdir, procs, session.redis_url(args.tcp))
        for shape in shapes:
            for round_ in range(1, args.rounds + 1):
                order = PATHS if round_ % 2 else tuple(reversed(PATHS))
                for path in order:
                    result = bench.run(path, shape, f"{shape.split()[0]}-{path}-r{round_}")
                    runs[shape][path].append(result)
                    print(
                        f"bench: {shape:<15} round {round_} {path:<9} {result['steps_per_s']:>7.0f} steps/s", flush=True
                    )
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
            "transport": transport_label(args.tcp),
            "frames": "through Redis" if args.frames_through_redis else "large arrays through shared memory",
            "game": args.game,
            "difficulty": DIFFICULTY,
            "seed": SEED,
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "mock_fps": 1000,
        },  # fmt: skip
        "machine": {**machine_basics(), "arbiter_rev": arbiter_rev()},
        "shapes": {shape: summarise(shape, runs[shape]) for shape in shapes},
        "mismatches": mismatches,
        "profiles": profiles,
        "total_s": time.monotonic() - began,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print_table(report)
    for shape, profile in profiles.items():
        print()
        bench_profile.print_ranking(f"{shape}: agent (RemoteEnv)", profile["agent"])
        bench_profile.print_ranking(f"{shape}: evaluator (arbiter serve)", profile["server"])
    return 1 if mismatches else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--game", default="doapp")
    parser.add_argument("--steps", type=int, default=3000, help="timed steps per run (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (raw, inprocess, remote) per shape")
    parser.add_argument("--warmup", type=int, default=300, help="untimed steps at the start of every run")
    parser.add_argument(
        "--shapes", help=f"only the shapes of {list(SHAPES)} named (or partly named) in this comma-separated list"
    )
    parser.add_argument("--tcp", action="store_true", help="loopback TCP, not the unix socket arbiter run uses")
    parser.add_argument(
        "--frames-through-redis",
        action="store_true",
        help="no shared frames: every frame through Redis, as for an agent in another container",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--profile", metavar="DIR", help="then one remote run per shape under py-spy: rankings")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit per run, seconds")
    parser.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=list(SHAPES), help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        logging.disable(logging.INFO)  # diambra-arena logs its whole settings at every env creation
        return worker_remote(args) if args.worker == "remote" else worker_local(args)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        print("bench: --rounds and --steps must be at least 1, --warmup at least 0", file=sys.stderr)
        return 2
    if args.profile and bench_profile.py_spy() is None:
        print("bench: --profile needs py-spy (pip install py-spy)", file=sys.stderr)
        return 2

    return run_with_sigterm_as_interrupt(run_benchmark, args)


if __name__ == "__main__":
    sys.exit(main())
