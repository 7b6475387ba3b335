"""server/report/svg.py: the report's inline SVG charts, parsed back as XML.

Axes are checked for where they put values and ticks; charts for what they draw: one mark per
value with its ``data-value`` and tooltip, bars growing from their base, and text escaped so that
a hostile label cannot break out of the SVG.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from arbiter.server.report.svg import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    Axis,
    Plot,
    Series,
    gauge,
    linear_axis,
    log_axis,
    rounded_axis,
    xy_chart,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def marks(root: ET.Element) -> list[ET.Element]:
    return [element for element in root.iter() if "mark" in element.get("class", "").split()]


def test_a_value_sits_at_its_fraction_of_the_axis_clamped_to_its_ends():
    axis = Axis(-1.0, 3.0)
    assert [axis.fraction(v) for v in (-1.0, 0.0, 3.0, 10.0, -5.0)] == [0.0, 0.25, 1.0, 1.0, 0.0]
    log = Axis(0.001, 10.0, log=True, marks=(0.001, 0.01, 0.1, 1.0, 10.0))
    assert log.fraction(0.1) == pytest.approx(0.5) and log.fraction(0.0) == 0.0


def test_a_linear_axis_keeps_its_range_unless_a_value_falls_outside():
    assert (linear_axis([0.2, 0.8], lo=0.0, hi=1.0).lo, linear_axis([0.2, 0.8], lo=0.0, hi=1.0).hi) == (0.0, 1.0)
    widened = linear_axis([-0.3, 1.7], lo=0.0, hi=1.0)
    assert widened.lo <= -0.3 and widened.hi >= 1.7
    assert widened.lo == pytest.approx(-0.5) and widened.hi == pytest.approx(2.0)  # on nice steps of 0.5


def test_ticks_are_nice_steps_and_whole_axes_have_no_fractional_tick():
    assert Axis(0.0, 1.0).ticks() == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    whole = Axis(0.0, 3.0, whole=True).ticks()
    assert whole == [0.0, 1.0, 2.0, 3.0] and all(tick == int(tick) for tick in whole)


def test_a_rounded_axis_ends_on_ticks_including_below_zero():
    axis = rounded_axis([-0.37, 0.9])
    assert axis.lo <= -0.37 and axis.hi >= 0.9
    ticks = axis.ticks()
    assert ticks[0] == pytest.approx(axis.lo) and ticks[-1] == pytest.approx(axis.hi)
    assert any(tick < 0 for tick in ticks)
    assert rounded_axis([]).hi > rounded_axis([]).lo  # nothing to show still draws an axis


def test_a_log_axis_spans_the_marks_around_its_values():
    axis = log_axis([0.004, 2.5])
    assert (axis.lo, axis.hi) == (pytest.approx(0.001), pytest.approx(10.0)) and axis.log
    durations = log_axis([30.0, 90.0], marks=[1.0, 10.0, 60.0, 600.0, 3600.0])
    assert (durations.lo, durations.hi) == (10.0, 600.0)
    assert durations.ticks() == [10.0, 60.0, 600.0]
    # A zero duration is drawn at the floor, never a log of zero.
    assert math.isfinite(log_axis([0.0, 1.0]).lo)


def episode_plot(values: list[float], *, base: float = 0.0) -> str:
    plot = Plot(
        "scores",
        title="Score per episode",
        count=len(values),
        axis=linear_axis(values, lo=-1.0, hi=1.0),
        tick_format=lambda v: f"{v:g}",
        x_labels=[str(i) for i in range(len(values))],
    )
    for i, value in enumerate(values):
        plot.bar(i, value, tip=f"episode {i}: {value}", css="finished", base=base, label=f"{value:g}")
    plot.rule(0.5, label="mean 0.5", css="mean")
    return plot.svg()


def test_a_plot_has_one_mark_per_value_with_its_value_and_tooltip():
    root = parse(episode_plot([0.25, -0.5, 1.0]))
    assert root.get("data-chart") == "scores" and root.get("data-points") == "3"
    found = marks(root)
    assert [float(mark.get("data-value")) for mark in found] == [0.25, -0.5, 1.0]
    assert [mark.find(f"{SVG}title").text for mark in found] == ["episode 0: 0.25", "episode 1: -0.5", "episode 2: 1.0"]


def test_bars_grow_from_their_base_up_or_down():
    root = parse(episode_plot([0.5, -0.5]))
    up, down = marks(root)
    zero = TOP + 0.5 * (HEIGHT - TOP - BOTTOM)  # the axis runs from -1 to 1: its middle is 0
    assert float(up.get("y")) + float(up.get("height")) == pytest.approx(zero, abs=0.01)
    assert float(down.get("y")) == pytest.approx(zero, abs=0.01)
    assert float(up.get("height")) == pytest.approx(float(down.get("height")), abs=0.01)


def test_every_mark_and_label_stays_within_the_chart():
    root = parse(episode_plot([0.9, -0.9, 0.1, 0.0]))
    for mark in marks(root):
        x, width = float(mark.get("x")), float(mark.get("width"))
        assert LEFT <= x and x + width <= WIDTH - RIGHT
    labels = [text for text in root.iter(f"{SVG}text") if "bar-label" in text.get("class", "")]
    assert labels and all(0 <= float(label.get("x")) <= WIDTH for label in labels)


def test_text_is_escaped():
    plot = Plot(
        'x"><script>',
        title="</svg><script>alert(1)</script>",
        count=1,
        axis=Axis(0.0, 1.0),
        tick_format=str,
        x_labels=["<b>"],
    )
    plot.dot(0, 0.5, tip="a < b & c", css="finished")
    svg = plot.svg()
    assert "<script>" not in svg
    root = parse(svg)
    assert marks(root)[0].find(f"{SVG}title").text == "a < b & c"


def test_a_gauge_fills_the_share_used_and_marks_an_overrun():
    inner = WIDTH - LEFT - RIGHT
    half = marks(parse(gauge("overall", used=30.0, budget=60.0, title="t", label="30 s of 60 s")))[0]
    assert float(half.get("width")) == pytest.approx(inner / 2, abs=0.01) and "used" in half.get("class")
    over = marks(parse(gauge("overall", used=90.0, budget=60.0, title="t", label="90 s of 60 s")))[0]
    assert float(over.get("width")) == pytest.approx(inner) and "over" in over.get("class")
    sliver = marks(parse(gauge("overall", used=0.0, budget=60.0, title="t", label="0 s")))[0]
    assert float(sliver.get("width")) > 0  # nothing used still shows where the bar is


def test_an_xy_chart_draws_a_line_per_series_and_step_curves_hold_their_value():
    axis = Axis(0.0, 10.0)
    svg = xy_chart(
        "curve",
        title="Learning curve",
        series=[
            Series("smooth", [(0.0, 1.0), (5.0, 2.0), (10.0, 3.0)], "smooth"),
            Series("held", [(0.0, 1.0), (5.0, 2.0), (10.0, 3.0)], "held", step=True, fill=True),
            Series("empty", [], "no points"),
        ],
        x_axis=axis,
        y_axis=axis,
        x_format=str,
        y_format=str,
        points=[(5.0, 2.0, "converged here", "converged")],
    )
    root = parse(svg)
    lines = {line.get("class"): line for line in root.iter(f"{SVG}polyline")}
    assert set(lines) == {"line smooth", "line held"}
    assert len(lines["line smooth"].get("points").split()) == 3
    assert len(lines["line held"].get("points").split()) == 5  # a corner before each later point
    assert len(list(root.iter(f"{SVG}polygon"))) == 1
    assert root.get("data-points") == str(3 + 3 + 1)
    assert [float(mark.get("data-value")) for mark in marks(root)] == [2.0]
