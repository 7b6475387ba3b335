"""MetaLC scores (docs/formats/metalc.md), from per-dataset records alone.

For one dataset with steps i (end time t_i, credited score s_i) and budget T:
    b_i = max(b_{i-1}, s_i), b_{-1} = 0;  t~_i = ln(1 + t_i/60) / ln(1 + T/60)
    ALC = sum_i (b_i - b_{i-1}) (1 - t~_i);   final score = s_last
Development: one run; its averages over all datasets, unrounded. Final: each dataset's ALC and
final score rounded to 2 decimals, each run's averages the rounded mean of those, and the run
reported is the one with the lowest average ALC (the first of equals). A dataset that timed out,
never finished or credited a time its curve lacks scores 0 for both.

Exactness: every operation is the challenge scorer's own, in its order: numpy's log and numpy's
rounding (``round`` on a numpy float rounds by scaling, unlike Python's correctly rounded
``round``), and sums accumulated left to right in dataset string order (Python 3.12's ``sum`` of
floats compensates; the challenge's Python did not).

Leaderboard figures: ``alc`` (the average ALC) and ``final_score`` (the average final score) of
the run reported; the phase describes the evaluation beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from arbiter.server.core.scoring import spread
from arbiter.server.formats.base import Rule

T0_S = 60.0  # the time scale of the log normalization: how much early performance counts


def normalized_time(time: float, time_budget: int) -> float:
    return float(np.log(1 + time / T0_S) / np.log(1 + time_budget / T0_S))


def round2(value: float) -> float:
    """numpy's 2-decimal rounding (the challenge rounds numpy floats): ``np.around(value,
    decimals=2)`` computes ``rint(value * 100) / 100`` in float64, and so does this, without
    numpy's cost per call (it runs once a step). ``round`` of a float rounds half to even, as
    ``rint`` does; a zero keeps the sign numpy gives it; what is not finite goes to numpy."""
    scaled = float(value) * 100.0
    if not math.isfinite(scaled):
        with np.errstate(over="ignore"):  # numpy's answer for a value that overflows when scaled: itself
            return float(np.around(np.float64(value), decimals=2))
    rounded = round(scaled) / 100.0
    return rounded if rounded else math.copysign(0.0, scaled)


def alc(times: list[float], scores: list[float], time_budget: int) -> float:
    """Area under the agent's best-so-far curve on log-normalized time."""
    area = 0.0
    best = previous = 0.0
    for time, score in zip(times, scores, strict=True):
        best = max(best, score)
        area += (best - previous) * (1 - normalized_time(time, time_budget))
        previous = best
    return area


def dataset_figures(
    times: list[float], scores: list[float | None], time_budget: int, phase: str, *, finished: bool
) -> tuple[float, float, str | None]:
    """``(alc, final_score, zero_because)`` of one dataset in one phase; ``zero_because`` says why
    it scores 0 (None when it scores its curve)."""
    zero_because = None
    if not finished:
        zero_because = "not finished"
    elif not times:
        zero_because = "no steps"
    elif any(s is None for s in scores):
        zero_because = "credited a time missing from the algorithm's validation curve"
    if zero_because:
        return 0.0, 0.0, zero_because
    area, final = alc(times, scores, time_budget), scores[-1]  # type: ignore[arg-type]
    if phase == "final":
        return round2(area), round2(final), None  # type: ignore[arg-type]
    return area, final, None  # type: ignore[return-value]


def record_figures(record: dict[str, Any]) -> tuple[float, float, str | None]:
    """A record's figures recomputed from its scored curve (what the record says, or a mismatch)."""
    finished = bool(record.get("finished")) and not record.get("timed_out")
    return dataset_figures(record["times"], record["scores"], record["time_budget"], record["phase"], finished=finished)


