"""What rebuilding a competition's board costs: ``arbiter leaderboard`` over N results folders
(default 1,000) of one Flatland competition, with the figures the evaluations recorded and
rescored from their records (``--from-records``), timed end to end as an organiser runs it.

The folders are real ones. A few agents (one always moving forward, the others random with
their own seeds) are evaluated by ``arbiter run`` under the NeurIPS 2020 rule on a test folder of
small levels generated for the benchmark (``--episodes`` of them: rescoring a folder costs in
proportion to its episodes; ten or more give a figure its 95 % interval). Each of the N
submissions is a copy of one of those folders, chosen at random, given an identity of its own in
summary.json's ``submission`` block (a participant among P, a submission id, a submission time);
nothing else is changed, so every figure on the board is one an evaluation computed, and the
ties between copies of one evaluation are placed by submission time, as ties are on a real board.
A few copies are marked debug, and a few INTERRUPTED (stopped by SIGTERM), as a farm has them.

Measured, each round (the paths in alternating order):

- ``arbiter leaderboard`` as a process of its own: its wall time from launch to exit (imports,
  reading every folder, ranking, writing leaderboard.json, .csv and .html, printing the table)
  and its peak resident memory (its ``ru_maxrss``, read by the bare interpreter that starts it);
- with the recorded figures (the board's rule is the evaluations' own: summary.json is read)
  and rescored (``--from-records``: every folder's episodes.jsonl is read and scored again, as
  under a changed rule);
- in this process: ``build_board`` alone on both paths, and ``render_page`` alone on the board;
- ``arbiter leaderboard --help``: what any run of the command pays to start (interpreter, imports).

Checked: each board counts the folders made, the debug and the interrupted ones, and ranks every
participant with a scored submission, each by its best one (the earliest of equals); each row's
figures are those of the evaluation its submission copied (recorded, or recomputed by ``arbiter
rescore``'s code); the command's leaderboard.json is the board built in this process.

    python scripts/bench_leaderboard.py [--submissions N] [--participants P] [--agents A] [--episodes E]
                                        [--rounds R] [--results-root DIR] [--json [FILE]] [--keep]

Exit status: 0 checks pass, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from figures import Threshold
from harness import BenchError, BenchSession, machine_info, machine_line, spread
from leaderboard_folders import COMPETITION, STOPPED, competition_file, evaluate_agents, make_submissions

SCRIPT = Path(__file__).resolve()
RESCORING = "--from-records"  # the board recomputes every figure from the records
TARGET_SUBMISSIONS = 1000  # the size the targets below are set for
# No peer rebuilds such a board: the targets are bounds of their own, each judged on its least
# favourable round (its slowest, its largest), for boards of TARGET_SUBMISSIONS submissions.
TARGETS = {
    "recorded": Threshold("recorded_wall_s", "board rebuilt with recorded figures in", "s", 10.0, at_least=False),
    "rescored": Threshold("rescored_wall_s", f"board rebuilt rescored ({RESCORING}) in", "s", 60.0, at_least=False),
    "memory": Threshold("peak_rss_mb", "arbiter leaderboard's peak memory", "MB", 500.0, at_least=False),
}
# The measured command's launcher: a bare interpreter (a few MB) that runs it and writes its wall
# time, exit status and peak resident memory (KiB on Linux) to the file named first.
TIMED = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
status = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL).returncode
wall = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(sys.argv[1], "w") as handle:
    json.dump({"wall_s": wall, "status": status, "peak_rss_kib": peak}, handle)
"""


