"""Reading report.html back: its charts as SVG elements, label boxes measured with the report's
fonts, and headless Chromium to render a page (Debian's chromium, installed when missing)."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from arbiter.server.report.style import STYLESHEET

# Debian's chromium; CI installs it in .ci/run, and the fixture below does when it is missing.
CHROMIUM_INSTALL = "apt-get update && apt-get install -y --no-install-recommends chromium fonts-dejavu-core"


class Charts(HTMLParser):
    """``{data-chart: (data-points, marks found)}`` for every ``<svg class="chart">`` in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, list[int]] = {}
        self._current: str | None = None
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        classes = (values.get("class") or "").split()
        if tag == "script":
            self.scripts += 1
        if tag == "svg" and "chart" in classes:
            self._current = values["data-chart"]
            self.charts[self._current] = [int(values["data-points"]), 0]
        elif self._current is not None and "mark" in classes:
            self.charts[self._current][1] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._current = None


def charts_of(page: str) -> Charts:
    parser = Charts()
    parser.feed(page)
    return parser


def headless(chromium: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )


def count_near(pixels: np.ndarray, colour: tuple[int, int, int], tolerance: int = 12) -> int:
    """How many RGB pixels are within ``tolerance`` of ``colour`` in every channel."""
    return int(np.all(np.abs(pixels - np.array(colour)) <= tolerance, axis=1).sum())


FONTS = Path("/usr/share/fonts/truetype/dejavu")


SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Box:
    left: float
    top: float
    right: float
    bottom: float

    def overlaps(self, other: Box) -> bool:
        return (
            self.left < other.right and other.left < self.right and self.top < other.bottom and other.top < self.bottom
        )

    def within(self, other: Box, slack: float = 0.01) -> bool:
        return (
            self.left >= other.left - slack
            and self.right <= other.right + slack
            and self.top >= other.top - slack
            and self.bottom <= other.bottom + slack
        )


def charts(page: str) -> dict[str, ET.Element]:
    """Every chart of the page, parsed as the SVG it is."""
    found = {}
    for text in re.findall(r'<svg class="chart".*?</svg>', page, flags=re.S):
        element = ET.fromstring(text)
        found[element.get("data-chart")] = element
    return found


def classes(element: ET.Element) -> list[str]:
    return (element.get("class") or "").split()


def bars(chart: ET.Element) -> list[tuple[Box, ET.Element]]:
    found = []
    for rect in chart.iter(f"{SVG}rect"):
        if "mark" in classes(rect):
            x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
            found.append((Box(x, y, x + w, y + h), rect))
    return found


def marks(chart: ET.Element) -> list[Box]:
    """Where every data mark is drawn: bars, dots and whiskers."""
    boxes = [box for box, _ in bars(chart)]
    for dot in chart.iter(f"{SVG}circle"):
        if "mark" in classes(dot):
            x, y, r = (float(dot.get(k)) for k in ("cx", "cy", "r"))
            boxes.append(Box(x - r, y - r, x + r, y + r))
    return boxes


def font_size(selector: str) -> int:
    rule = re.search(re.escape(selector) + r" \{[^}]*font-size: (\d+)px", STYLESHEET)
    return int(rule.group(1)) if rule else 12


def measured(text: ET.Element, size: int, bold: bool = True) -> Box:
    """The box the text's glyphs cover, measured with DejaVu Sans at ``size``."""
    from PIL import ImageFont

    path = FONTS / ("DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf")
    if not path.is_file():
        pytest.skip(f"{path} is not installed (Debian's fonts-dejavu-core)")
    font = ImageFont.truetype(str(path), size)
    content = "".join(text.itertext())
    width = font.getlength(content)
    _, top, _, bottom = font.getbbox(content, anchor="ls")
    x, y = float(text.get("x")), float(text.get("y"))
    left = {"start": x, "middle": x - width / 2, "end": x - width}[text.get("text-anchor") or "start"]
    return Box(left, y + top, left + width, y + bottom)


def bar_labels(chart: ET.Element) -> list[ET.Element]:
    return [t for t in chart.iter(f"{SVG}text") if "bar-label" in classes(t)]


def ticks(chart: ET.Element) -> dict[str, float]:
    """The value axis's tick labels and the height each is drawn at."""
    return {
        "".join(t.itertext()): float(t.get("y")) - 4
        for t in chart.iter(f"{SVG}text")
        if "tick" in classes(t) and t.get("text-anchor") == "end"
    }


def assert_labels_readable(chart: ET.Element) -> None:
    """Each bar label fits inside its bar, or sits outside every bar; none overlaps another, and
    a reference line's label covers no mark unless it is drawn on a plate of its own."""
    size = font_size("text.bar-label")
    view = Box(*(float(v) for v in chart.get("viewBox").split()))
    drawn = bars(chart)
    placed: list[Box] = []
    for label in bar_labels(chart):
        box = measured(label, size)
        assert box.within(view), f"{''.join(label.itertext())} leaves the chart"
        centre = float(label.get("x"))
        [(own, rect)] = [(b, r) for b, r in drawn if abs((b.left + b.right) / 2 - centre) < 0.01]
        if "inside" in classes(label):
            assert box.within(own), f"{''.join(label.itertext())} does not fit its bar {own}"
            light = {"abandoned", "skipped"} & set(classes(rect))
            assert ("on-light" in classes(label)) == bool(light), "an inside label contrasts with its bar"
        else:
            assert "outside" in classes(label)
            assert not any(box.overlaps(b) for b, _ in drawn), f"{''.join(label.itertext())} overlaps a bar"
        assert not any(box.overlaps(other) for other in placed)
        placed.append(box)
    for rule in chart.iter(f"{SVG}g"):
        if "rule" not in classes(rule):
            continue
        text = rule.find(f"{SVG}text")
        box = measured(text, font_size(".chart text"))
        plate = rule.find(f"{SVG}rect")
        if plate is not None:
            x, y, w, h = (float(plate.get(k)) for k in ("x", "y", "width", "height"))
            assert box.within(Box(x, y, x + w, y + h)), "the plate covers its label"
        else:
            assert not any(box.overlaps(mark) for mark in marks(chart)), f"{''.join(text.itertext())} covers a mark"
            assert not any(box.overlaps(other) for other in placed)
