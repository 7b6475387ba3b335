#!/usr/bin/env python3
"""Benchmark arbiter against a plain in-process loop and against flatland-rl's own evaluator.

    python scripts/bench.py [--rounds R] [--warmup W] [--envs N] [--quick] [--full] [--tcp] [--json PATH]

One deterministic agent (actions a pure function of episode, step and handle) plays the same
reference test set (bench_flatland.REFERENCE_LEVELS, generated with a fixed seed) four ways:

  direct    an in-process loop, no evaluator: load the env file, reset it with the evaluation
            seed, step until done (flatland's ``load_new``: its default rewards, its step
            recorder, its distance map computed at load);
  lean      the same loop on the env arbiter's client builds (the competition's rewards, no step
            recorder, the distance map computed when first read): the same env work as the
            arbiter agent, so arbiter/lean is what the evaluator itself costs;
  arbiter   ``arbiter serve`` in one process, the agent on ``arbiter.client.RemoteClient`` in
            another, over a redis-server this script starts: through its unix socket, as
            ``arbiter run`` connects them, or with ``--tcp`` on its loopback port;
  flatland  flatland-rl's ``FlatlandRemoteEvaluationService`` in one process (main thread: it
            uses SIGALRM), the agent on its ``FlatlandRemoteClient`` in another, over the same
            redis-server's loopback port (the only way they connect).

The paths alternate within each round (direct, lean, arbiter, flatland, direct, ...) so that noise
shows as spread. Every agent runs in its own subprocess (``--worker MODE``, a mode of this
script) and measures itself after its imports: evaluation wall time (just before the first
env load or request to after submit), steps and arrivals per episode, and the time spent inside
each step call. To show where the time goes, the remote agents also time the local ``env.step``
inside each ``env_step`` and the wait for each ``env_create`` reply, by wrapping those methods on
their instances (bench_workers.time_calls). Both remote paths must see exactly the direct loop's
trajectories (same steps and arrivals per episode, on the client and on the server side), else
MISMATCH and exit 1. The targets (bench_report.TARGETS: arbiter against the direct loop and
against flatland-rl's evaluator, judged on the median of the per-round ratios; against the lean
loop, judged on its least favourable round) are printed with their verdicts.

Each round ends with two lean loops started together (``--no-contention`` skips them: how much
two busy processes slow each other now) and the floor (``--no-floor``; bench_flatland_floor.py):
the lean loop with every step also sent through Redis to a process stepping its own copy, what
flatland's protocol costs before any evaluator logic, printed against the lean loop's target.

Also measured (each can be skipped): protocol-only throughput (empty ENV_STEP requests through
``RemoteClient.env_step`` with an env that does nothing, no env work on either side), the client's
env_create cost, the evaluator's memory over many short episodes (next to a plain flatland loop
over the same episodes, to tell arbiter's growth from flatland's), and several concurrent
evaluations on one Redis.

``--quick`` is a small, fast version for tests: one round, the first reference levels, a short
memory check, two concurrent evaluations. Only 127.0.0.1 is used; every process this script
starts (and its redis-server) is stopped by pid on the way out, errors included.

Exit status: 0 all checks passed; 1 MISMATCH (trajectories, or scores of the concurrent runs);
2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench_flatland import AGENT_RULE, EVAL_SEED, PATHS, REFERENCE_LEVELS, TESTSET_SEED, reference_test_set
from bench_flatland_floor import WORKERS as FLOOR_WORKERS
from bench_report import paths_report, print_table, scale_report
from bench_runs import Bench
from bench_workers import WORKERS as PATH_WORKERS
from harness import BenchSession, add_run_options, alternate_rounds, machine_info, run_main, steal_share, write_json

WORKERS = {**PATH_WORKERS, **FLOOR_WORKERS}
QUICK = {"rounds": 1, "warmup": 0, "envs": 2, "memory_episodes": 20, "concurrent": 2, "protocol_steps": 5000}


def run_benchmark(args: argparse.Namespace) -> int:
    began = time.monotonic()
    machine = machine_info("flatland-rl")
    if args.quick:
        args.rounds, args.warmup = QUICK["rounds"], QUICK["warmup"]
        envs, memory_episodes = QUICK["envs"], QUICK["memory_episodes"]
        concurrent, proto_n = QUICK["concurrent"], QUICK["protocol_steps"]
    else:
        envs, memory_episodes = args.envs, (1000 if args.full else 200)
        concurrent, proto_n = args.concurrent, args.protocol_steps
    memory_every = 100 if memory_episodes >= 200 else max(1, memory_episodes // 5)

    tests = reference_test_set(envs, args.cache_dir)
    with BenchSession("arbiter-bench-", script=Path(__file__).resolve(), keep=args.keep) as session:
        tcp_url = session.start_redis(tcp=True)  # flatland-rl's client and service speak loopback TCP only
        # arbiter's sides meet as arbiter run connects them, through the server's unix socket (--tcp: loopback TCP)
        bench = Bench(args, session, tcp_url if args.tcp else session.redis.local_url)
        transport = "arbiter and flatland-rl over loopback TCP"
        if not args.tcp:
            transport = "arbiter over Redis's unix socket, as arbiter run; flatland-rl over loopback TCP, its only way"
        runners = {"direct": bench.run_direct, "lean": bench.run_lean, "arbiter": bench.run_arbiter,
                   "flatland": bench.run_flatland}  # fmt: skip
        pairs: list[list[dict[str, Any]]] = []  # two lean loops at once, per round (--no-contention: none)
        mirrored: list[dict[str, Any]] = []  # the floor, per round (--no-floor: none)

        def after_round(round_: int) -> None:
            if not args.no_contention:
                pairs.append(bench.run_lean_pair(tests, f"r{round_}"))
                walls = " and ".join(f"{r['wall_s']:.3f}" for r in pairs[-1])
                print(f"bench: round {round_} lean ×2   wall {walls} s (two at once)", flush=True)
            if not args.no_floor:
                mirrored.append(bench.run_mirrored(tests, f"r{round_}"))
                wall = mirrored[-1]["wall_s"]
                print(f"bench: round {round_} floor     wall {wall:.3f} s (the lean loop, mirrored)", flush=True)

        runs = alternate_rounds(
            args.rounds, args.warmup, (PATHS, PATHS), lambda path, label: runners[path](tests, label),
            lambda r: f"wall {r['wall_s']:.3f} s, step mean {r['step_s']['mean'] * 1e3:.3f} ms",
            after_round=after_round,
        )  # fmt: skip
        reference = runs["direct"][0]["episodes"]
        config = {"testset_seed": TESTSET_SEED, "eval_seed": EVAL_SEED, "rounds": args.rounds,
                  "warmup_rounds": args.warmup, "envs": len(reference), "quick": args.quick, "full": args.full,
                  "tests": str(tests), "agent": AGENT_RULE, "transport": transport}  # fmt: skip
        report = paths_report(config, machine, runs, pairs, mirrored)

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
    report["steal_share"] = steal_share(machine.get("cpu_ticks_start"))
    report["json_path"] = args.json
    write_json(args.json, report)
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
    # flatland-rl's client and service speak loopback TCP only: every path uses it (no --tcp)
    add_run_options(parser, workers=WORKERS, rounds=5, timeout_s=900.0, reply_timeout_s=300.0)
    parser.add_argument("--envs", type=int, default=0, help="play only the first N reference levels (0 = all)")
    quick = ", ".join(f"{key} {value}" for key, value in QUICK.items())
    parser.add_argument("--quick", action="store_true", help=f"a small, fast run for tests: {quick}")
    parser.add_argument("--full", action="store_true", help="1000 episodes for the memory check (default 200)")
    parser.add_argument("--cache-dir", help="where generated test sets are cached (default arbiter's cache)")
    parser.add_argument("--concurrent", type=int, default=4, help="concurrent evaluations for the scale check")
    parser.add_argument("--protocol-steps", type=int, default=20_000, help="requests for the protocol-only check")
    parser.add_argument("--no-protocol", action="store_true", help="skip the protocol-only throughput")
    parser.add_argument("--no-memory", action="store_true", help="skip the server memory check")
    parser.add_argument("--no-scale", action="store_true", help="skip the concurrent evaluations")
    parser.add_argument("--no-contention", action="store_true", help="skip the two lean loops ending each round")
    parser.add_argument("--no-floor", action="store_true", help="skip the mirrored lean loop ending each round")
    parser.add_argument("--no-memory-baseline", dest="memory_baseline", action="store_false",
                        help="skip the plain flatland loop that the server's memory is compared with")  # fmt: skip
    # Worker mode (internal): what one measured process of a path needs.
    parser.add_argument("--tests", help=argparse.SUPPRESS)
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
    envs_known = 0 <= args.envs <= len(REFERENCE_LEVELS)
    return run_main(args, WORKERS, run_benchmark, [(not envs_known, f"--envs must be 0 to {len(REFERENCE_LEVELS)}")])


if __name__ == "__main__":
    sys.exit(main())