def timed_command(argv: list[str], log: Path) -> dict[str, Any]:
    """Run ``argv`` to its end from a bare interpreter (``TIMED``): its wall time, and its peak
    resident memory as the kernel counted it for that child. Started from this process instead, a
    child's count would start at this process's own size, which it holds until it runs the command."""
    figures = log.with_suffix(".json")
    with open(log, "wb") as output:
        done = subprocess.run([sys.executable, "-S", "-c", TIMED, str(figures), *argv], stdin=subprocess.DEVNULL,
                              stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
    measured = json.loads(figures.read_text(encoding="utf-8")) if figures.is_file() else {}
    if done.returncode != 0 or measured.get("status") != 0:
        raise BenchError(f"{' '.join(argv[2:5])} exited with status {measured.get('status', done.returncode)}:\n"
                         f"{log.read_text(encoding='utf-8', errors='replace')[-3000:]}")  # fmt: skip
    return {"wall_s": measured["wall_s"], "peak_rss_mb": measured["peak_rss_kib"] / 1024}


def leaderboard_argv(root: Path, competition: Path, out: Path, rescored: bool) -> list[str]:
    from_records = [RESCORING] if rescored else []
    return [sys.executable, "-m", "arbiter.server.cli", "leaderboard", "--results-root", str(root),
            "--competition", str(competition), *from_records, "--out", str(out)]  # fmt: skip


def measure(session: BenchSession, root: Path, competition: Path, rounds: int, say: Any) -> dict[str, Any]:
    """``rounds`` rounds of every path; each path's runs, and the last boards built."""
    from arbiter.server.core.competition import load_competition
    from arbiter.server.leaderboard.board import build_board
    from arbiter.server.leaderboard.page import render_page

    spec = load_competition(str(competition))
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in ROW_LABELS}
    boards: dict[str, Any] = {}
    for round_ in range(1, rounds + 1):
        for path in ("recorded", "rescored") if round_ % 2 else ("rescored", "recorded"):
            out = session.workdir / "boards" / f"{path}-r{round_}"
            run = timed_command(leaderboard_argv(root, competition, out, path == "rescored"),
                                session.workdir / f"leaderboard-{path}-r{round_}.log")  # fmt: skip
            runs[f"cli_{path}"].append(run)
            boards[f"cli_{path}"] = json.loads((out / "leaderboard.json").read_text(encoding="utf-8"))
            started = time.perf_counter()
            boards[path] = build_board(spec, str(root), from_records=path == "rescored")
            runs[f"build_{path}"].append({"wall_s": time.perf_counter() - started})
            alone = runs[f"build_{path}"][-1]["wall_s"]
            say(f"bench: round {round_} {path:<8}: arbiter leaderboard {run['wall_s']:.3f} s, peak "
                f"{run['peak_rss_mb']:.1f} MB; build_board alone {alone:.3f} s")  # fmt: skip
        floor = [sys.executable, "-m", "arbiter.server.cli", "leaderboard", "--help"]
        runs["cli_floor"].append(timed_command(floor, session.workdir / f"leaderboard-help-r{round_}.log"))
        started = time.perf_counter()
        page = render_page(boards["recorded"])
        runs["render_page"].append({"wall_s": time.perf_counter() - started, "bytes": len(page.encode("utf-8"))})
    return {"runs": runs, "boards": boards}


def checks(made: dict[str, Any], evaluations: list[Path], boards: dict[str, Any]) -> list[str]:
    """What the boards must say about the folders made (see the module's description)."""
    from arbiter.server.core.rescore import rescore

    recorded = [{f["name"]: f["value"] for f in json.loads((e / "summary.json").read_text())["leaderboard"]["figures"]}
                for e in evaluations]  # fmt: skip
    rescored = [rescore(str(e)).recomputed for e in evaluations]
    expected = {"recorded": [{"normalized_return": r["normalized_return"], "arrived_fraction": r["arrived_fraction"]}
                             for r in recorded],
                "rescored": [{"normalized_return": r["primary"], "arrived_fraction": r["secondary"]}
                             for r in rescored]}  # fmt: skip
    by_id = {s["id"]: s for s in made["submissions"]}
    per_participant: dict[str, int] = {}
    scored: dict[str, list[dict[str, Any]]] = {}  # participant → scored submissions, in submission order
    for submission in made["submissions"]:
        if not submission["debug"]:
            per_participant[submission["participant"]] = per_participant.get(submission["participant"], 0) + 1
            if not submission["interrupted"]:
                scored.setdefault(submission["participant"], []).append(submission)
    counts = {"folders": made["folders"], "ranked": made["ranked_participants"], "unranked": made["interrupted"],
              "debug_left_out": made["debug"], "other_phases": 0, "baselines": 0}  # fmt: skip
    problems = []
    for path in ("recorded", "rescored"):
        board = boards[path]
        if board["counts"] != counts:
            problems.append(f"{path}: the board counts {board['counts']}, the folders made {counts}")
        if {k: v for k, v in boards[f"cli_{path}"].items() if k != "generated_at"} != (
                {k: v for k, v in board.items() if k != "generated_at"}):  # fmt: skip
            problems.append(f"{path}: arbiter leaderboard's leaderboard.json is not the board built in this process")
        if any(e["state"] != "INTERRUPTED" or e["cause"] != f"the evaluation ended INTERRUPTED: {STOPPED}"
               for e in board["unranked"]):  # fmt: skip
            problems.append(f"{path}: an unranked submission is not one of the INTERRUPTED copies")
        for row in board["rows"]:
            made_as = by_id.get(row["submission"])
            if made_as is None or made_as["participant"] != row["participant"]:
                problems.append(f"{path}: row {row['rank']} ({row['participant']}, {row['submission']}) was not made")
                continue
            figures = {name: row["figures"][name]["value"] for name in expected[path][made_as["source"]]}
            # each participant's best submission (lexicographic: both figures higher is better), the
            # earliest of those that tie with it
            mine = [(tuple(expected[path][s["source"]].values()), s["id"]) for s in scored[row["participant"]]]
            best = max(key for key, _ in mine)
            if row["submission"] != next(sid for key, sid in mine if key == best):
                problems.append(f"{path}: row {row['rank']} shows {row['submission']}, not {row['participant']}'s "
                                "best submission (the earliest of its ties)")  # fmt: skip
            if figures != expected[path][made_as["source"]] or row["rescored"] != (path == "rescored"):
                problems.append(f"{path}: row {row['rank']}'s figures {figures} (rescored {row['rescored']}) are "
                                f"not those of agent {made_as['source']}'s evaluation")  # fmt: skip
            if row["submissions"] != per_participant[row["participant"]]:
                problems.append(f"{path}: row {row['rank']} counts {row['submissions']} submissions of "
                                f"{row['participant']}, {per_participant[row['participant']]} were made")  # fmt: skip
    return problems


