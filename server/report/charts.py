"""The report's charts, and the value formatting the whole page shares (see report.py).

Each chart is one ``<figure>``: a caption, the inline SVG from svg.py and, for per-episode
charts, a legend of the episode colours. Durations are drawn on log axes: an agent's step takes
microseconds to seconds and a budget minutes to hours, and both must be readable on one chart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from html import escape
from typing import Any

from arbiter.server.report.svg import Axis, Plot, gauge, log_axis

STATUS_TEXT = {"finished": "finished", "timeout": "timed out", "abandoned": "abandoned", "skipped": "not played"}
# Round durations for the ticks of a log axis: 1 µs ... 100 ms, 1 s, 10 s, 1 min, 10 min, 1 h, 10 h.
DURATION_TICKS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 36000.0)


# --- formatting --------------------------------------------------------------------------------


def number(value: Any) -> float | None:
    """A finite number, else None (a hand-edited or foreign file may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fmt_score(value: Any, digits: int = 4) -> str:
    score = number(value)
    return "–" if score is None else f"{score:.{digits}f}"


def fmt_count(value: Any) -> str:
    """A count or a step number as the whole number it is (a file may have stored it as a float)."""
    count = number(value)
    return "–" if count is None else str(round(count))


def fmt_share(value: Any) -> str:
    share = number(value)
    if share is None:
        return "–"
    if 0 < share < 0.001:  # "0.0%" would read as nothing used
        return "< 0.1%"
    return f"{100 * share:.1f}%"


def fmt_duration(value: Any) -> str:
    seconds = number(value)
    if seconds is None:
        return "–"
    magnitude = abs(seconds)
    if magnitude == 0:
        return "0 s"
    for limit, scale, unit in ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (60.0, 1.0, "s"), (3600.0, 1 / 60, "min")):
        if magnitude < limit:
            return f"{seconds * scale:.3g} {unit}"
    return f"{seconds / 3600:.3g} h"


def status(record: dict[str, Any]) -> str:
    if record.get("skipped"):
        return "skipped"
    if record.get("timed_out"):
        return "timeout"
    if record.get("abandoned"):
        return "abandoned"
    return "finished"


def status_text(record: dict[str, Any]) -> str:
    kind = status(record)
    if kind == "timeout" and record.get("timeout"):
        return f"timed out ({record['timeout']})"
    return STATUS_TEXT[kind]


def section(title: str, body: str, note: str = "") -> str:
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    return f"<section><h2>{escape(title)}</h2>{note_html}{body}</section>"


def figure(title: str, chart: str, legend: str = "") -> str:
    return f"<figure><figcaption>{escape(title)}</figcaption>{chart}{legend}</figure>"


def _legend(*items: tuple[str, str]) -> str:
    keys = "".join(f'<span><i class="key {css}"></i>{escape(text)}</span>' for css, text in items)
    return f'<div class="legend">{keys}</div>'


EPISODE_LEGEND = _legend(*((css, text) for css, text in STATUS_TEXT.items()))


@dataclass(frozen=True)
class HeadlineFigure:
    """One figure at the top of the page: its value, its name and which way is better."""

    value: Any
    name: str
    higher_is_better: bool | None = None  # None: no direction to tell
    spread: Any = None  # the scoring rule's spread of the figure (std, n, 95% interval, IQM)
    whole: bool = False  # a step number: printed, with its spread, as whole numbers
    primary: bool = False
    missing: str = ""  # why there is no value, when there is none

    def text(self, value: Any) -> str:
        return fmt_count(value) if self.whole else fmt_score(value)

    def direction(self) -> str:
        if self.higher_is_better is None:
            return ""
        return "higher is better" if self.higher_is_better else "lower is better"


def think(record: dict[str, Any], key: str) -> Any:
    stats = record.get("step_think_s")
    return stats.get(key) if isinstance(stats, dict) else None


# --- charts ------------------------------------------------------------------------------------


def _x_labels(episodes: list[dict[str, Any]]) -> list[str]:
    return [str(record.get("index", i)) for i, record in enumerate(episodes)]


def _tip(record: dict[str, Any], text: str) -> str:
    return f"#{record.get('index', '')} {record.get('env', '')} ({status_text(record)}): {text}"


def episode_bars(
    episodes: list[dict[str, Any]], *, name: str, title: str, key: str, axis: Axis, fmt: Any, base: float = 0.0
) -> str:
    """One bar per episode from ``base`` (the figure's worst value, so that better is taller),
    labelled with its value, and the mean as a line."""
    plot = Plot(name, title=title, count=len(episodes), axis=axis, tick_format=fmt, x_labels=_x_labels(episodes))
    values = []
    for i, record in enumerate(episodes):
        value = number(record.get(key)) or 0.0
        values.append(value)
        plot.bar(i, value, tip=_tip(record, fmt(value)), css=status(record), base=base, label=fmt(value))
    plot.rule(statistics.fmean(values), label=f"mean {fmt(statistics.fmean(values))}", css="mean")
    return figure(title, plot.svg(), EPISODE_LEGEND)


