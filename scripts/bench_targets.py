#!/usr/bin/env python3
"""Judge every speed target of arbiter's evaluation paths in one run, and print them in one table.

    python scripts/bench_targets.py [--rounds R] [--only NAMES] [--quick] [--json PATH]

Runs the benchmarks that compare a path of arbiter's with its peer, one after the other (never two
at once: they would share the CPUs they measure), each as its own command would:

  flatland    bench.py: arbiter against the direct loop, the lean loop and flatland-rl's own
              evaluator, with the floor under arbiter / lean (no protocol, memory, scale or
              contention checks)
  remote-env  bench_remote_env.py: RemoteEnv against AsyncVectorEnv(1) on CartPole, with its floor
  diambra     bench_diambra.py --shapes native: RemoteEnv against the env in process, native frames
  metalc      bench_metalc.py: arbiter's overhead per suggest and per dataset, and the ratio to the
              phase in process

Each benchmark's own output is shown as it runs. Then one table: every target the benchmarks
judged, its figure as judged (the median of the per-round ratios, or the least favourable round
where the target says "in every round" or is a figure of its own), the floor where the benchmark
measures one (its path with arbiter's packets and Redis commands and nothing of the evaluator:
no evaluator of that protocol can do better on that machine), and met or NOT met. A target that
its own floor misses is marked so. Below it, each benchmark's status and time and, where the kernel
counts it, the share of the CPUs' time the hypervisor took while it ran (steal, /proc/stat): on a
shared host, what tells a quiet run from a noisy one.

``--rounds R`` (default 3) is passed to every benchmark; ``--quick`` runs each in its smoke mode
instead (a few seconds each, for tests); ``--only`` takes a comma-separated list of the names
above; ``--json PATH`` writes the verdicts and every benchmark's own report.

Exit status: 0 when every benchmark ran and found its paths played the same thing; otherwise the
first nonzero status a benchmark returned (1 MISMATCH, 2 a run failed), or 2 when one wrote no
report.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import bench_diambra
import bench_metalc
import bench_remote_env
import bench_report
from harness import cpu_ticks, machine_info, machine_line, steal_share, write_json

SCRIPTS = Path(__file__).resolve().parent
FLATLAND_CHECKS_OFF = ["--no-protocol", "--no-memory", "--no-scale", "--no-contention"]


@dataclass(frozen=True)
class Verdict:
    """One target as a benchmark judged it."""

    benchmark: str
    target: str  # the target in words
    judged: float  # the figure it was judged on
    judged_on: str  # "median of rounds" or "least favourable round"
    unit: str  # "×" for a ratio to the peer, else the figure's unit
    met: bool
    floor: float | None = None  # the floor's own figure against the same peer, where the benchmark measures one
    floor_met: bool | None = None  # whether that floor itself meets the target


def ratio_verdict(benchmark: str, target: Any, report: dict[str, Any], where: str = "") -> Verdict:
    """A ``figures.Target``'s verdict from the dict its ``report`` made."""
    return Verdict(benchmark, target.label(where), report["judged"],
                   "least favourable round" if target.every_round else "median of rounds", "×",
                   report["met"])  # fmt: skip


def with_floor(verdict: Verdict, target: Any, floor: float | None) -> Verdict:
    if floor is None:
        return verdict
    return replace(verdict, floor=floor, floor_met=target.met(floor))


def flatland_verdicts(report: dict[str, Any]) -> list[Verdict]:
    verdicts = []
    for target, judged in zip(bench_report.TARGETS, report["targets"], strict=True):
        verdict = ratio_verdict("flatland", target, judged)
        if target.ratio == "arbiter_over_lean" and report.get("floor"):
            verdict = with_floor(verdict, target, report["floor"]["factor_median"])
        verdicts.append(verdict)
    return verdicts


def remote_env_verdicts(report: dict[str, Any]) -> list[Verdict]:
    target = bench_remote_env.TARGET
    verdict = ratio_verdict("remote-env", target, report["target"])
    return [with_floor(verdict, target, report["ratios"]["floor_over_async1"]["median"])]


def diambra_verdicts(report: dict[str, Any]) -> list[Verdict]:
    return [
        ratio_verdict("diambra", bench_diambra.TARGET, shape["target"], where=f" at {name}")
        for name, shape in report["shapes"].items()
    ]


def metalc_verdicts(report: dict[str, Any]) -> list[Verdict]:
    verdicts = [ratio_verdict("metalc", bench_metalc.TARGET, report["target"])]
    for threshold, judged in zip((bench_metalc.SUGGEST_TARGET, bench_metalc.DATASET_TARGET), report["thresholds"],
                                 strict=True):  # fmt: skip
        verdicts.append(Verdict("metalc", threshold.label(), judged["judged"], "least favourable round",
                                threshold.unit, judged["met"]))  # fmt: skip
    return verdicts


@dataclass(frozen=True)
class Benchmark:
    """One benchmark this script runs, and how the targets in its report become verdicts."""

    name: str  # what --only calls it
    script: str  # in scripts/
    options: list[str]  # besides --rounds and --json
    smoke: list[str]  # its smoke run's options (with --quick), in place of --rounds and ``options``
    verdicts: Callable[[dict[str, Any]], list[Verdict]]

    def argv(self, rounds: int, quick: bool, json_path: Path) -> list[str]:
        chosen = self.smoke if quick else ["--rounds", str(rounds), *self.options]
        return [sys.executable, str(SCRIPTS / self.script), *chosen, "--json", str(json_path)]


