"""The two-phase scores (docs/formats/two-phase.md), from the records of ``episodes.jsonl`` alone.

- ``phase1``: mean return of phase 1's episodes (higher is better);
- per run: converged at the step the criterion gives over its training episodes that ended (the
  env ended them, or the agent did with a reset mid-episode: ``convergence.counts_for_convergence``),
  else penalized (``penalty_factor × max_steps``); ``eval_return``: mean of its evaluation episodes;
- ``convergence``: mean over runs (lower is better); ``eval``: mean of the runs' eval returns.

Primary and secondary follow the phases that ran: phase 1 alone → phase1; phase 2 alone →
convergence, then eval; both → phase1, then convergence.

Leaderboard figures: ``phase1``, ``convergence`` (lower is better) and ``eval``, those that ran.

The running figure (``primary``, shown after every item as the score so far) is the figure of
the phase being played: phase 1's mean return while phase 1 runs, then the mean convergence step
of the runs trained so far once phase 2 has begun (phase 1's figure is final by then, and would
say nothing of the training runs the lines beside it describe).
"""

from __future__ import annotations

import statistics
from typing import Any

from arbiter.server.core.scoring import spread
from arbiter.server.formats.base import Rule
from arbiter.server.formats.two_phase.convergence import convergence_step, counts_for_convergence
from arbiter.server.formats.two_phase.options import TwoPhaseOptions

FIGURES = {
    "phase1": ("phase 1 mean return", True),
    "convergence": ("mean convergence step", False),
    "eval": ("mean evaluation return after training", True),
}
FIGURE_SPECS = {"phase1": ".2f", "convergence": ".1f", "eval": ".2f"}  # how a leaderboard shows them


def interquartile_mean(values: list[float]) -> float | None:
    """Mean of the middle half (25 % cut from each end, fractional weights at the cuts)."""
    if not values:
        return None
    ordered = sorted(values)
    n = len(ordered)
    low, high = n / 4, 3 * n / 4
    total = 0.0
    for i, value in enumerate(ordered):
        weight = max(0.0, min(i + 1, high) - max(i, low))
        total += weight * value
    return total / (high - low)


class TwoPhaseRule(Rule):
    name = "two-phase"
    figure_names = ("phase1", "convergence", "eval")
    described = {name: (title, higher, FIGURE_SPECS[name]) for name, (title, higher) in FIGURES.items()}
    context_names = ("env",)
    options: TwoPhaseOptions

    def context(self, records: list[dict[str, Any]], score: dict[str, Any]) -> dict[str, Any]:
        """The env the agents were evaluated on (an achievement may ask for one)."""
        return {"env": self.options.env_id}

    def runs(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        p2 = self.options.phase2
        by_run: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for record in records:
            if record.get("phase") == 2:
                stages = by_run.setdefault(record["run"], {"train": [], "eval": []})
                stages[record["stage"]].append(record)
        runs = []
        for run in sorted(by_run):
            train, evals = by_run[run]["train"], by_run[run]["eval"]
            ended = [(r["return"], r["total_steps"]) for r in train if counts_for_convergence(r)]
            step = convergence_step(ended, p2.goal_reward, p2.stability_window, p2.criterion)
            eval_returns = [r["return"] for r in evals]
            runs.append(
                {
                    "run": run,
                    "converged": step is not None,
                    "convergence_step": step,
                    "penalized": step is None,
                    "score": float(step) if step is not None else p2.penalty,
                    "train_episodes": len(train),
                    "total_steps": max((r.get("total_steps", 0) for r in train), default=0),
                    "eval_return": statistics.fmean(eval_returns) if eval_returns else None,
                    "eval_returns": eval_returns,
                }
            )
        return runs

    def _figures(self, records: list[dict[str, Any]]) -> tuple[dict[str, Any], list[float], list[dict[str, Any]]]:
        phase1 = [r["return"] for r in records if r.get("phase") == 1]
        runs = self.runs(records)
        evals = [r["eval_return"] for r in runs if r["eval_return"] is not None]
        figures = {
            "phase1": statistics.fmean(phase1) if phase1 else None,
            "convergence": statistics.fmean(r["score"] for r in runs) if runs else None,
            "eval": statistics.fmean(evals) if evals else None,
        }
        return figures, phase1, runs

    def _order(self, figures: dict[str, Any]) -> list[str]:
        present = [name for name in ("phase1", "convergence", "eval") if figures[name] is not None]
        return present[:2]

    def primary(self, records: list[dict[str, Any]]) -> float | None:
        """The score so far: the leading figure of the phase being played (see the module's
        docstring); once phase 2 has begun, its runs' mean convergence step."""
        if any(r.get("phase") == 2 for r in records):
            runs = self.runs(records)
            return statistics.fmean(r["score"] for r in runs)
        phase1 = [r["return"] for r in records if r.get("phase") == 1]
        return statistics.fmean(phase1) if phase1 else None

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        figures, phase1, runs = self._figures(records)
        order = self._order(figures)
        primary = order[0] if order else None
        secondary = order[1] if len(order) > 1 else None
        run_scores = [r["score"] for r in runs]
        run_evals = [r["eval_return"] for r in runs if r["eval_return"] is not None]
        spreads = {
            "phase1": spread(phase1) if phase1 else None,
            "convergence": {**spread(run_scores), "iqm": interquartile_mean(run_scores)} if runs else None,
            "eval": {**spread(run_evals), "iqm": interquartile_mean(run_evals)} if run_evals else None,
        }
        return {
            "primary": figures[primary] if primary else None,
            "secondary": figures[secondary] if secondary else None,
            "primary_name": FIGURES[primary][0] if primary else None,
            "secondary_name": FIGURES[secondary][0] if secondary else None,
            "primary_higher_is_better": FIGURES[primary][1] if primary else None,
            **figures,
            "spread": {
                "primary": spreads[primary] if primary else None,
                "secondary": spreads[secondary] if secondary else None,
                **spreads,
            },
            "runs": runs,
            "rule": {
                "goal_reward": self.options.phase2.goal_reward,
                "stability_window": self.options.phase2.stability_window,
                "criterion": self.options.phase2.criterion,
                "max_steps": self.options.phase2.max_steps,
                "penalty": self.options.phase2.penalty,
            },
        }

    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        spreads = score.get("spread") or {}
        return [self.figure_of(name, score[name], spreads.get(name)) for name in FIGURES if score.get(name) is not None]
