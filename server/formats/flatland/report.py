"""Flatland's report sections: per Test, per episode (normalized return, arrivals, the agent's
step times) and the table of episodes.

The return bars rise from the scoring rule's worst normalized return (a timed-out episode's), so
a better episode is a taller bar whether the rule's returns are negative or positive."""

from __future__ import annotations

import statistics
from typing import Any

from arbiter.server.formats.flatland.rules import RULES, NeurIPS2020
from arbiter.server.report.charts import (
    episode_bars,
    fmt_count,
    fmt_duration,
    fmt_score,
    fmt_share,
    number,
    section,
    status_text,
    think,
    think_chart,
)
from arbiter.server.report.page import table
from arbiter.server.report.svg import Axis, linear_axis


def report_sections(summary: dict[str, Any], episodes: list[dict[str, Any]]) -> str:
    return (
        _per_test(summary, episodes)
        + section("Per episode", episode_charts(episodes, summary))
        + _episodes_table(episodes)
    )


def _per_test(summary: dict[str, Any], episodes: list[dict[str, Any]]) -> str:
    score = summary.get("score") or {}
    per_test = score.get("per_test")
    counts: dict[str, int] = {}
    for record in episodes:
        counts[str(record.get("test"))] = counts.get(str(record.get("test")), 0) + 1
    if isinstance(per_test, dict) and isinstance(per_test.get("primary"), dict):
        secondary = per_test.get("secondary") or {}
        headers = ["Test", "episodes", str(score.get("primary_name")), str(score.get("secondary_name"))]
        rows = [
            [str(test), str(counts.get(str(test), "–")), fmt_score(value), fmt_score(secondary.get(test))]
            for test, value in per_test["primary"].items()
        ]
        return section("Per Test", table(headers, rows, "numeric"))
    if not episodes:
        return ""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in episodes:
        groups.setdefault(str(record.get("test")), []).append(record)
    rows = [
        [
            test,
            str(len(records)),
            fmt_score(_mean(records, "normalized_return")),
            fmt_share(_mean(records, "arrived_fraction")),
        ]
        for test, records in groups.items()
    ]
    headers = ["Test", "episodes", "mean normalized return", "mean fraction arrived"]
    note = "This evaluation has no score; these are means over its recorded episodes only."
    return section("Per Test", table(headers, rows, "numeric"), note)


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (number(r.get(key)) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


def _episodes_table(episodes: list[dict[str, Any]]) -> str:
    if not episodes:
        return section("Episodes", '<p class="empty">No episode was recorded.</p>')
    headers = ["#", "env", "agents", "steps", "normalized return", "arrived", "status", "planning"]
    headers += ["think mean", "think p99", "think max", "wall", "invalid actions", "malfunctions"]
    rows = []
    for record in episodes:
        agents = record.get("num_agents")
        arrived = f"{fmt_count(record.get('arrived'))} ({fmt_share(record.get('arrived_fraction'))})"
        rows.append(
            [
                str(record.get("index", "")),
                str(record.get("env", "")),
                fmt_count(agents),
                f"{fmt_count(record.get('steps'))} / {fmt_count(record.get('max_episode_steps') or None)}",
                fmt_score(record.get("normalized_return")),
                "–" if agents is None else arrived,
                status_text(record),
                fmt_duration(record.get("planning_s")),
                fmt_duration(think(record, "mean")),
                fmt_duration(think(record, "p99")),
                fmt_duration(think(record, "max")),
                fmt_duration(record.get("wall_s")),
                fmt_count(record.get("invalid_actions")),
                fmt_count(record.get("malfunctions")),
            ]
        )
    return section("Episodes", f'<div class="scroll">{table(headers, rows, "numeric episodes")}</div>')


def worst_return(summary: dict[str, Any]) -> float:
    """The lowest normalized return the evaluation's scoring rule gives: a timed-out episode's."""
    rule = RULES.get(str(summary.get("scoring")), NeurIPS2020)()
    return rule.normalized_return(reward=0.0, max_episode_steps=1, num_agents=1, finished=False)


def _return_chart(episodes: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    values = [number(r.get("normalized_return")) or 0.0 for r in episodes]
    floor = worst_return(summary)
    axis = linear_axis(values, lo=floor, hi=floor + 1.0)
    fmt = lambda v: f"{v:.2f}"  # noqa: E731
    title = "Normalized return per episode"
    return episode_bars(
        episodes, name="normalized-return", title=title, key="normalized_return", axis=axis, fmt=fmt, base=floor
    )


def _arrival_chart(episodes: list[dict[str, Any]]) -> str:
    title = "Fraction of agents arrived per episode"
    axis = Axis(0.0, 1.0)
    return episode_bars(
        episodes, name="arrived-fraction", title=title, key="arrived_fraction", axis=axis, fmt=fmt_share
    )


def episode_charts(episodes: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """Normalized return, arrival and the agent's step times, one slot per recorded episode."""
    if not episodes:
        return '<p class="empty">No episode was recorded, so there is nothing to plot per episode.</p>'
    return _return_chart(episodes, summary) + _arrival_chart(episodes) + think_chart(episodes, summary)