def think_chart(episodes: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """Per episode: the agent's time per step as min–max whisker and a mean–p99 box; then all steps."""
    rows = [(str(r.get("index", "")), r.get("step_think_s"), _tip(r, "")) for r in episodes]
    overall = (summary.get("timing") or {}).get("step_think_s")
    rows.append(("all", overall, "all steps: "))
    rows = [(label, stats, tip) for label, stats, tip in rows if isinstance(stats, dict) and number(stats.get("max"))]
    title = "Agent time per step (whisker min–max, box mean–p99)"
    if not rows:
        return figure(title, '<p class="empty">No step was timed.</p>')
    values = [number(stats.get(k)) or 0.0 for _, stats, _ in rows for k in ("min", "max")]
    plot = Plot(
        "step-time",
        title=title,
        count=len(rows),
        axis=log_axis(values, DURATION_TICKS),
        tick_format=fmt_duration,
        x_labels=[label for label, _, _ in rows],
    )
    for i, (_, stats, tip) in enumerate(rows):
        low, mean, p99, high = (number(stats.get(k)) or 0.0 for k in ("min", "mean", "p99", "max"))
        text = f"{fmt_count(stats.get('n'))} steps; min {fmt_duration(low)}, mean {fmt_duration(mean)}, "
        text += f"p99 {fmt_duration(p99)}, max {fmt_duration(high)}"
        plot.range(i, low=low, box_low=mean, box_high=p99, high=high, tip=tip + text)
    return figure(title, plot.svg())


def _budget_dots(
    episodes: list[dict[str, Any]], *, name: str, title: str, budget: float | None, kind: str, value_of: Any
) -> str:
    """One dot per episode with a measured time; an episode timed out on this budget sits on the line."""
    points = []
    for i, record in enumerate(episodes):
        value = number(value_of(record))
        if record.get("timeout") == kind and budget is not None:
            value = budget if value is None else max(value, budget)
        if value is not None:
            points.append((i, value, record))
    if not points:
        return figure(title, '<p class="empty">Nothing was measured.</p>')
    axis = log_axis([value for _, value, _ in points] + ([budget] if budget else []), DURATION_TICKS)
    plot = Plot(
        name, title=title, count=len(episodes), axis=axis, tick_format=fmt_duration, x_labels=_x_labels(episodes)
    )
    for i, value, record in points:
        share = f" ({fmt_share(value / budget)} of the budget)" if budget else ""
        plot.dot(i, value, tip=_tip(record, fmt_duration(value) + share), css=status(record))
    if budget:
        plot.rule(budget, label=f"budget {fmt_duration(budget)}", css="budget")
    return figure(title, plot.svg(), EPISODE_LEGEND)


def _time_bank_chart(episodes: list[dict[str, Any]], bank: float) -> str:
    """Per episode, how much of its time bank its planning and steps used (a timeout uses it all)."""
    title = "Time bank used per episode against the bank"
    axis, labels = Axis(0.0, bank), _x_labels(episodes)
    plot = Plot("time-bank", title=title, count=len(episodes), axis=axis, tick_format=fmt_duration, x_labels=labels)
    for i, record in enumerate(episodes):
        used = min(number(record.get("time_bank_used_s")) or 0.0, bank)
        tip = _tip(record, f"{fmt_duration(used)} ({fmt_share(used / bank)} of the bank)")
        plot.bar(i, used, tip=tip, css=status(record), label=fmt_duration(used))
    plot.rule(bank, label=f"bank {fmt_duration(bank)}", css="budget")
    return figure(title, plot.svg(), EPISODE_LEGEND)


def budget_charts(episodes: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    budgets = summary.get("budgets") or {}
    parts = []
    # An item's planning, step and time-bank figures are on its last record (an item of many
    # episodes, such as a training run, has one slot; an older file says nothing: one each).
    episodes = [record for record in episodes if record.get("last_of_item", True) is not False]
    if episodes:
        parts.append(
            _budget_dots(
                episodes,
                name="planning-time",
                title="Planning time per episode against the planning budget",
                budget=number(budgets.get("planning_s")),
                kind="planning",
                value_of=lambda r: r.get("planning_s"),
            )
        )
        parts.append(
            _budget_dots(
                episodes,
                name="step-time-max",
                title="Longest agent step per episode against the step budget",
                budget=number(budgets.get("step_s")),
                kind="step",
                value_of=lambda r: think(r, "max"),
            )
        )
        bank = number(budgets.get("time_bank_s"))
        if bank:
            parts.append(_time_bank_chart(episodes, bank))
    used, budget = number((summary.get("timing") or {}).get("evaluation_s")), number(budgets.get("overall_s"))
    if used is not None and budget:
        label = f"{fmt_duration(used)} of {fmt_duration(budget)} ({fmt_share(used / budget)})"
        title = "Overall time against the overall budget"
        parts.append(figure(title, gauge("overall-time", used=used, budget=budget, title=title, label=label)))
    return section("Time used against the budgets", "".join(parts)) if parts else ""
