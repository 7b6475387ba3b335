"""The two-phase format's report: its three figures at the top (phase 1's mean return, phase 2's
mean convergence step and mean evaluation return, each with the way that is better); then phase
1's returns, and per training run its learning curve (episode return against env steps, the goal,
the convergence point) and its evaluation returns."""

from __future__ import annotations

from html import escape
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import options_from_dict
from arbiter.server.formats.two_phase.options import TwoPhaseOptions
from arbiter.server.formats.two_phase.scoring import FIGURES, TwoPhaseRule
from arbiter.server.report.charts import HeadlineFigure, fmt_count, fmt_score, number, section, status
from arbiter.server.report.svg import Plot, Series, linear_axis, rounded_axis, xy_chart

# The score's figures in the order the page shows them: name, printed as whole steps, and what
# the page says when the figure has no value.
HEADLINE = (
    ("phase1", "phase 1 mean return", False, "phase 1 was not played in this evaluation"),
    ("convergence", "phase 2 mean convergence step", True, "phase 2 was not played in this evaluation"),
    ("eval", "phase 2 mean evaluation return", False, "no evaluation episode of phase 2 was played"),
)


def _fmt(value: float) -> str:
    return f"{value:g}"


def report_headline(summary: dict[str, Any]) -> list[HeadlineFigure]:
    """All three figures, the scored ones and those of a phase that was not played alike, so the
    top of every two-phase report reads the same."""
    score = summary.get("score") or {}
    spread = score.get("spread") or {}
    return [
        HeadlineFigure(
            number(score.get(key)),
            name,
            FIGURES[key][1],
            spread.get(key),
            whole=whole,
            primary=score.get("primary_name") == FIGURES[key][0],
            missing=missing,
        )
        for key, name, whole, missing in HEADLINE
    ]


def _returns_chart(name: str, title: str, records: list[dict[str, Any]]) -> str:
    """One bar per episode from 0, both signs of return on a labelled axis."""
    values = [number(r.get("return")) or 0.0 for r in records]
    axis = rounded_axis([0.0, *values])
    plot = Plot(name, title=title, count=len(records), axis=axis, tick_format=_fmt,
                x_labels=[str(r.get("episode", i)) for i, r in enumerate(records)])  # fmt: skip
    for i, record in enumerate(records):
        seed = "" if record.get("seed") is None else f" (seed {record.get('seed')})"
        plot.bar(i, values[i], tip=f"episode {record.get('episode')}{seed}: {values[i]:g}", css=status(record),
                 label=_fmt(values[i]))  # fmt: skip
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
        marks.append((step, at, f"converged at step {fmt_count(run['convergence_step'])}", "converged"))
    title = f"Run {run['run']}: episode return against env steps"
    chart = xy_chart(
        f"learning-curve-{run['run']}",
        title=title,
        series=[Series("train", points, f"run {run['run']} training episodes")],
        x_axis=linear_axis([x for x, _ in points], lo=0.0, hi=float(max_steps), whole=True),
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
            f"<td>{fmt_count(run.get('convergence_step')) if run.get('converged') else '–'}</td>"
            f"<td>{fmt_count(run.get('score'))}</td><td>{fmt_count(run.get('train_episodes', len(train)))}</td>"
            f"<td>{fmt_score(run.get('eval_return'))}</td></tr>"
        )
    if runs:
        head = (
            "<tr><th>run</th><th>converged</th><th>step</th><th>scored</th><th>episodes</th><th>eval return</th></tr>"
        )
        table = f'<table class="numeric"><thead>{head}</thead><tbody>{rows}</tbody></table>'
        goal_text = "–" if goal is None else _fmt(goal)
        note = (
            f"Criterion {rule.get('criterion', '–')}: goal {goal_text}, window "
            f"{fmt_count(rule.get('stability_window'))}; a run that does not converge scores "
            f"{fmt_count(rule.get('penalty'))} steps."
        )
        html += section("Phase 2: training runs", table + charts, note)
    return html
