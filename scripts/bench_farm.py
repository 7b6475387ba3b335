"""The farm's cost: N debug submissions of the deterministic agent on Flatland's debug set (the
8 envs ``arbiter run`` evaluates by default), evaluated by 1, 2 ... burst ``arbiter worker``
processes on one private redis-server, side by side with the same agent on the same set run by
``arbiter run`` (the peer), at the same concurrency, on the same machine and Redis.

Definitions (every time is wall time, read on this machine's clock):

- a submission's farm time: its worker's cycle, from the moment its work-horse starts the
  attempt (the record's ``started_at``) to the moment the same worker's next attempt starts. It
  holds the evaluation and everything the farm adds to it: the work-horse's imports, building the
  evaluator, starting the agent, writing report.html, recording the result, then ending the
  work-horse, RQ's bookkeeping, taking the next job, forking its work-horse, counting the
  delivery and taking the submission's lock. A worker's last submission has no next start and
  is left out.
- the peer's time: an ``arbiter run --debug`` process from its launch to its exit: the
  interpreter's start and imports, building the evaluator, starting the agent, the evaluation
  and its results folder. Peers run as many at once as the farm has workers.
- the farm's cost: the median farm time over the median peer time, per round (a round is a
  batch of submissions and a batch of peers, run back to back, in alternating order). Both
  include the agent's process start and the same evaluation (the same agent, the same episodes).

Also reported: submissions per minute, the wait in the queue, where a farm cycle's time goes
outside the evaluation (summary.json's ``timing.evaluation_s``), and a profile of the work-horse's
own steps (imports, report.html). Checked: every submission finished once (one attempt, one
delivery), with the peer's score.

    python scripts/bench_farm.py [--submissions N] [--workers 1,2] [--rounds R] [--peers P]
                                 [--quick] [--json FILE] [--keep]

Exit status: 0 checks pass, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import BenchError, BenchSession, Target, machine_info, machine_line, spread, write_json

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
SEEDED_AGENT = REPO / "tests" / "support" / "seeded_agent_main.py"

TARGET = Target(ratio="farm_over_run", path="a farm submission", peer="arbiter run",
                measure="in wall time per debug evaluation", bound=1.02, at_least=False)  # fmt: skip

# What a work-horse does outside the evaluation, timed in a fresh process that has imported
# what an ``arbiter worker`` imports before it forks (its work-horses import the rest).
HORSE_PROFILE = """
import json, sys, time
import arbiter.server.hosting.worker, arbiter.server.cli.main
marks = {}
t = time.perf_counter(); import arbiter.server.cli.runner; marks["import_runner_s"] = time.perf_counter() - t
t = time.perf_counter(); import arbiter.server.report.page as page; marks["import_report_s"] = time.perf_counter() - t
t = time.perf_counter(); page.write_report(sys.argv[1]); marks["write_report_s"] = time.perf_counter() - t
print(json.dumps(marks))
"""
# The agent's start, which the farm and arbiter run both pay: an interpreter importing what the
# deterministic agent imports.
AGENT_IMPORTS = f"import sys; sys.path.insert(0, {str(SEEDED_AGENT.parent)!r}); import harness, arbiter.client"


def competition_file(folder: Path, tests: str) -> Path:
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


def evaluation_s(results: Path) -> float:
    return json.loads((results / "summary.json").read_text(encoding="utf-8"))["timing"]["evaluation_s"]


def phases(results: Path, began: float, ended: float) -> dict[str, float]:
    """Where one evaluation's time went, from its events.jsonl (Unix times, as the records'):
    ``began`` to the evaluator's ``started`` event (loading the competition, building the
    evaluator), then to the agent's first request (starting the agent: its interpreter, its
    imports, its set-up), the evaluation (the overall budget's clock, from the first request),
    then from the ``finished`` event to ``ended`` (stopping the agent; in the farm, report.html
    and the records)."""
    times = {}
    for line in (results / "events.jsonl").read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["event"] in ("started", "finished"):
            times.setdefault(event["event"], datetime.fromisoformat(event["time"]).timestamp())
    evaluated = evaluation_s(results)
    first_request = times["finished"] - evaluated
    return {"build_evaluator_s": times["started"] - began, "agent_start_s": first_request - times["started"],
            "evaluation_s": evaluated, "after_evaluation_s": ended - times["finished"]}  # fmt: skip


def farm_batch(session: BenchSession, redis_url: str, competition: Path, workers: int, count: int, label: str,
               args: Any, backend: tuple[str, ...] = (), env: dict[str, str] | None = None,
               image: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Queue ``count`` debug submissions, let ``workers`` burst workers evaluate them all; the
    figures. ``backend``: the workers' backend options (none: the local backend); ``env``: their
    environment's additions; ``image``: the submissions' image."""
    from arbiter.server.hosting.farm import submit
    from arbiter.server.hosting.submissions import SubmissionStore

    submitted = [
        submit(session.conn, competition=str(competition), participant=f"p{index % 4}", debug=True,
               agent=agent_command(args.step_delay), image=image).id
        for index in range(count)
    ]  # fmt: skip
    argv = [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_url,
            "--results-root", str(session.workdir / f"farm-{label}"), "--burst", *backend]  # fmt: skip
    procs = [session.procs.start(f"worker-{label}-{index}", argv, env=env) for index in range(workers)]
    session.procs.wait(procs, timeout_s=args.timeout)
    records = [SubmissionStore(session.conn).get(one) for one in submitted]
    ended = [r for r in records if r.started_at and r.finished_at and r.results]
    by_worker: dict[str, list[Any]] = {}
    for record in sorted(ended, key=lambda r: r.started_at):
        by_worker.setdefault(record.worker or "", []).append(record)
    cycles, parts = [], []
    for own in by_worker.values():
        for record, following in zip(own, own[1:], strict=False):
            cycles.append(following.started_at - record.started_at)
            # The next attempt's start: the work-horse's end, RQ's bookkeeping, the next job, its
            # work-horse's fork, its delivery counted, its lock taken.
            between = {"next_attempt_start_s": following.started_at - record.finished_at}
            parts.append({**phases(Path(record.results), record.started_at, record.finished_at), **between})
    if not cycles:
        raise BenchError(f"farm {label}: no worker evaluated two submissions; give more --submissions")
    span = max(r.finished_at for r in ended) - min(r.started_at for r in ended)
    return {
        "submissions": len(records),
        "span_s": span,
        "cycle_s": cycles,
        "phases": parts,
        "queue_wait_s": [r.started_at - r.submitted_at for r in ended],
        "states": sorted({r.state for r in records}),
        "attempts": sorted({r.attempts for r in records}),
        "deliveries": sorted({r.deliveries for r in records}),
        "scores": sorted({r.score for r in records if r.score is not None}),
        "example_results": ended[0].results if ended else None,
    }


def peer_batch(session: BenchSession, redis_url: str, competition: Path, concurrency: int, count: int, label: str,
               args: Any) -> dict[str, Any]:  # fmt: skip
    """``count`` ``arbiter run --debug`` processes, ``concurrency`` at a time; each one's wall time."""
    walls, parts, scores = [], [], set()
    for first in range(0, count, concurrency):
        running = []  # (process, launched at, results folder)
        for index in range(first, min(count, first + concurrency)):
            results = session.workdir / f"peer-{label}-{index}"
            argv = [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", str(competition), "--debug",
                    "--redis-url", redis_url, "--service-id", f"peer-{label}-{index}", "--results", str(results),
                    "--quiet", "--", *agent_command(args.step_delay)]  # fmt: skip
            running.append((session.procs.start(f"peer-{label}-{index}", argv), time.monotonic(), time.time(), results))
        deadline = time.monotonic() + args.timeout
        while running:
            for one in [one for one in running if one[0].popen.poll() is not None]:
                running.remove(one)
                proc, started, launched_at, results = one
                walls.append(time.monotonic() - started)
                if proc.popen.returncode != 0:
                    raise BenchError(f"{proc.name} exited with status {proc.popen.returncode}:\n{proc.tail()}")
                parts.append(phases(results, launched_at, time.time()))
                summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
                scores.add(summary["score"]["primary"])
            if running and time.monotonic() > deadline:
                raise BenchError(f"peer {label}: timed out after {args.timeout:g} s")
            time.sleep(0.005)
    return {"wall_s": walls, "phases": parts, "scores": sorted(scores)}


def measure(session: BenchSession, redis_url: str, competition: Path, workers: int, args: Any) -> dict[str, Any]:
    """``args.rounds`` rounds of a farm batch and a peer batch, in alternating order."""
    per_round = [args.submissions // args.rounds + (r < args.submissions % args.rounds) for r in range(args.rounds)]
    farms, peers = [], []
    for round_, count in enumerate(per_round, start=1):
        label = f"w{workers}-r{round_}"
        order = ("farm", "peer") if round_ % 2 else ("peer", "farm")
        for side in order:
            if side == "farm":
                farms.append(farm_batch(session, redis_url, competition, workers, count, label, args))
            else:
                peers.append(peer_batch(session, redis_url, competition, workers, args.peers, label, args))
        print(f"bench: {workers} worker(s), round {round_}: farm cycle median "
              f"{statistics.median(farms[-1]['cycle_s']):.3f} s, arbiter run median "
              f"{statistics.median(peers[-1]['wall_s']):.3f} s", flush=True)  # fmt: skip
    ratios = [statistics.median(farm["cycle_s"]) / statistics.median(peer["wall_s"])
              for farm, peer in zip(farms, peers, strict=True)]  # fmt: skip
    farm_phases = [part for farm in farms for part in farm["phases"]]
    peer_phases = [part for peer in peers for part in peer["phases"]]
    return {
        "workers": workers,
        "submissions": sum(f["submissions"] for f in farms),
        "per_minute": 60.0 * sum(f["submissions"] for f in farms) / sum(f["span_s"] for f in farms),
        "farm": {"cycle_s": spread(v for farm in farms for v in farm["cycle_s"]),
                 "queue_wait_s": spread(v for farm in farms for v in farm["queue_wait_s"]),
                 **{name: spread(part[name] for part in farm_phases) for name in farm_phases[0]}},
        "peer": {"wall_s": spread(v for peer in peers for v in peer["wall_s"]),
                 **{name: spread(part[name] for part in peer_phases) for name in peer_phases[0]}},
        "ratio": {**spread(ratios), "per_round": ratios},
        "states": sorted({s for f in farms for s in f["states"]}),
        "attempts": sorted({a for f in farms for a in f["attempts"]}),
        "deliveries": sorted({d for f in farms for d in f["deliveries"]}),
        "scores": sorted({s for f in farms for s in f["scores"]}),
        "peer_scores": sorted({s for p in peers for s in p["scores"]}),
        "example_results": farms[0]["example_results"],
    }  # fmt: skip


def horse_profile(results: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", HORSE_PROFILE, results], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BenchError(f"the work-horse profile failed:\n{done.stderr[-2000:]}")
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", AGENT_IMPORTS], check=True, timeout=120)
    return {**marks, "agent_interpreter_and_imports_s": time.perf_counter() - started}


def checks(farms: list[dict[str, Any]]) -> list[str]:
    problems = []
    scores = {score for farm in farms for score in farm["scores"] + farm["peer_scores"]}
    for farm in farms:
        label = f"{farm['workers']} worker(s)"
        if farm["states"] != ["finished"]:
            problems.append(f"{label}: states {farm['states']}, not all finished")
        if farm["attempts"] != [1] or farm["deliveries"] != [1]:
            problems.append(f"{label}: attempts {farm['attempts']}, deliveries {farm['deliveries']}: not once each")
    if len(scores) != 1:
        problems.append(f"the same agent scored {sorted(scores)} (farm and arbiter run)")
    return problems


PHASE_LABELS = {
    "build_evaluator_s": "start to evaluator built",
    "agent_start_s": "agent start to first request",
    "evaluation_s": "evaluation (summary's evaluation_s)",
    "after_evaluation_s": "evaluation's end to result",
    "next_attempt_start_s": "result to next attempt's start",
}


def print_report(farms: list[dict[str, Any]], profile: dict[str, float], heading: str) -> None:
    print(heading)
    print("workers  per minute  queue wait median/max  farm cycle  arbiter run  farm / run (median over rounds)")
    for farm in farms:
        cycle, wall, wait = farm["farm"]["cycle_s"], farm["peer"]["wall_s"], farm["farm"]["queue_wait_s"]
        print(f"{farm['workers']:>7}  {farm['per_minute']:>10.1f}  {wait['median']:>10.1f} / {wait['max']:<6.1f} s  "
              f"{cycle['median']:>8.3f} s  {wall['median']:>9.3f} s  {farm['ratio']['median']:.3f}")  # fmt: skip
    print("where the time goes, medians in s (farm: from the attempt's start; arbiter run: from its launch):")
    print(f"{'':<38}" + "".join(f"  farm ×{farm['workers']}  run ×{farm['workers']}" for farm in farms))
    for name, label in PHASE_LABELS.items():
        cells = "".join(f"  {farm['farm'][name]['median']:>7.3f}  {farm['peer'][name]['median']:>7.3f}"
                        if name in farm["peer"] else f"  {farm['farm'][name]['median']:>7.3f}  {'-':>7}"
                        for farm in farms)  # fmt: skip
        print(f"{label:<38}{cells}")
    print("work-horse steps, timed alone: " + ", ".join(f"{name} {value:.3f} s" for name, value in profile.items()))
    for farm in farms:
        print(TARGET.line(farm["ratio"], where=f", {farm['workers']} at a time"))


def run(args: argparse.Namespace) -> int:
    from arbiter.server.formats.flatland.generate import debug_test_set, generate_test_set

    counts = [int(part) for part in args.workers.split(",") if part.strip()]
    machine = machine_info("rq", "redis")
    with BenchSession("arbiter-bench-farm-", script=SCRIPT, keep=args.keep) as session:
        redis_url = session.start_redis(tcp=True)
        if args.tests == "debug":
            tests = debug_test_set()
        else:
            tests = str(session.workdir / "tests")
            generate_test_set(Path(tests), preset=args.tests, seed=1)
        competition = competition_file(session.workdir, tests)
        farms = [measure(session, redis_url, competition, workers, args) for workers in counts]
        profile = horse_profile(farms[0]["example_results"])
    if session.failed():
        return 2
    problems = checks(farms)
    heading = (f"farm of burst workers against arbiter run: {args.submissions} debug submissions per worker count "
               f"({args.rounds} rounds, {args.peers} arbiter runs a round), Flatland's {args.tests} set, "
               f"{session.transport}; {machine_line(machine)}")  # fmt: skip
    print_report(farms, profile, heading)
    print("checks: " + ("every submission finished once, with arbiter run's score" if not problems
                        else "; ".join(problems)))  # fmt: skip
    report = {"machine": machine, "tests": args.tests, "farms": farms, "profile": profile, "problems": problems,
              "targets": [{"workers": farm["workers"], **TARGET.report(farm["ratio"])} for farm in farms]}  # fmt: skip
    write_json(args.json, report)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=200, help="submissions per worker count (default 200)")
    parser.add_argument("--workers", default="1,2", help="worker counts to measure, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the submissions are split in (default 5)")
    parser.add_argument("--peers", type=int, default=6, help="arbiter run evaluations a round (default 6)")
    parser.add_argument("--tests", default="debug", help="the Flatland set: debug (the default) or a preset")
    parser.add_argument("--step-delay", type=float, default=0.0, help="the agent's delay per step, in seconds")
    parser.add_argument("--timeout", type=float, default=900.0, help="per batch, in seconds (default 900)")
    parser.add_argument("--quick", action="store_true", help="the tiny set: 4 submissions, 1 round, 2 peers")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    args = parser.parse_args()
    if args.quick:
        args.submissions, args.rounds, args.peers, args.tests = 4, 1, 2, "tiny"
    counts = [part.strip() for part in args.workers.split(",") if part.strip()]
    if not counts or not all(part.isdigit() and int(part) >= 1 for part in counts):
        print(f"bench: --workers {args.workers!r}: give worker counts, e.g. 1,2", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.peers < 1:
        print("bench: --rounds and --peers must be at least 1", file=sys.stderr)
        return 2
    if args.submissions < 2 * args.rounds * max(map(int, counts)):
        print("bench: --submissions must give each worker at least 2 a round (a cycle ends at the next start)",
              file=sys.stderr)  # fmt: skip
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