def _left_sum(values: list[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


@dataclass(frozen=True)
class RunScore:
    run: int
    average_alc: float
    average_final_score: float
    per_dataset: dict[str, dict[str, float]]  # dataset → {"alc", "final_score"}


def run_scores(records: list[dict[str, Any]], phase: str, datasets: list[str] | None = None) -> list[RunScore]:
    """Each run's averages over ``datasets`` (default: every dataset of the records) in string
    order; a dataset without a record in a run counts 0."""
    names = sorted(set(datasets) if datasets is not None else {r["dataset"] for r in records})
    runs = sorted({r["run"] for r in records if r.get("phase", phase) == phase}) or [0]
    found = []
    for run in runs:
        by_dataset = {r["dataset"]: r for r in records if r["run"] == run and r.get("phase", phase) == phase}
        per_dataset = {}
        for name in names:
            record = by_dataset.get(name)
            area, final, _ = record_figures(record) if record else (0.0, 0.0, "not played")
            per_dataset[name] = {"alc": area, "final_score": final}
        total_alc = _left_sum([per_dataset[n]["alc"] for n in names])
        total_final = _left_sum([per_dataset[n]["final_score"] for n in names])
        average_alc, average_final = (total_alc / len(names), total_final / len(names)) if names else (0.0, 0.0)
        if phase == "final":
            average_alc, average_final = round2(average_alc), round2(average_final)
        found.append(RunScore(run, average_alc, average_final, per_dataset))
    return found


@dataclass(frozen=True)
class PhaseScore:
    phase: str
    average_alc: float
    average_final_score: float
    reported_run: int  # final: the worst run (lowest average ALC, first of equals); dev: its only run
    runs: list[RunScore]

    def leaderboard_key(self) -> tuple[float, float]:
        """Rank by average ALC, then average final score, both descending (sort this key reversed)."""
        return (self.average_alc, self.average_final_score)


def phase_score(records: list[dict[str, Any]], phase: str, datasets: list[str] | None = None) -> PhaseScore:
    runs = run_scores(records, phase, datasets)
    worst = min(range(len(runs)), key=lambda i: runs[i].average_alc)  # min keeps the first of equals
    chosen = runs[worst]
    return PhaseScore(phase, chosen.average_alc, chosen.average_final_score, chosen.run, runs)


class AlcRule(Rule):
    """The rule the format registers: average ALC (primary), then average final score. Made
    with the format's options, or with none and a ``phase`` (a results folder rescored)."""

    name = "alc"
    figure_names = ("alc", "final_score")
    described = {"alc": ("average ALC", True, ".4f"), "final_score": ("average final score", True, ".4f")}
    context_names = ("phase",)

    def __init__(self, options: Any = None, *, phase: str = "dev", datasets: list[str] | None = None):
        super().__init__(options)
        self.phase = options.phase if options is not None else phase
        self.datasets = datasets

    def primary(self, records: list[dict[str, Any]]) -> float | None:
        """The running figure shown after each dataset: the worst run's mean of the ALCs its
        records hold (the full recomputation, from the curves, is ``aggregate``'s, at the end;
        redoing it after every dataset would cost the square of their number)."""
        by_run: dict[Any, list[float]] = {}
        for record in records:
            by_run.setdefault(record.get("run"), []).append(float(record.get("alc") or 0.0))
        return min(math.fsum(alcs) / len(alcs) for alcs in by_run.values()) if by_run else None

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        if not records:
            return {"primary": None, "secondary": None, "primary_name": "average ALC", "runs": []}
        score = phase_score(records, self.phase, self.datasets)
        reported = score.runs[[r.run for r in score.runs].index(score.reported_run)]
        alcs = [v["alc"] for v in reported.per_dataset.values()]
        finals = [v["final_score"] for v in reported.per_dataset.values()]
        return {
            "primary": score.average_alc,
            "secondary": score.average_final_score,
            "primary_name": "average ALC",
            "secondary_name": "average final score",
            "primary_higher_is_better": True,
            "phase": self.phase,
            "reported_run": score.reported_run,
            "runs": [
                {"run": r.run, "average_alc": r.average_alc, "average_final_score": r.average_final_score}
                for r in score.runs
            ],
            "per_dataset": reported.per_dataset,
            "spread": {"primary": spread(alcs), "secondary": spread(finals)},
            "rule": {"t0_s": T0_S, "phase": self.phase, "rounding": 2 if self.phase == "final" else None},
        }

    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        spreads = score.get("spread") or {}
        return [
            self.figure_of("alc", score["primary"], spreads.get("primary")),
            self.figure_of("final_score", score.get("secondary"), spreads.get("secondary")),
        ]

    def context(self, records: list[dict[str, Any]], score: dict[str, Any]) -> dict[str, Any]:
        return {"phase": score.get("phase", self.phase)}