# bench_diambra.py has no smoke mode of its own: one short round is one.
DIAMBRA_SMOKE = ["--rounds", "1", "--steps", "200", "--warmup", "20"]
BENCHMARKS = (
    Benchmark(
        "flatland",
        "bench.py",
        ["--warmup", "1", *FLATLAND_CHECKS_OFF],
        ["--quick", *FLATLAND_CHECKS_OFF],
        verdicts=flatland_verdicts,
    ),
    Benchmark("remote-env", "bench_remote_env.py", ["--steps", "10000"], ["--quick"], verdicts=remote_env_verdicts),
    Benchmark(
        "diambra",
        "bench_diambra.py",
        ["--shapes", "native"],
        ["--shapes", "native", *DIAMBRA_SMOKE],
        verdicts=diambra_verdicts,
    ),
    Benchmark("metalc", "bench_metalc.py", [], ["--quick"], verdicts=metalc_verdicts),
)
NAMES = [benchmark.name for benchmark in BENCHMARKS]


def chosen_benchmarks(only: str | None) -> list[Benchmark]:
    if not only:
        return list(BENCHMARKS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise ValueError(f"--only takes names among {', '.join(NAMES)}; got {only!r}")
    return [benchmark for benchmark in BENCHMARKS if benchmark.name in names]


def run_one(benchmark: Benchmark, rounds: int, quick: bool, folder: Path) -> dict[str, Any]:
    """Run one benchmark, its output shown as it comes; what it returned and reported."""
    json_path = folder / f"{benchmark.name}.json"
    argv = benchmark.argv(rounds, quick, json_path)
    print(f"bench_targets: {benchmark.name}: {' '.join(argv[1:])}", flush=True)
    began, ticks = time.monotonic(), cpu_ticks()
    status = subprocess.run(argv, cwd=folder, check=False).returncode
    outcome: dict[str, Any] = {"argv": argv[1:], "status": status, "seconds": time.monotonic() - began,
                               "steal_share": steal_share(ticks)}  # fmt: skip
    if json_path.exists():
        outcome["report"] = json.loads(json_path.read_text(encoding="utf-8"))
    return outcome


def print_verdicts(
    verdicts: list[Verdict], outcomes: dict[str, dict[str, Any]], machine: dict[str, Any], json_path: str | None
) -> None:
    print()
    print(f"Speed targets — {machine_line(machine)}")
    width = max([len(v.target) for v in verdicts] + [len("target")])
    header = f"{'benchmark':<11} {'target':<{width}} {'figure':>9} {'judged on':<23} {'floor':>7}  verdict"
    print(header)
    print("-" * len(header))
    for v in verdicts:
        figure = f"{v.judged:.3f}" if v.unit == "×" else f"{v.judged:,.0f} {v.unit}"
        floor = "—" if v.floor is None else f"{v.floor:.3f}"
        verdict = "met" if v.met else "NOT met"
        if v.floor_met is False:
            verdict += " (its floor misses it too)"
        print(f"{v.benchmark:<11} {v.target:<{width}} {figure:>9} {v.judged_on:<23} {floor:>7}  {verdict}")
    print(
        "(floor: the path with arbiter's packets and Redis commands and nothing of the evaluator, as the same "
        "benchmark measured it, median of rounds)"
    )
    for name, outcome in outcomes.items():
        state = "checks passed" if outcome["status"] == 0 else f"exit status {outcome['status']}"
        written = "" if "report" in outcome else ", no report written"
        steal = outcome.get("steal_share")
        stolen = "" if steal is None else f", the hypervisor took {steal:.1%} of the CPUs' time (steal)"
        print(f"{name}: {state}{written}, {outcome['seconds']:.0f} s{stolen}")
    met = sum(v.met for v in verdicts)
    print(f"targets met: {met} of {len(verdicts)}")
    kept = f"in {json_path}, with the verdicts" if json_path else "not kept (--json PATH keeps them)"
    print(f"raw results of every benchmark: {kept}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of every benchmark (default 3)")
    parser.add_argument("--only", help=f"a comma-separated list among {', '.join(NAMES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="each benchmark in its smoke mode (for tests)")
    parser.add_argument("--json", metavar="PATH", help="write the verdicts and every benchmark's report here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        benchmarks = chosen_benchmarks(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    machine = machine_info()
    outcomes: dict[str, dict[str, Any]] = {}
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-targets-") as folder:
        for benchmark in benchmarks:
            outcome = outcomes[benchmark.name] = run_one(benchmark, args.rounds, args.quick, Path(folder))
            if "report" in outcome:
                verdicts += benchmark.verdicts(outcome["report"])
    print_verdicts(verdicts, outcomes, machine, args.json)
    write_json(args.json, {"machine": machine, "rounds": args.rounds, "quick": args.quick,
                           "verdicts": [asdict(v) for v in verdicts], "benchmarks": outcomes})  # fmt: skip
    # a benchmark that wrote no report failed, whatever it returned
    statuses = [outcome["status"] or ("report" not in outcome) * 2 for outcome in outcomes.values()]
    return next((status for status in statuses if status), 0)


if __name__ == "__main__":
    sys.exit(main())
