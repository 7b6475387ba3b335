"""The two-phase format's report sections: phase 1's returns, and per training run its learning
curve (episode return against env steps, the goal, the convergence point) and its evaluation
returns."""

from __future__ import annotations

from html import escape
from typing import Any

from arbiter.protocol.errors import ConfigError

from ...report_charts import fmt_score, number, section, status
from ...svg import Plot, Series, linear_axis, xy_chart
from ..base import options_from_dict
from .options import TwoPhaseOptions
from .scoring import TwoPhaseRule


def _fmt(value: float) -> str:
    return f"{value:g}"


def _returns_chart(name: str, title: str, records: list[dict[str, Any]]) -> str:
    values = [number(r.get("return")) or 0.0 for r in records]
    axis = linear_axis(values, lo=min(0.0, *values), hi=max(0.0, *values))
    plot = Plot(name, title=title, count=len(records), axis=axis, tick_format=_fmt,
                x_labels=[str(r.get("episode", i)) for i, r in enumerate(records)])  # fmt: skip
    for i, record in enumerate(records):
        seed = "" if record.get("seed") is None else f" (seed {record.get('seed')})"
        plot.bar(i, values[i], tip=f"episode {record.get('episode')}{seed}: {values[i]:g}", css=status(record))
    if values:
        mean = sum(values) / len(values)
        plot.rule(mean, label=f"mean {mean:g}", css="mean")
    return f"<figure><figcaption>{escape(title)}</figcaption>{plot.svg()}</figure>"


def _learning_curve(run: dict[str, Any], train: list[dict[str, Any]], goal: float | None, max_steps: int) -> str:
    points = [(float(r["total_steps"]), float(r["return"])) for r in train if r.get("steps")]
    returns = [y for _, y in points] or [0.0]
    lo = min(0.0, *returns, goal if goal is not None else 0.0)
    hi = max(*returns, goal if goal is not None else 0.0, 1.0)
    marks = []
    if run.get("converged"):
        step = float(run["convergence_step"])
        at = next((y for x, y in points if x == step), goal or 0.0)
        marks.append((step, at, f"converged at step {run['convergence_step']}", "converged"))
    title = f"Run {run['run']}: episode return against env steps"
    chart = xy_chart(
        f"learning-curve-{run['run']}",
        title=title,
        series=[Series("train", points, f"run {run['run']} training episodes")],
        x_axis=linear_axis([x for x, _ in points], lo=0.0, hi=float(max_steps)),
        y_axis=linear_axis(returns, lo=lo, hi=hi),
        x_format=lambda v: f"{v:,.0f}",
        y_format=_fmt,
        y_rules=[(goal, f"goal {goal:g}", "goal")] if goal is not None else [],
        points=marks,
    )
    return f"<figure><figcaption>{escape(title)}</figcaption>{chart}</figure>"


def _options(summary: dict[str, Any]) -> TwoPhaseOptions:
    try:
        return options_from_dict(TwoPhaseOptions, summary.get("options") or {}, "summary.json options")
    except ConfigError:
        return TwoPhaseOptions()


def _rule_of(summary: dict[str, Any]) -> dict[str, Any]:
    """An evaluation with no score (failed, interrupted) still has its rule: from its options."""
    p2 = _options(summary).phase2
    return {"goal_reward": p2.goal_reward, "stability_window": p2.stability_window, "criterion": p2.criterion,
            "max_steps": p2.max_steps, "penalty": p2.penalty}  # fmt: skip


def _runs_of(summary: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs as their records say, for an evaluation with no score."""
    return TwoPhaseRule(_options(summary)).runs(records)


def report_sections(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    score = summary.get("score") or {}
    rule = score.get("rule") or _rule_of(summary)
    html = ""
    phase1 = [r for r in records if r.get("phase") == 1]
    if phase1:
        html += section("Phase 1: returns", _returns_chart("phase1-returns", "Phase 1 return per episode", phase1))
    runs = score.get("runs") or _runs_of(summary, records)
    goal = number(rule.get("goal_reward"))
    max_steps = int(number(rule.get("max_steps")) or 1)
    rows = ""
    charts = ""
    for run in runs:
        train = [r for r in records if r.get("phase") == 2 and r.get("run") == run["run"] and r.get("stage") == "train"]
        evals = [r for r in records if r.get("phase") == 2 and r.get("run") == run["run"] and r.get("stage") == "eval"]
        charts += _learning_curve(run, train, goal, max_steps)
        if evals:
            charts += _returns_chart(f"eval-returns-{run['run']}", f"Run {run['run']}: evaluation returns", evals)
        rows += (
            f"<tr><td>{run['run']}</td><td>{'yes' if run.get('converged') else 'no'}</td>"
            f"<td>{escape(str(run.get('convergence_step') if run.get('converged') else '–'))}</td>"
            f"<td>{fmt_score(run.get('score'))}</td><td>{escape(str(run.get('train_episodes', len(train))))}</td>"
            f"<td>{fmt_score(run.get('eval_return'))}</td></tr>"
        )
    if runs:
        head = (
            "<tr><th>run</th><th>converged</th><th>step</th><th>scored</th><th>episodes</th><th>eval return</th></tr>"
        )
        table = f'<table class="numeric"><thead>{head}</thead><tbody>{rows}</tbody></table>'
        note = (
            f"Criterion {rule.get('criterion', '–')}: goal {rule.get('goal_reward', '–')}, window "
            f"{rule.get('stability_window', '–')}; a run that does not converge scores {rule.get('penalty', '–')}."
        )
        html += section("Phase 2: training runs", table + charts, note)
    return html
