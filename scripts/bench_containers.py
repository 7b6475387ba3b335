"""What a container costs a submission: N debug submissions of the deterministic agent on
Flatland's debug set, evaluated by one burst ``arbiter worker --backend podman`` (the agent in a
container of the machine's own files, image ``rootfs:/``) and by one burst ``arbiter worker``
with the local backend (the agent a local process), in alternating rounds on one redis-server.

A submission's time is its farm cycle, as bench_farm.py defines it: from its attempt's start to
the same worker's next attempt's start. The container's cost is the podman cycle's median less
the local cycle's, per round; where it goes is read from the evaluation's events (the agent's
start: from the evaluator's start to the agent's first request). No target: the figure is for
the documentation. Checked: every submission finished once, and both backends scored the same.

Podman runs here as the tests run it (tests/support/containers.py): Debian's podman with runc,
the settings of a containers.conf written into the work folder, and the interpreter's folder
shown to the container's user when it lives under a folder closed to others.

    python scripts/bench_containers.py [--submissions N] [--rounds R] [--quick] [--json FILE] [--keep]

Exit status: 0 checks pass, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_farm import competition_file, farm_batch
from harness import BenchSession, machine_info, machine_line, spread, write_json

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
from containers import ROOTFS_IMAGE, podman_settings, worker_options  # noqa: E402

QUICK = {"submissions": 2, "rounds": 1}  # the fewest that make a cycle (one start to the next)


def run(args: argparse.Namespace) -> int:
    from arbiter.server.formats.flatland.generate import debug_test_set

    if shutil.which("podman") is None:
        print("bench: podman is not installed (apt-get install podman runc)", file=sys.stderr)
        return 2
    machine = machine_info("rq", "redis")
    per_round = [args.submissions // args.rounds + (r < args.submissions % args.rounds) for r in range(args.rounds)]
    with BenchSession("arbiter-bench-containers-", script=SCRIPT, keep=args.keep) as session:
        redis_url = session.start_redis(tcp=True)
        competition = competition_file(session.workdir, debug_test_set())
        env = podman_settings(session.workdir)
        podman = tuple(worker_options(session.workdir))
        batches: dict[str, list[dict[str, Any]]] = {"local": [], "podman": []}
        for round_, count in enumerate(per_round, start=1):
            for side in ("podman", "local") if round_ % 2 else ("local", "podman"):
                label = f"{side}-r{round_}"
                if side == "podman":
                    batch = farm_batch(session, redis_url, competition, 1, count, label, args, backend=podman, env=env,
                                       image=ROOTFS_IMAGE)  # fmt: skip
                else:
                    batch = farm_batch(session, redis_url, competition, 1, count, label, args)
                batches[side].append(batch)
            medians = {side: statistics.median(found[-1]["cycle_s"]) for side, found in batches.items()}
            print(f"bench: round {round_}: cycle median podman {medians['podman']:.3f} s, "
                  f"local {medians['local']:.3f} s", flush=True)  # fmt: skip
    if session.failed():
        return 2
    costs = [statistics.median(p["cycle_s"]) - statistics.median(q["cycle_s"])
             for p, q in zip(batches["podman"], batches["local"], strict=True)]  # fmt: skip
    figures = {
        side: {"cycle_s": spread(v for b in found for v in b["cycle_s"]),
               **{name: spread(part[name] for b in found for part in b["phases"]) for name in found[0]["phases"][0]},
               "states": sorted({s for b in found for s in b["states"]}),
               "attempts": sorted({a for b in found for a in b["attempts"]}),
               "scores": sorted({s for b in found for s in b["scores"]})}
        for side, found in batches.items()
    }  # fmt: skip
    problems = []
    for side, found in figures.items():
        if found["states"] != ["finished"] or found["attempts"] != [1]:
            problems.append(f"{side}: states {found['states']}, attempts {found['attempts']}")
    if figures["podman"]["scores"] != figures["local"]["scores"]:
        problems.append(f"scores differ: podman {figures['podman']['scores']}, local {figures['local']['scores']}")
    print(f"container against local process, one burst worker each: {args.submissions} debug submissions per "
          f"backend ({args.rounds} rounds), Flatland's debug set, podman with runc, image {ROOTFS_IMAGE}; "
          f"{machine_line(machine)}")  # fmt: skip
    print("median s per submission          podman    local")
    for name in ("cycle_s", "build_evaluator_s", "agent_start_s", "evaluation_s", "after_evaluation_s"):
        print(f"  {name:<30} {figures['podman'][name]['median']:>7.3f}  {figures['local'][name]['median']:>7.3f}")
    print(f"the container's cost per submission: median {statistics.median(costs):.3f} s "
          f"(per round: {', '.join(f'{c:.3f}' for c in costs)})")  # fmt: skip
    print("checks: " + ("every submission finished once, with the same score on both backends" if not problems
                        else "; ".join(problems)))  # fmt: skip
    write_json(args.json, {"machine": machine, "figures": figures, "cost_s": {**spread(costs), "per_round": costs},
                           "problems": problems})  # fmt: skip
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=30, help="submissions per backend (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds the submissions are split in (default 3)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per batch, in seconds (default 900)")
    parser.add_argument("--quick", action="store_true", help="2 submissions per backend, 1 round")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    args = parser.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.rounds < 1 or args.submissions < 2 * args.rounds:
        print("bench: give at least two submissions a round (--submissions >= 2 × --rounds)", file=sys.stderr)
        return 2
    args.step_delay = 0.0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
