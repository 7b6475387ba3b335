"""The MetaLC report sections: each run's averages, the ALC per dataset, and per dataset the
agent's scored learning curve.

A curve is drawn the way the challenge's scoring program drew it: the best credited score so far
as a step curve over normalized time t~ = ln(1 + t/60) / ln(1 + T/60), on a [0, 1] axis whose
ticks are labelled in seconds (a log-time axis). The shaded area under it is the dataset's ALC.
In the final phase the three runs are drawn on one chart per dataset (the reported, worst run
shaded) and their figures sit side by side in the table.
"""

from __future__ import annotations

from html import escape
from typing import Any

from arbiter.server.core.summary import ENDING_TEXT, FINISHED
from arbiter.server.formats.metalc.scoring import T0_S, normalized_time, record_figures
from arbiter.server.report.charts import fmt_count, fmt_score, number, section
from arbiter.server.report.svg import Axis, Plot, Series, linear_axis, xy_chart

RUN_CSS = ("", "second", "third")  # run 0 blue, run 1 green, run 2 amber (report_style.py)
RUN_COLOURS = ("blue", "green", "amber")
CURVE_HEIGHT = 150


def _seconds_label(fraction: float, time_budget: int) -> str:
    """The time, in seconds, at normalized time ``fraction`` of a dataset with budget T."""
    seconds = T0_S * ((1 + time_budget / T0_S) ** fraction - 1)
    return f"{seconds:.0f} s" if seconds >= 100 else f"{seconds:.3g} s"


def best_so_far_points(record: dict[str, Any]) -> list[tuple[float, float]]:
    """The step curve's corners: (0, 0), then (t~_i, best credited score so far) per step, held
    to t~ = 1. A credited time missing from its curve (the dataset scores 0) counts as 0 here."""
    budget = int(record["time_budget"])
    points = [(0.0, 0.0)]
    best = 0.0
    for time, score in zip(record.get("times") or [], record.get("scores") or [], strict=False):
        best = max(best, score if isinstance(score, (int, float)) else 0.0)
        points.append((normalized_time(float(time), budget), best))
    points.append((1.0, points[-1][1]))
    return points