def figures_of(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path, measured in runs.items():
        walls = [r["wall_s"] for r in measured]
        found[path] = {"wall_s": {**spread(walls), "per_round": walls}}
        if "peak_rss_mb" in measured[0]:
            found[path]["peak_rss_mb"] = {**spread(r["peak_rss_mb"] for r in measured),
                                          "per_round": [r["peak_rss_mb"] for r in measured]}  # fmt: skip
    return found


def target_lines(figures: dict[str, Any], submissions: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Each target judged on its least favourable round; its report and its printed line."""
    size = f"{TARGET_SUBMISSIONS:,} submissions"
    where = "" if submissions == TARGET_SUBMISSIONS else f" (measured at {submissions:,})"
    judged = [
        (TARGETS["recorded"], figures["cli_recorded"]["wall_s"]["per_round"], "slowest round", "rounds"),
        (TARGETS["rescored"], figures["cli_rescored"]["wall_s"]["per_round"], "slowest round", "rounds"),
        (TARGETS["memory"], figures["cli_recorded"]["peak_rss_mb"]["per_round"]
         + figures["cli_rescored"]["peak_rss_mb"]["per_round"], "largest", "recorded then rescored"),
    ]  # fmt: skip
    reports, lines = [], []
    for target, values, worst, each in judged:
        reports.append(target.report(values))
        verdict = "met" if target.met(values) else "NOT met"
        lines.append(f"target {target.what} < {target.bound:g} {target.unit} at {size}{where}: "
                     f"{verdict} ({worst} {target.judged(values):.2f} {target.unit}; {each} "
                     f"{', '.join(f'{v:.2f}' for v in values)})")  # fmt: skip
    return reports, lines


def board_figures(board: dict[str, Any]) -> dict[str, Any]:
    rows = board["rows"]
    return {"counts": board["counts"], "placed_by_time": sum(1 for row in rows if row["tie_broken_by_time"]),
            "not_separable": sum(1 for row in rows if row["not_separable_from"])}  # fmt: skip


ROW_LABELS = {
    "cli_recorded": "arbiter leaderboard, recorded figures",
    "cli_rescored": f"arbiter leaderboard, rescored ({RESCORING})",
    "build_recorded": "build_board alone, recorded figures",
    "build_rescored": f"build_board alone, rescored ({RESCORING})",
    "render_page": "render_page alone",
    "cli_floor": "arbiter leaderboard --help (start, imports)",
}


def print_report(report: dict[str, Any]) -> None:
    made, config = report["made"], report["config"]
    print(f"arbiter leaderboard over {made['folders']:,} results folders of one Flatland competition: "
          f"{made['participants']:,} participants, {made['debug']} debug and {made['interrupted']} INTERRUPTED "
          f"submissions, copies of {config['agents']} real evaluations of {config['episodes']} episodes "
          f"({report['folder_bytes'] / 1e6:.1f} MB on disk); {config['rounds']} round(s); "
          f"{machine_line(report['machine'])}")  # fmt: skip
    print(f"{'':<44}{'median s':>9}{'min':>9}{'max':>9}   peak RSS MB median (min-max)")
    for path, label in ROW_LABELS.items():
        wall, rss = report["figures"][path]["wall_s"], report["figures"][path].get("peak_rss_mb")
        memory = f"   {rss['median']:>8.1f} ({rss['min']:.1f}-{rss['max']:.1f})" if rss else ""
        print(f"{label:<44}{wall['median']:>9.3f}{wall['min']:>9.3f}{wall['max']:>9.3f}{memory}")
    for path, board in report["boards"].items():
        counts = board["counts"]
        print(f"board {path}: {counts['ranked']} ranked ({board['placed_by_time']} tied and placed by submission "
              f"time, {board['not_separable']} not separable from a neighbour), {counts['unranked']} not ranked, "
              f"{counts['debug_left_out']} debug left out, of {counts['folders']} folders")  # fmt: skip
    print(f"the page: {report['page_bytes'] / 1e3:.0f} kB")
    for line in report["target_lines"]:
        print(line)
    passed = ("the boards count the folders made and show their evaluations' figures; the command's "
              "leaderboard.json is the board built in process")  # fmt: skip
    print("checks: " + ("; ".join(report["problems"]) or passed))


def run(args: argparse.Namespace) -> int:
    from arbiter.server.formats.flatland.generate import generate_test_set

    to_stdout = args.json == "-"

    def say(line: str) -> None:
        print(line, file=sys.stderr if to_stdout else sys.stdout, flush=True)

    machine = machine_info()
    with BenchSession("arbiter-bench-leaderboard-", script=SCRIPT, keep=args.keep) as session:
        redis_url = session.start_redis()
        tests = session.workdir / "tests"
        levels = [{"test": i // 10, "level": i % 10, "n_agents": 2, "dim": 25, "malfunction_interval": 250}
                  for i in range(args.episodes)]  # fmt: skip
        generate_test_set(tests, levels=levels, seed=1)
        competition = competition_file(session.workdir, tests)
        evaluations = evaluate_agents(session, redis_url, competition, args.agents, args.timeout)
        root = Path(args.results_root) if args.results_root else session.workdir / "results"
        made = make_submissions(evaluations, root, args.submissions, args.participants, args.seed)
        say(f"bench: {args.agents} evaluations copied into {args.submissions} results folders under {root}")
        measured = measure(session, root, competition, args.rounds, say)
        problems = checks(made, evaluations, measured["boards"])
        folder_bytes = sum(f.stat().st_size for f in (root / COMPETITION).rglob("*") if f.is_file())
    if session.failed():
        return 2
    figures = figures_of(measured["runs"])
    targets, lines = target_lines(figures, args.submissions)
    report = {
        "machine": machine,
        "config": {"submissions": args.submissions, "participants": args.participants, "agents": args.agents,
                   "episodes": len(levels), "rounds": args.rounds, "seed": args.seed, "rescoring": RESCORING},
        "made": {k: v for k, v in made.items() if k != "submissions"},
        "results_root": str(root),
        "results_kept": bool(args.results_root),
        "folder_bytes": folder_bytes,
        "figures": figures,
        "page_bytes": measured["runs"]["render_page"][-1]["bytes"],
        "boards": {path: board_figures(measured["boards"][path]) for path in ("recorded", "rescored")},
        "targets": targets,
        "target_lines": lines,
        "problems": problems,
    }  # fmt: skip
    if to_stdout:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=TARGET_SUBMISSIONS,
                        help=f"results folders on the board (default {TARGET_SUBMISSIONS})")  # fmt: skip
    parser.add_argument("--participants", type=int, help="participants they are shared among (default N/5)")
    parser.add_argument("--agents", type=int, default=4, help="real evaluations they are copies of (default 4)")
    parser.add_argument("--episodes", type=int, default=12, help="episodes each evaluation plays (default 12)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="chooses each copy's evaluation and marks (default 1)")
    parser.add_argument("--results-root", metavar="DIR", help="write the folders here and keep them (a new or "
                        "empty folder; default: in the work folder)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=300.0, help="per evaluation, in seconds (default 300)")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="print the figures as JSON instead of the table; --json FILE: write them there, "
                        "and print the table")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work folder (evaluations, boards, logs)")
    args = parser.parse_args()
    if args.participants is None:
        args.participants = max(1, args.submissions // 5)
    refusals = [
        (args.submissions < 10, "--submissions must be at least 10 (a board with debug and interrupted ones)"),
        (not 1 <= args.participants <= args.submissions, "--participants must be 1 to --submissions"),
        (args.agents < 1, "--agents must be at least 1"),
        (args.episodes < 1, "--episodes must be at least 1"),
        (args.rounds < 1, "--rounds must be at least 1"),
        (bool(args.results_root) and Path(args.results_root).exists()
         and (not Path(args.results_root).is_dir() or any(Path(args.results_root).iterdir())),
         f"--results-root {args.results_root} is not empty: give a new or empty folder"),
    ]  # fmt: skip
    for applies, why in refusals:
        if applies:
            print(f"bench: {why}", file=sys.stderr)
            return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
