"""How a farm of `arbiter worker` processes scales: N submissions of the deterministic agent on
Flatland's tiny test set, evaluated by 1, 2 ... burst workers on one private redis-server.

For each number of workers: the throughput (submissions per minute, from the first start to
the last end), the wait in the queue (submitted to started), and the farm's own cost per
submission (its attempt's time minus the evaluation's own, summary.json's timing.evaluation_s:
starting the work-horse, the evaluator and the agent, writing the report). Checked: every
submission finished once (one attempt, one delivery) with the same score.

    python scripts/bench_farm.py [--submissions N] [--workers 1,2] [--quick] [--json FILE] [--keep]

Exit status: 0 checks pass, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness import BenchSession, machine_info, machine_line, write_json

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
SEEDED_AGENT = REPO / "tests" / "support" / "seeded_agent_main.py"


def competition_file(folder: Path, tests: Path) -> Path:
    path = folder / "bench-farm.toml"
    path.write_text(
        f'format = "flatland"\nscoring = "neurips2020"\ntests = "{tests}"\n'
        "[budgets]\nplanning_s = 10\nstep_s = 5\noverall_s = 300\nidle_s = 30\n",
        encoding="utf-8",
    )
    return path


def agent_command(step_delay_s: float) -> list[str]:
    command = f'exec {sys.executable} {SEEDED_AGENT} "$ARBITER_REDIS_URL" "$AICROWD_SUBMISSION_ID"'
    return ["sh", "-c", command + (f" --step-delay {step_delay_s}" if step_delay_s else "")]


def one_farm(session: BenchSession, redis_url: str, competition: Path, workers: int, args: Any) -> dict[str, Any]:
    """Queue the submissions, let ``workers`` burst workers evaluate them all; the figures."""
    from arbiter.server.hosting.farm import submit
    from arbiter.server.hosting.submissions import SubmissionStore

    session.conn.flushdb()
    submitted = [
        submit(session.conn, competition=str(competition), participant=f"p{index % 4}",
               agent=agent_command(args.step_delay)).id
        for index in range(args.submissions)
    ]  # fmt: skip
    results_root = session.workdir / f"results-{workers}"
    argv = [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_url,
            "--results-root", str(results_root), "--burst"]  # fmt: skip
    started = time.monotonic()
    procs = [session.procs.start(f"worker{workers}-{index}", argv) for index in range(workers)]
    session.procs.wait(procs, timeout_s=args.timeout)
    wall = time.monotonic() - started
    records = [SubmissionStore(session.conn).get(one) for one in submitted]
    costs = []
    for record in records:
        if record.results and record.started_at and record.finished_at:
            summary = json.loads((Path(record.results) / "summary.json").read_text(encoding="utf-8"))
            costs.append(record.finished_at - record.started_at - summary["timing"]["evaluation_s"])
    first_start = min(r.started_at for r in records if r.started_at)
    last_end = max(r.finished_at for r in records if r.finished_at)
    waits = [r.started_at - r.submitted_at for r in records if r.started_at]
    return {
        "workers": workers,
        "submissions": len(records),
        "wall_s": wall,
        "per_minute": 60.0 * len(records) / (last_end - first_start),
        "queue_wait_s": {"median": statistics.median(waits), "max": max(waits)},
        "farm_cost_s": {"median": statistics.median(costs), "max": max(costs)} if costs else None,
        "states": sorted({r.state for r in records}),
        "attempts": sorted({r.attempts for r in records}),
        "deliveries": sorted({r.deliveries for r in records}),
        "scores": sorted({r.score for r in records if r.score is not None}),
    }


def checks(farms: list[dict[str, Any]]) -> list[str]:
    problems = []
    scores = {score for farm in farms for score in farm["scores"]}
    for farm in farms:
        label = f"{farm['workers']} worker(s)"
        if farm["states"] != ["finished"]:
            problems.append(f"{label}: states {farm['states']}, not all finished")
        if farm["attempts"] != [1] or farm["deliveries"] != [1]:
            problems.append(f"{label}: attempts {farm['attempts']}, deliveries {farm['deliveries']}: not once each")
    if len(scores) != 1:
        problems.append(f"the same agent scored {sorted(scores)}")
    return problems


def run(args: argparse.Namespace) -> int:
    from arbiter.server.formats.flatland.generate import generate_test_set

    counts = [int(part) for part in args.workers.split(",") if part.strip()]
    machine = machine_info("rq", "redis")
    with BenchSession("arbiter-bench-farm-", script=SCRIPT, keep=args.keep) as session:
        redis_url = session.start_redis(tcp=True)
        tests = session.workdir / "tests"
        generate_test_set(tests, preset="tiny", seed=1)
        competition = competition_file(session.workdir, tests)
        farms = [one_farm(session, redis_url, competition, workers, args) for workers in counts]
    if session.failed():
        return 2
    problems = checks(farms)
    base = farms[0]["per_minute"]
    heading = f"farm of burst workers, {args.submissions} submissions of the tiny Flatland set each"
    print(f"{heading}; {machine_line(machine)}")
    print("workers  per minute  speed-up  queue wait median/max (s)  farm cost median/max (s)")
    for farm in farms:
        cost = farm["farm_cost_s"] or {"median": float("nan"), "max": float("nan")}
        print(f"{farm['workers']:>7}  {farm['per_minute']:>10.1f}  {farm['per_minute'] / base:>8.2f}  "
              f"{farm['queue_wait_s']['median']:>12.2f} / {farm['queue_wait_s']['max']:<10.2f}  "
              f"{cost['median']:>10.2f} / {cost['max']:.2f}")  # fmt: skip
    print("checks: " + ("every submission finished once, with the same score" if not problems else "; ".join(problems)))
    write_json(args.json, {"machine": machine, "farms": farms, "problems": problems})
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=12, help="submissions per farm (default 12)")
    parser.add_argument("--workers", default="1,2", help="worker counts to measure, comma-separated (default 1,2)")
    parser.add_argument("--step-delay", type=float, default=0.0, help="the agent's delay per step, in seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="per farm, in seconds (default 600)")
    parser.add_argument("--quick", action="store_true", help="4 submissions, 1 and 2 workers")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    args = parser.parse_args()
    if args.quick:
        args.submissions, args.workers = 4, "1,2"
    if args.submissions < 1:
        print("bench: --submissions must be at least 1", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
