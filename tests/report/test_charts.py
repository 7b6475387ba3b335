"""server/report/charts.py: the value formatting the report shares, and its per-episode charts,
built from records and summaries as the results folder holds them (anything a hand-edited file
may hold included) and parsed back as HTML/SVG."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from arbiter.server.report.charts import (
    HeadlineFigure,
    budget_charts,
    episode_bars,
    fmt_count,
    fmt_duration,
    fmt_score,
    fmt_share,
    number,
    status,
    status_text,
    think_chart,
)
from arbiter.server.report.svg import Axis

SVG = "{http://www.w3.org/2000/svg}"


def record(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": index, "env": f"Test_0/Level_{index}.pkl", "timed_out": False, "abandoned": False,
            "skipped": False, "timeout": None, **fields}  # fmt: skip


def charts_in(html: str) -> dict[str, ET.Element]:
    """Every chart of an HTML fragment, by its name."""
    root = ET.fromstring(f"<div>{html}</div>")
    return {svg.get("data-chart"): svg for svg in root.iter(f"{SVG}svg")}


def marks(svg: ET.Element) -> list[ET.Element]:
    return [element for element in svg.iter() if "mark" in element.get("class", "").split()]


@pytest.mark.parametrize("junk", [None, "1.5", True, float("nan"), float("inf"), [1]])
def test_anything_but_a_finite_number_is_no_number_and_shows_as_a_dash(junk):
    assert number(junk) is None
    assert fmt_score(junk) == fmt_count(junk) == fmt_share(junk) == fmt_duration(junk) == "–"


def test_numbers_are_formatted_for_reading():
    assert fmt_score(-0.123456) == "-0.1235" and fmt_score(2, digits=1) == "2.0"
    assert fmt_count(12.0) == "12" and fmt_count(7) == "7"
    assert fmt_share(0.256) == "25.6%" and fmt_share(0.0004) == "< 0.1%" and fmt_share(0) == "0.0%"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (2.5e-6, "2.5 µs"), (0.0123, "12.3 ms"), (4.2, "4.2 s"), (150.0, "2.5 min"), (5400.0, "1.5 h")],
)
def test_durations_read_in_their_unit(seconds, text):
    assert fmt_duration(seconds) == text


def test_a_records_status_puts_not_played_before_timed_out_before_abandoned():
    assert status(record(0)) == "finished"
    assert status(record(0, abandoned=True)) == "abandoned"
    assert status(record(0, timed_out=True, abandoned=True)) == "timeout"
    assert status(record(0, skipped=True, timed_out=True)) == "skipped"
    assert status_text(record(0, timed_out=True, timeout="step")) == "timed out (step)"
    assert status_text(record(0, skipped=True)) == "not played"


def test_a_headline_figure_says_which_way_is_better():
    assert HeadlineFigure(1.0, "score", higher_is_better=True).direction() == "higher is better"
    assert HeadlineFigure(1.0, "steps", higher_is_better=False).direction() == "lower is better"
    assert HeadlineFigure(1.0, "n").direction() == ""
    assert HeadlineFigure(1500.0, "steps", whole=True).text(1500.0) == "1500"
    assert HeadlineFigure(0.5, "score").text(0.5) == "0.5000"


def test_episode_bars_draw_a_bar_per_episode_in_its_status_and_the_mean():
    episodes = [record(0, score=0.5), record(1, score=-0.25, timed_out=True, timeout="step"), record(2, score="x")]
    html = episode_bars(
        episodes, name="score", title="Score", key="score", axis=Axis(-1.0, 1.0), fmt=fmt_score, base=-1.0
    )
    svg = charts_in(html)["score"]
    bars = marks(svg)
    assert [float(bar.get("data-value")) for bar in bars] == [0.5, -0.25, 0.0]  # a value that is no number: 0
    assert ["timeout" in bar.get("class") for bar in bars] == [False, True, False]
    assert "timed out (step)" in bars[1].find(f"{SVG}title").text
    mean = [text.text for text in svg.iter(f"{SVG}text") if text.text and text.text.startswith("mean")]
    assert mean == [f"mean {fmt_score((0.5 - 0.25 + 0.0) / 3)}"]


def test_the_think_chart_has_a_range_per_timed_episode_and_one_for_all_steps():
    timed = {"n": 10, "min": 0.001, "mean": 0.002, "p99": 0.004, "max": 0.005}
    episodes = [record(0, step_think_s=timed), record(1, step_think_s=None), record(2, step_think_s=timed)]
    summary = {"timing": {"step_think_s": {**timed, "n": 20}}}
    svg = charts_in(think_chart(episodes, summary))["step-time"]
    ranges = marks(svg)
    assert len(ranges) == 3  # episodes 0 and 2, and all steps; episode 1 timed nothing
    assert ranges[-1].find(f"{SVG}title").text.startswith("all steps: 20 steps")


def test_the_think_chart_says_so_when_nothing_was_timed():
    assert "No step was timed." in think_chart([record(0)], {"timing": {}})


def test_an_episode_timed_out_on_a_budget_sits_on_its_line():
    budgets = {"planning_s": 2.0, "step_s": 0.5, "overall_s": 100.0, "time_bank_s": 1.0}
    episodes = [
        record(0, planning_s=0.5, time_bank_used_s=0.25),
        record(1, planning_s=None, timed_out=True, timeout="planning", time_bank_used_s=5.0),
    ]
    found = charts_in(budget_charts(episodes, {"budgets": budgets, "timing": {"evaluation_s": 25.0}}))
    assert [float(dot.get("data-value")) for dot in marks(found["planning-time"])] == [0.5, 2.0]
    # A bank draw never shows more than the bank.
    assert [float(bar.get("data-value")) for bar in marks(found["time-bank"])] == [0.25, 1.0]
    overall = marks(found["overall-time"])[0]
    assert float(overall.get("data-value")) == 25.0 and "25.0%" in overall.find(f"{SVG}title").text


def test_budget_charts_leave_out_what_the_evaluation_did_not_have():
    found = charts_in(budget_charts([record(0, planning_s=0.1)], {"budgets": {"planning_s": 1.0}}))
    assert "time-bank" not in found and "overall-time" not in found and "planning-time" in found
    assert budget_charts([], {"budgets": {}}) == ""


def test_charts_hold_only_finite_numbers():
    episodes = [record(0, score=float("inf"), planning_s=float("nan"))]
    html = episode_bars(episodes, name="s", title="S", key="score", axis=Axis(0.0, 1.0), fmt=fmt_score)
    html += budget_charts(episodes, {"budgets": {"planning_s": 1.0}})
    for svg in charts_in(html).values():
        assert all(math.isfinite(float(mark.get("data-value"))) for mark in marks(svg))
