#!/usr/bin/env python3
"""Benchmark arbiter against a plain in-process loop and against flatland-rl's own evaluator.

    python scripts/bench.py [--rounds 5] [--warmup 1] [--preset bench] [--quick] [--full] [--json PATH]

One deterministic agent (actions a pure function of episode, step and handle) plays the same
reference test set (a preset generated with a fixed seed) four ways:

  direct    an in-process loop, no evaluator: load the env file, reset it with the evaluation
            seed, step until done (flatland's ``load_new``: its default rewards, its step
            recorder, its distance map computed at load);
  lean      the same loop on the env arbiter's client builds (the competition's rewards, no step
            recorder, the distance map computed when first read): the same env work as the
            arbiter agent, so arbiter/lean is what the evaluator itself costs;
  arbiter   ``arbiter serve`` in one process, the agent on ``arbiter.client.RemoteClient`` in
            another, over a redis-server this script starts on a free loopback port;
  flatland  flatland-rl's ``FlatlandRemoteEvaluationService`` in one process (main thread: it
            uses SIGALRM), the agent on its ``FlatlandRemoteClient`` in another.

The paths alternate within each round (direct, lean, arbiter, flatland, direct, ...) so that noise
shows as spread. Every agent runs in its own subprocess (``--worker MODE``, a mode of this
script) and measures itself after its imports: evaluation wall time (just before the first
env load or request to after submit), steps and arrivals per episode, and the time spent inside
each step call. To show where the time goes, the remote agents also time (by wrapping instance
attributes, ~1 µs a call; no library code is changed) the local ``env.step`` inside each
``env_step`` and the wait for each ``env_create`` reply. Both remote paths must see exactly the
direct loop's trajectories (same steps and arrivals per episode, on the client and on the server
side), else MISMATCH and exit 1.

Also measured (each can be skipped): protocol-only throughput (empty ENV_STEP requests through
arbiter's real transport and codec, no env), the client's env_create cost, the evaluator's
memory over many short episodes (next to a plain flatland loop over the same episodes, to tell
arbiter's growth from flatland's), and several concurrent evaluations on one Redis.

``--quick`` is a small, fast version for tests: 1 round, the first 2 envs, 50 episodes for the
memory check, 2 concurrent evaluations. Only 127.0.0.1 is used; every process this script
starts (and its redis-server) is stopped by pid on the way out, errors included.

Exit status: 0 all checks passed; 1 MISMATCH (trajectories, or scores of the concurrent runs);
2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import EVAL_SEED, PATHS, TESTSET_SEED, ordered_env_paths
from bench_procs import BenchSession, run_with_sigterm_as_interrupt, subset_test_set
from bench_report import paths_report, print_table, scale_report
from bench_runs import Bench
from bench_workers import WORKERS


def run_benchmark(args: argparse.Namespace) -> int:
    from arbiter.server.formats.flatland.generate import cached_test_set

    began = time.monotonic()
    if args.quick:
        args.rounds = 1
        args.warmup = 0
        envs = 2
        memory_episodes = 50
        concurrent = 2
        proto_n = 5000
    else:
        envs = args.envs
        memory_episodes = 1000 if args.full else 200
        concurrent = args.concurrent
        proto_n = args.protocol_steps
    memory_every = 100 if memory_episodes >= 200 else max(1, memory_episodes // 5)

    full_set = cached_test_set(args.preset, TESTSET_SEED, cache_dir=args.cache_dir)
    with BenchSession("arbiter-bench-", keep=args.keep) as session:
        workdir, procs, redis_server = session.workdir, session.procs, session.redis
        report: dict[str, Any] = {}
        tests = full_set
        if envs and envs < len(ordered_env_paths(str(full_set))):
            tests = subset_test_set(full_set, workdir / f"tests-first{envs}", envs)
        redis_server.start()
        bench = Bench(args, workdir, procs, redis_server.url, redis_server.port)
        runners = {
            "direct": bench.run_direct,
            "lean": bench.run_lean,
            "arbiter": bench.run_arbiter,
            "flatland": bench.run_flatland,
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
        pairs: list[list[dict[str, Any]]] = []  # two lean loops at once, per round (--no-contention: none)
        for _ in range(args.warmup):
            # Unmeasured: the first run of each path pays for cold file and CPU caches.
            for name in PATHS:
                result = runners[name](tests, "warmup")
                print(f"bench: warm-up  {name:<8} wall {result['wall_s']:.3f} s (not counted)", flush=True)
        for round_ in range(1, args.rounds + 1):
            for name in PATHS:
                result = runners[name](tests, f"r{round_}")
                runs[name].append(result)
                print(
                    f"bench: round {round_} {name:<8} wall {result['wall_s']:.3f} s, "
                    f"step mean {result['step_s']['mean'] * 1e3:.3f} ms",
                    flush=True,
                )
            if not args.no_contention:
                pair = bench.run_lean_pair(tests, f"r{round_}")
                pairs.append(pair)
                walls = " and ".join(f"{r['wall_s']:.3f}" for r in pair)
                print(f"bench: round {round_} lean ×2   wall {walls} s (two at once)", flush=True)

        reference = runs["direct"][0]["episodes"]
        config = {
            "preset": args.preset,
            "testset_seed": TESTSET_SEED,
            "eval_seed": EVAL_SEED,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup,
            "envs": len(reference),
            "quick": args.quick,
            "full": args.full,
            "tests": str(tests),
            "agent": "(episode * 7 + step * 3 + handle * 5) % 5",
        }
        report = paths_report(config, runs, pairs)

        if not args.no_protocol:
            print(f"bench: protocol-only throughput, {proto_n} steps", flush=True)
            report["protocol"] = bench.run_protocol(proto_n)
        if not args.no_memory:
            print(f"bench: server memory over {memory_episodes} tiny episodes", flush=True)
            report["memory"] = bench.run_memory(memory_episodes, memory_every)
        if not args.no_scale and concurrent > 0:
            print(f"bench: {concurrent} concurrent evaluations", flush=True)
            single = runs["arbiter"][0]
            scale = bench.run_scale(tests, concurrent, single["score"])
            report["scale"] = scale_report(scale, reference, single, report["paths"]["arbiter"]["steps_per_s"])

    if session.failed():
        return 2
    report["total_s"] = time.monotonic() - began
    report["json_path"] = args.json
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    print_table(report)
    bad = list(report["trajectories"]["mismatches"])
    if "scale" in report and not report["scale"]["consistent"]:
        bad += report["scale"]["mismatches"]
    if bad:
        print(f"MISMATCH: {len(bad)} difference(s) from the direct loop or the single run (see above)")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (direct, lean, arbiter, flatland) (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1; --quick: 0)")
    parser.add_argument("--preset", default="bench", help="test set preset (default bench)")
    parser.add_argument("--envs", type=int, default=0, help="use only the first N envs of the preset (0 = all)")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 envs, 50 memory episodes, 2 concurrent")
    parser.add_argument("--full", action="store_true", help="1000 episodes for the memory check (default 200)")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--cache-dir", help="where the generated test sets are cached (default arbiter's cache)")
    parser.add_argument("--concurrent", type=int, default=4, help="concurrent evaluations for the scale check")
    parser.add_argument("--protocol-steps", type=int, default=20_000, help="requests for the protocol-only check")
    parser.add_argument("--no-protocol", action="store_true", help="skip the protocol-only throughput")
    parser.add_argument("--no-memory", action="store_true", help="skip the server memory check")
    parser.add_argument("--no-scale", action="store_true", help="skip the concurrent evaluations")
    parser.add_argument(
        "--no-contention", action="store_true", help="skip the two lean loops at once that end each round"
    )
    parser.add_argument(
        "--no-memory-baseline",
        dest="memory_baseline",
        action="store_false",
        help="skip the plain flatland loop that the server's memory is compared with",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="limit per evaluation run, seconds")
    parser.add_argument("--reply-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    # Worker mode (internal): one measured process of a path.
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--tests", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--rss-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rss-every", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--rss-self", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=20_000, help=argparse.SUPPRESS)
    parser.add_argument("--idle-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return WORKERS[args.worker](args)
    if args.rounds < 1:
        print("bench: --rounds must be at least 1", file=sys.stderr)
        return 2

    return run_with_sigterm_as_interrupt(run_benchmark, args)


if __name__ == "__main__":
    sys.exit(main())
