"""Text on the report's charts: how much room a label takes, and a free place for it.

The page loads no font and runs no script, so nothing can measure text when the charts are
written. Widths are estimated from DejaVu Sans Bold, the widest font the stylesheet names and the
one a system without a UI font of its own draws with: a label found to fit by this estimate fits
in whichever of the stylesheet's fonts draws it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LABEL_SIZE = 11  # px, a bar's value label (report_style.py: text.bar-label)
RULE_SIZE = 12  # px, a reference line's label (report_style.py: .chart text)
ASCENT, DESCENT = 0.8, 0.25  # how far glyphs reach above and below the baseline, in em
LABEL_PAD = 2.0  # px between a label and a bar's edge or a line
# Advance widths in em, rounded up over each group's widest bold glyph.
NARROW = frozenset(" .,:;'!|()[]ijlftrI-")
WIDE = frozenset("%mwMW@—")
NARROW_EM, WIDE_EM, CAPITAL_EM, ALPHANUMERIC_EM, SYMBOL_EM = 0.5, 1.12, 0.86, 0.74, 0.9


@dataclass(frozen=True)
class Box:
    """A rectangle in the chart's coordinates (y grows downwards)."""

    left: float
    top: float
    right: float
    bottom: float

    def overlaps(self, other: Box) -> bool:
        across = self.left < other.right and other.left < self.right
        return across and self.top < other.bottom and other.top < self.bottom

    def within(self, other: Box) -> bool:
        return (
            self.left >= other.left
            and self.right <= other.right
            and self.top >= other.top
            and self.bottom <= other.bottom
        )

    def padded(self, by: float) -> Box:
        return Box(self.left - by, self.top - by, self.right + by, self.bottom + by)


def text_width(text: str, size: float) -> float:
    """The width ``text`` takes at font size ``size``, never less than it is drawn."""
    ems = 0.0
    for char in text:
        if char in NARROW:
            ems += NARROW_EM
        elif char in WIDE:
            ems += WIDE_EM
        elif char.isupper():
            ems += CAPITAL_EM
        elif char.isalnum():
            ems += ALPHANUMERIC_EM
        else:
            ems += SYMBOL_EM
    return ems * size


def text_box(x: float, baseline: float, width: float, size: float, anchor: str) -> Box:
    """Where a text of ``width`` drawn at (x, baseline) with ``text-anchor`` ``anchor`` lies."""
    left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
    return Box(left, baseline - ASCENT * size, left + width, baseline + DESCENT * size)


def free_spot(candidates: Sequence[Box], taken: Iterable[Box], bounds: Box) -> int | None:
    """The index of the first candidate inside ``bounds`` that overlaps nothing ``taken``."""
    occupied = list(taken)
    for index, box in enumerate(candidates):
        if box.within(bounds) and not any(box.overlaps(other) for other in occupied):
            return index
    return None


@dataclass(frozen=True)
class BarLabel:
    """A bar's value as text, to draw at the bar's end."""

    text: str
    bar: Box
    room: float  # the width of the bar's slot: a label beyond the bar's end stays within it
    upward: bool  # the bar grows up from its base: its end is its top
    light: bool  # the bar's colour is light: a label inside it is drawn dark


@dataclass(frozen=True)
class Spot:
    """Where a label goes: its anchor point, the box it covers and how it is drawn."""

    x: float
    baseline: float
    anchor: str
    box: Box
    css: str


def _spot(x: float, baseline: float, width: float, size: float, anchor: str, css: str) -> Spot:
    return Spot(x, baseline, anchor, text_box(x, baseline, width, size, anchor), css)


def place_bar_label(label: BarLabel, taken: Sequence[Box], bounds: Box) -> Spot | None:
    """Inside the bar's end when the label fits there (drawn in a colour that contrasts with the
    bar), else just beyond its end if nothing is there and it is no wider than the bar's slot (a
    wider one would read as a neighbour's); None when it fits neither (the bar's tooltip still
    tells its value)."""
    width, height = text_width(label.text, LABEL_SIZE), (ASCENT + DESCENT) * LABEL_SIZE
    bar, centre = label.bar, (label.bar.left + label.bar.right) / 2
    rise, drop = ASCENT * LABEL_SIZE, DESCENT * LABEL_SIZE
    if width + 2 * LABEL_PAD <= bar.right - bar.left and height + 2 * LABEL_PAD <= bar.bottom - bar.top:
        baseline = bar.top + LABEL_PAD + rise if label.upward else bar.bottom - LABEL_PAD - drop
        return _spot(centre, baseline, width, LABEL_SIZE, "middle", "inside on-light" if label.light else "inside")
    baseline = bar.top - LABEL_PAD - drop if label.upward else bar.bottom + LABEL_PAD + rise
    outside = _spot(centre, baseline, width, LABEL_SIZE, "middle", "outside")
    if width > label.room or free_spot([outside.box], taken, bounds) is None:
        return None
    return outside


def place_line_label(text: str, y: float, taken: Sequence[Box], bounds: Box) -> Spot:
    """A reference line's label: above or below the line at its right end, else at its left end,
    wherever it covers nothing; where every spot covers something, the first that stays in the
    chart, ``plated`` (drawn on a plate that keeps it readable over a mark)."""
    width = text_width(text, RULE_SIZE)
    spots = [
        _spot(x, baseline, width, RULE_SIZE, anchor, "free")
        for x, anchor in ((bounds.right - LABEL_PAD * 2, "end"), (bounds.left + LABEL_PAD * 2, "start"))
        for baseline in (y - LABEL_PAD * 2, y + LABEL_PAD * 2 + ASCENT * RULE_SIZE)
    ]
    found = free_spot([spot.box for spot in spots], taken, bounds)
    if found is not None:
        return spots[found]
    inside = next((spot for spot in spots if spot.box.within(bounds)), spots[0])
    return Spot(inside.x, inside.baseline, inside.anchor, inside.box, "plated")
