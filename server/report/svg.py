"""Small inline-SVG charts for the HTML report.

The report must open on a machine with no network and nothing installed, so its charts are plain
SVG text written here: no script, no external font or stylesheet, no plotting library. Every data
mark carries ``class="mark"`` and a ``data-value``, and a ``<title>`` that the browser shows on
hover; the charts' colours and fonts come from the page's stylesheet (classes below).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from arbiter.server.report.svg_text import BarLabel, Box, place_bar_label, place_line_label

WIDTH = 960
HEIGHT = 230
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 14, 34
MAX_X_LABELS = 24
LOG_FLOOR = 1e-6  # a log axis cannot show 0; a duration below a microsecond is drawn at 1 µs
# Classes of bars light enough that a label inside them is drawn dark (report_style.py).
LIGHT_BARS = frozenset({"abandoned", "skipped"})


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Axis:
    """The value range of a chart's vertical axis, linear or logarithmic."""

    lo: float
    hi: float
    log: bool = False
    marks: tuple[float, ...] = ()  # a log axis's tick values (its lo and hi are two of them)
    whole: bool = False  # counts or step numbers: no tick between two whole numbers

    def fraction(self, value: float) -> float:
        """Where ``value`` sits between ``lo`` (0.0) and ``hi`` (1.0), clamped to the axis."""
        if self.log:
            value = max(value, LOG_FLOOR)
            position = (math.log10(value) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            position = (value - self.lo) / (self.hi - self.lo)
        return min(1.0, max(0.0, position))

    def ticks(self) -> list[float]:
        if self.log:
            inside = [mark for mark in self.marks if self.lo <= mark <= self.hi]
            stride = max(1, math.ceil((len(inside) - 1) / 7))  # at most 8 labelled ticks
            return inside[::stride] if inside[::stride][-1] == inside[-1] else inside[::stride] + [inside[-1]]
        step = _nice_step((self.hi - self.lo) / 5)
        if self.whole:
            step = max(step, 1.0)
        start = math.ceil(self.lo / step - 1e-9) * step
        count = int(math.floor((self.hi - start) / step + 1e-9)) + 1
        return [round(start + i * step, 12) for i in range(count)]


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, the smallest at least ``raw``."""
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if multiple * power >= raw * (1 - 1e-9):
            return multiple * power
    return 10 * power


def linear_axis(values: Sequence[float], *, lo: float, hi: float, whole: bool = False) -> Axis:
    """An axis from ``lo`` to ``hi``, widened (to nice steps) if a value falls outside.
    ``whole``: the values are counts or step numbers, ticked at whole numbers only."""
    low = min([lo, *values])
    high = max([hi, *values])
    if high <= low:
        high = low + 1.0
    if low < lo or high > hi:
        step = _nice_step((high - low) / 5)
        low, high = math.floor(low / step) * step, math.ceil(high / step) * step
    return Axis(low, high, whole=whole)


def rounded_axis(values: Sequence[float], *, whole: bool = False) -> Axis:
    """An axis over ``values`` whose ends are ticks: both ends are labelled, the lowest value
    below zero included. ``whole``: the values are counts or step numbers."""
    low, high = min(values, default=0.0), max(values, default=1.0)
    if high <= low:
        high = low + 1.0
    step = _nice_step((high - low) / 5)
    if whole:
        step = max(step, 1.0)
    return Axis(math.floor(low / step + 1e-9) * step, math.ceil(high / step - 1e-9) * step, whole=whole)


def log_axis(values: Sequence[float], marks: Sequence[float] | None = None) -> Axis:
    """A log axis from the last of ``marks`` at or below every value to the first at or above them all.

    ``marks`` are the tick values, ascending (default: powers of ten); a duration axis passes
    1 s, 10 s, 1 min, 10 min, 1 h ... so its labels read as round durations.
    """
    positive = [max(value, LOG_FLOOR) for value in values] or [1.0]
    low, high = min(positive), max(positive)
    if marks is None:
        first = math.floor(math.log10(low) + 1e-9)
        last = max(math.ceil(math.log10(high) - 1e-9), first + 1)
        marks = [10.0**power for power in range(first, last + 1)]
    marks = sorted(marks)
    below = [mark for mark in marks if mark <= low * (1 + 1e-9)] or [marks[0]]
    above = [mark for mark in marks if mark >= high * (1 - 1e-9)] or [marks[-1]]
    lo, hi = below[-1], above[0]
    if hi <= lo:
        bigger = [mark for mark in marks if mark > lo]
        hi = bigger[0] if bigger else lo * 10
    return Axis(lo, hi, log=True, marks=tuple(mark for mark in marks if lo <= mark <= hi))


class Plot:
    """One chart: ``count`` slots along x (one per episode), a value axis along y.

    Marks are added per slot, then ``svg()`` gives the ``<svg>`` element as text. Bar labels and
    reference-line labels are placed there, once every mark is known, where nothing hides them.
    """

    def __init__(
        self,
        name: str,
        *,
        title: str,
        count: int,
        axis: Axis,
        tick_format: Callable[[float], str],
        x_labels: Sequence[str],
        height: int = HEIGHT,
    ):
        self.name = name
        self.title = title
        self.count = max(count, 1)
        self.axis = axis
        self.tick_format = tick_format
        self.x_labels = list(x_labels)
        self.height = height
        self.marks: list[str] = []
        self.points = 0
        self._drawn: list[Box] = []  # where each mark is, so that no label covers one
        self._bar_labels: list[BarLabel] = []
        self._rules: list[tuple[float, str, str]] = []

    # -- geometry ----------------------------------------------------------------------------

    @property
    def _plot_height(self) -> float:
        return self.height - TOP - BOTTOM

    def y(self, value: float) -> float:
        return TOP + (1.0 - self.axis.fraction(value)) * self._plot_height

    def slot(self) -> float:
        return (WIDTH - LEFT - RIGHT) / self.count

    def x(self, index: int) -> float:
        return LEFT + (index + 0.5) * self.slot()

    # -- marks -------------------------------------------------------------------------------

    def _mark(self, shape: str, value: float, tip: str, css: str, body: str = "") -> None:
        self.points += 1
        self.marks.append(
            f'<{shape} class="mark {css}" data-value="{value:.6g}" {body}><title>{escape(tip)}</title></{shape}>'
        )

    def bar(self, index: int, value: float, *, tip: str, css: str, base: float = 0.0, label: str = "") -> None:
        """A bar from ``base`` to ``value`` (downwards for a value below the base), with ``label``
        (its value as text) inside it or beyond its end where it fits, else only in its tooltip."""
        width = max(1.0, min(self.slot() * 0.72, 56.0))
        upward = value >= base
        top, bottom = sorted((self.y(value), self.y(base)))
        if bottom - top < 1.0:  # a bar at its base still shows where it is, on the side it grows to
            top, bottom = (bottom - 1.0, bottom) if upward else (top, top + 1.0)
        left = self.x(index) - width / 2
        box = Box(left, top, left + width, bottom)
        self._drawn.append(box)
        self._mark(
            "rect", value, tip, css,
            f'x="{_num(left)}" y="{_num(top)}" width="{_num(width)}" height="{_num(bottom - top)}"',
        )  # fmt: skip
        if label:
            self._bar_labels.append(BarLabel(label, box, self.slot(), upward, bool(LIGHT_BARS & set(css.split()))))

    def dot(self, index: int, value: float, *, tip: str, css: str) -> None:
        radius = min(5.0, max(2.0, self.slot() * 0.3))
        x, y = self.x(index), self.y(value)
        self._drawn.append(Box(x - radius, y - radius, x + radius, y + radius))
        self._mark("circle", value, tip, css, f'cx="{_num(x)}" cy="{_num(y)}" r="{_num(radius)}"')

    def range(self, index: int, *, low: float, box_low: float, box_high: float, high: float, tip: str) -> None:
        """A whisker from ``low`` to ``high`` with a box from ``box_low`` to ``box_high``."""
        x = self.x(index)
        width = max(2.0, min(self.slot() * 0.5, 26.0))
        box_top, box_bottom = sorted((self.y(box_high), self.y(box_low)))
        self._drawn.append(Box(x - width / 2, min(self.y(high), box_top), x + width / 2, max(self.y(low), box_bottom)))
        self.points += 1
        self.marks.append(
            f'<g class="mark range" data-value="{box_low:.6g}"><title>{escape(tip)}</title>'
            f'<line class="whisker" x1="{_num(x)}" x2="{_num(x)}" y1="{_num(self.y(high))}" y2="{_num(self.y(low))}"/>'
            f'<rect class="box" x="{_num(x - width / 2)}" y="{_num(box_top)}" width="{_num(width)}" '
            f'height="{_num(max(box_bottom - box_top, 2.0))}"/>'
            f'<line class="median" x1="{_num(x - width / 2)}" x2="{_num(x + width / 2)}" '
            f'y1="{_num(self.y(box_low))}" y2="{_num(self.y(box_low))}"/></g>'
        )

    def rule(self, value: float, *, label: str, css: str) -> None:
        """A horizontal reference line across the chart (a budget, a mean), labelled at one end."""
        self._rules.append((value, label, css))

    # -- labels ------------------------------------------------------------------------------

    def _labels(self) -> list[str]:
        """The bars' labels, then the lines' labels, each where it covers no mark nor label."""
        parts: list[str] = []
        taken = list(self._drawn)
        for label in self._bar_labels:
            spot = place_bar_label(label, taken, Box(LEFT, 0.0, WIDTH, self.height - BOTTOM))
            if spot is not None:
                taken.append(spot.box)
                parts.append(
                    f'<text class="bar-label {spot.css}" x="{_num(spot.x)}" y="{_num(spot.baseline)}" '
                    f'text-anchor="middle">{escape(label.text)}</text>'
                )
        for value, label, css in self._rules:
            y = self.y(value)
            spot = place_line_label(label, y, taken, Box(LEFT, 0.0, WIDTH - RIGHT, self.height - BOTTOM))
            taken.append(spot.box)
            plate = ""
            if spot.css == "plated":
                edge = spot.box.padded(2.0)
                plate = (
                    f'<rect class="plate" x="{_num(edge.left)}" y="{_num(edge.top)}" '
                    f'width="{_num(edge.right - edge.left)}" height="{_num(edge.bottom - edge.top)}" rx="3"/>'
                )
            parts.append(
                f'<g class="rule {css}"><line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_num(y)}" y2="{_num(y)}"/>'
                f'{plate}<text x="{_num(spot.x)}" y="{_num(spot.baseline)}" text-anchor="{spot.anchor}">'
                f"{escape(label)}</text></g>"
            )
        return parts

    # -- output ------------------------------------------------------------------------------

    def _axes(self) -> list[str]:
        parts = []
        for tick in self.axis.ticks():
            y = self.y(tick)
            parts.append(
                f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_num(y)}" y2="{_num(y)}"/>'
                f'<text class="tick" x="{LEFT - 8}" y="{_num(y + 4)}" text-anchor="end">'
                f"{escape(self.tick_format(tick))}</text>"
            )
        stride = max(1, math.ceil(len(self.x_labels) / MAX_X_LABELS))
        for index, label in enumerate(self.x_labels):
            if index % stride == 0:
                parts.append(
                    f'<text class="tick" x="{_num(self.x(index))}" y="{self.height - BOTTOM + 16}" '
                    f'text-anchor="middle">{escape(label)}</text>'
                )
        bottom = self.height - BOTTOM
        parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
        return parts

    def svg(self) -> str:
        body = "".join(self._axes() + self.marks + self._labels())
        return (
            f'<svg class="chart" data-chart="{escape(self.name)}" data-points="{self.points}" '
            f'viewBox="0 0 {WIDTH} {self.height}" role="img" aria-label="{escape(self.title)}" '
            f'xmlns="http://www.w3.org/2000/svg">{body}</svg>'
        )


def gauge(name: str, *, used: float, budget: float, title: str, label: str) -> str:
    """A horizontal bar: the share of ``budget`` that ``used`` took (a sliver stays visible)."""
    height, bar_top, bar_height = 54, 8, 22
    share = min(1.0, max(0.0, used / budget)) if budget > 0 else 0.0
    inner = WIDTH - LEFT - RIGHT
    filled = max(2.0, share * inner)
    css = "over" if used > budget else "used"
    return (
        f'<svg class="chart" data-chart="{escape(name)}" data-points="1" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect class="track" x="{LEFT}" y="{bar_top}" width="{inner}" height="{bar_height}" rx="4"/>'
        f'<rect class="mark {css}" data-value="{used:.6g}" x="{LEFT}" y="{bar_top}" width="{_num(filled)}" '
        f'height="{bar_height}" rx="4"><title>{escape(label)}</title></rect>'
        f'<text class="tick" x="{LEFT}" y="{bar_top + bar_height + 16}">{escape(label)}</text>'
        "</svg>"
    )


@dataclass(frozen=True)
class Series:
    """One line of an XY chart: points in x order; ``step`` draws a step curve (a value holds
    until the next point), ``fill`` shades the area under it."""

    css: str
    points: Sequence[tuple[float, float]]
    label: str
    step: bool = False
    fill: bool = False


def xy_chart(
    name: str,
    *,
    title: str,
    series: Sequence[Series],
    x_axis: Axis,
    y_axis: Axis,
    x_format: Callable[[float], str],
    y_format: Callable[[float], str],
    y_rules: Sequence[tuple[float, str, str]] = (),
    points: Sequence[tuple[float, float, str, str]] = (),
    height: int = HEIGHT,
) -> str:
    """A chart of lines over a numeric x axis (learning curves): ``y_rules`` are (value, label,
    css) reference lines, ``points`` (x, y, tip, css) marked dots such as a convergence point."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + x_axis.fraction(x) * plot_w

    def py(y: float) -> float:
        return TOP + (1.0 - y_axis.fraction(y)) * plot_h

    parts: list[str] = []
    for tick in y_axis.ticks():
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_num(py(tick))}" y2="{_num(py(tick))}"/>'
            f'<text class="tick" x="{LEFT - 8}" y="{_num(py(tick) + 4)}" text-anchor="end">'
            f"{escape(y_format(tick))}</text>"
        )
    for tick in x_axis.ticks():
        parts.append(
            f'<text class="tick" x="{_num(px(tick))}" y="{height - BOTTOM + 16}" text-anchor="middle">'
            f"{escape(x_format(tick))}</text>"
        )
    bottom = height - BOTTOM
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    count = 0
    for line in series:
        coords: list[tuple[float, float]] = []
        for i, (x, y) in enumerate(line.points):
            if line.step and i:
                coords.append((px(x), coords[-1][1]))
            coords.append((px(x), py(y)))
        if not coords:
            continue
        count += len(line.points)
        path = " ".join(f"{_num(x)},{_num(y)}" for x, y in coords)
        if line.fill:
            area = f"{_num(coords[0][0])},{bottom} {path} {_num(coords[-1][0])},{bottom}"
            parts.append(f'<polygon class="area {escape(line.css)}" points="{area}"/>')
        parts.append(
            f'<polyline class="line {escape(line.css)}" data-points="{len(line.points)}" points="{path}">'
            f"<title>{escape(line.label)}</title></polyline>"
        )
    for value, label, css in y_rules:
        y = py(value)
        parts.append(
            f'<g class="rule {escape(css)}"><line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_num(y)}" y2="{_num(y)}"/>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{_num(y - 4)}" text-anchor="end">{escape(label)}</text></g>'
        )
    for x, y, tip, css in points:
        count += 1
        parts.append(
            f'<circle class="mark {escape(css)}" data-value="{y:.6g}" cx="{_num(px(x))}" cy="{_num(py(y))}" r="5">'
            f"<title>{escape(tip)}</title></circle>"
        )
    return (
        f'<svg class="chart" data-chart="{escape(name)}" data-points="{count}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
    )