def _by_run(records: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for record in records:
        if "dataset" in record and "run" in record:
            runs.setdefault(int(record["run"]), {})[record["dataset"]] = record
    return runs


def _figures(record: dict[str, Any] | None) -> tuple[float, float, str | None]:
    if record is None:
        return 0.0, 0.0, "not played"
    try:
        return record_figures(record)
    except (KeyError, TypeError, ValueError):
        return number(record.get("alc")) or 0.0, number(record.get("final_score")) or 0.0, "unreadable record"


def _why_zero(record: dict[str, Any] | None, computed: str) -> str:
    """Why a dataset scores 0: how it ended when it did not finish, else what its record says
    (a time missing from its curve ...), else what recomputing its figures found."""
    if record is None:
        return computed
    ended = record.get("ended")
    if ended is not None and ended != FINISHED:
        return ENDING_TEXT.get(str(ended), str(ended))
    return str(record.get("zero_because") or computed)


def _runs_table(score: dict[str, Any]) -> str:
    reported = score.get("reported_run")
    rows = ""
    for run in score.get("runs") or []:
        mark = " (reported)" if run.get("run") == reported and len(score.get("runs") or []) > 1 else ""
        rows += (
            f"<tr><td>{escape(str(run.get('run')))}{mark}</td><td>{fmt_score(run.get('average_alc'))}</td>"
            f"<td>{fmt_score(run.get('average_final_score'))}</td></tr>"
        )
    head = "<tr><th>run</th><th>average ALC</th><th>average final score</th></tr>"
    return f'<table class="numeric"><thead>{head}</thead><tbody>{rows}</tbody></table>'


def _dataset_table(runs: dict[int, dict[str, dict[str, Any]]], datasets: list[str]) -> str:
    order = sorted(runs)
    head = "<tr><th>dataset</th><th>T</th>" + "".join(
        f"<th>ALC run {r}</th><th>final run {r}</th>" if len(order) > 1 else "<th>ALC</th><th>final score</th>"
        for r in order
    )
    head += "<th>steps</th><th>note</th></tr>"
    rows = ""
    for dataset in datasets:
        any_record = next((runs[r][dataset] for r in order if dataset in runs[r]), {})
        cells = ""
        notes = []
        steps = []
        for r in order:
            record = runs[r].get(dataset)
            area, final, failure = _figures(record)
            cells += f"<td>{fmt_score(area)}</td><td>{fmt_score(final)}</td>"
            steps.append(fmt_count(record.get("steps", 0)) if record else "–")
            if failure:
                notes.append(f"run {r}: {_why_zero(record, failure)}")
        rows += (
            f"<tr><td>{escape(dataset)}</td><td>{escape(str(any_record.get('time_budget', '–')))}</td>{cells}"
            f"<td>{escape(' / '.join(steps))}</td><td>{escape('; '.join(notes))}</td></tr>"
        )
    return f'<div class="scroll"><table class="numeric"><thead>{head}</thead><tbody>{rows}</tbody></table></div>'


def _alc_chart(runs: dict[int, dict[str, dict[str, Any]]], datasets: list[str], reported: int) -> str:
    values = {r: [_figures(runs[r].get(d))[0] for d in datasets] for r in runs}
    flat = [v for row in values.values() for v in row]
    axis = linear_axis(flat, lo=0.0, hi=1.0)
    title = "ALC per dataset" + (f" (bars: run {reported}, the reported run; dots: every run)" if len(runs) > 1 else "")
    plot = Plot("metalc-alc", title=title, count=len(datasets), axis=axis, tick_format=lambda v: f"{v:g}",
                x_labels=datasets)  # fmt: skip
    for i, dataset in enumerate(datasets):
        record = runs.get(reported, {}).get(dataset)
        css = "timeout" if record is None or record.get("timed_out") or _figures(record)[2] else "finished"
        value = values[reported][i] if reported in values else 0.0
        plot.bar(i, value, tip=f"{dataset}: ALC {value:.4f}", css=css, label=f"{value:.2f}")
        if len(runs) > 1:
            for r in sorted(runs):
                plot.dot(i, values[r][i], tip=f"{dataset}, run {r}: ALC {values[r][i]:.4f}", css="skipped")
    return f"<figure><figcaption>{escape(title)}</figcaption>{plot.svg()}</figure>"


def _curve_chart(dataset: str, runs: dict[int, dict[str, dict[str, Any]]], reported: int) -> str:
    present = [r for r in sorted(runs) if dataset in runs[r]]
    if not present:
        return ""
    budget = int(runs[present[0]][dataset]["time_budget"])
    series = []
    ys: list[float] = []
    captions = []
    for r in present:
        record = runs[r][dataset]
        points = best_so_far_points(record)
        ys += [y for _, y in points]
        area, _, failure = _figures(record)
        label = f"run {r}: ALC {area:.4f}" + (f" ({_why_zero(record, failure)}: scores 0)" if failure else "")
        captions.append(label + (f" [{RUN_COLOURS[r % 3]}]" if len(present) > 1 else ""))
        css = RUN_CSS[r % len(RUN_CSS)] if len(present) > 1 else ""
        series.append(Series(css, points, label, step=True, fill=r == reported or len(present) == 1))
    hi = max(1.0, *ys) if ys else 1.0
    lo = min(0.0, *ys) if ys else 0.0
    title = f"{dataset} (T = {budget} s)"
    chart = xy_chart(
        f"metalc-curve-{dataset}",
        title=title,
        series=series,
        x_axis=Axis(0.0, 1.0),
        y_axis=linear_axis(ys, lo=lo, hi=hi),
        x_format=lambda v: _seconds_label(v, budget),
        y_format=lambda v: f"{v:g}",
        height=CURVE_HEIGHT,
    )
    return f"<figure><figcaption>{escape(title + ': ' + '; '.join(captions))}</figcaption>{chart}</figure>"


def report_sections(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    score = summary.get("score") or {}
    runs = _by_run(records)
    if not runs:
        return ""
    datasets = sorted({d for row in runs.values() for d in row})
    reported = score.get("reported_run")
    if reported not in runs:
        reported = min(runs)
    phase = score.get("phase") or next(iter(next(iter(runs.values())).values())).get("phase", "dev")
    final = phase == "final"
    scoring_note = (
        "Final phase: credited scores read on the test curves, each dataset's ALC and final score rounded to "
        "2 decimals, each run's averages the rounded mean of those; the reported run is the one with the lowest "
        "average ALC."
        if final
        else "Development phase: credited scores read on the validation curves, no rounding."
    )
    html = section(
        "MetaLC: runs",
        _runs_table(score) if score.get("runs") else "",
        f"{scoring_note} A dataset that timed out, was not finished or credited a time missing from its curve "
        "scores 0.",
    )
    html += section("MetaLC: ALC per dataset", _alc_chart(runs, datasets, reported) + _dataset_table(runs, datasets))
    charts = ""
    for dataset in datasets:
        try:
            charts += _curve_chart(dataset, runs, reported)
        except (KeyError, TypeError, ValueError):  # a hand-edited or foreign record: its table row says enough
            charts += f'<p class="empty">{escape(dataset)}: no curve (its record lacks the scored curve)</p>'
    note = (
        "Best credited score so far against time on a log scale (t~ = ln(1 + t/60) / ln(1 + T/60)); the shaded "
        "area is the ALC."
    )
    if final and len(runs) > 1:
        note += f" Runs: {', '.join(f'run {r} {RUN_COLOURS[r % 3]}' for r in sorted(runs))}; run {reported} shaded."
    html += section("MetaLC: learning curves", charts, note)
    return html
