"""server/report/svg_text.py: how much room a chart's label takes, and the free place found for it.
(Whether the page's labels read right in a browser is in tests/report/test_report_reading.py.)"""

from __future__ import annotations

import pytest

from arbiter.server.report.svg_text import (
    ASCENT,
    DESCENT,
    LABEL_SIZE,
    BarLabel,
    Box,
    free_spot,
    place_bar_label,
    place_line_label,
    text_box,
    text_width,
)

CHART = Box(0.0, 0.0, 400.0, 200.0)


def test_boxes_that_only_touch_do_not_overlap():
    box = Box(10, 10, 20, 20)
    assert box.overlaps(Box(15, 15, 25, 25))
    assert not box.overlaps(Box(20, 10, 30, 20)) and not box.overlaps(Box(10, 20, 20, 30))
    assert box.within(Box(10, 10, 20, 20)) and not box.within(Box(11, 10, 20, 20))
    assert box.padded(2) == Box(8, 8, 22, 22)


def test_wider_glyphs_take_more_room_and_width_grows_with_size():
    assert text_width("iiii", 10) < text_width("aaaa", 10) < text_width("AAAA", 10) < text_width("MMMM", 10)
    assert text_width("12.5 ms", 22) == pytest.approx(2 * text_width("12.5 ms", 11))
    assert text_width("", 11) == 0.0


def test_a_text_box_follows_its_anchor_and_reaches_above_and_below_the_baseline():
    start, middle, end = (text_box(100, 50, 40, 10, anchor) for anchor in ("start", "middle", "end"))
    assert (start.left, middle.left, end.left) == (100, 80, 60)
    assert start.right - start.left == 40
    assert (start.top, start.bottom) == (50 - ASCENT * 10, 50 + DESCENT * 10)


def test_free_spot_is_the_first_candidate_in_bounds_that_covers_nothing():
    taken = [Box(0, 0, 50, 50)]
    candidates = [Box(10, 10, 20, 20), Box(390, 10, 410, 20), Box(60, 10, 70, 20), Box(80, 10, 90, 20)]
    assert free_spot(candidates, taken, CHART) == 2
    assert free_spot(candidates[:2], taken, CHART) is None


def bar_label(text: str, bar: Box, *, room: float = 60.0, upward: bool = True, light: bool = False) -> BarLabel:
    return BarLabel(text, bar, room, upward, light)


def test_a_label_that_fits_in_its_bar_goes_inside_its_end():
    bar = Box(100, 40, 160, 190)  # upward: its end is its top
    spot = place_bar_label(bar_label("1.5", bar), [bar], CHART)
    assert spot is not None and spot.css == "inside" and spot.box.within(bar)
    assert spot.box.top - bar.top < bar.bottom - spot.box.bottom  # near the end, not the base
    light = place_bar_label(bar_label("1.5", bar, light=True), [bar], CHART)
    assert light.css == "inside on-light"  # dark text on a light bar


def test_a_downward_bars_label_sits_at_its_bottom():
    bar = Box(100, 10, 160, 150)
    spot = place_bar_label(bar_label("-3", bar, upward=False), [bar], CHART)
    assert spot.css == "inside" and bar.bottom - spot.box.bottom < spot.box.top - bar.top


def test_a_label_too_big_for_its_bar_goes_beyond_its_end_when_that_is_free():
    bar = Box(100, 180, 160, 190)  # too short for a label inside
    spot = place_bar_label(bar_label("12.5", bar), [bar], CHART)
    assert spot is not None and spot.css == "outside"
    assert spot.box.bottom <= bar.top and not spot.box.overlaps(bar)


def test_a_label_with_nowhere_free_is_left_to_the_tooltip():
    bar = Box(100, 180, 160, 190)
    blocker = Box(90, 100, 170, 180)  # a neighbour's mark right above the bar
    assert place_bar_label(bar_label("12.5", bar), [bar, blocker], CHART) is None
    # Wider than the bar's slot: it would read as a neighbour's label.
    assert place_bar_label(bar_label("a long label", bar, room=20.0), [bar], CHART) is None


def test_a_line_label_goes_to_a_free_end_of_its_line():
    spot = place_line_label("budget 5 s", 100.0, [], CHART)
    assert spot.css == "free" and spot.anchor == "end" and spot.box.bottom <= 100.0
    right_taken = [Box(200, 0, 400, 200)]
    moved = place_line_label("budget 5 s", 100.0, right_taken, CHART)
    assert moved.css == "free" and moved.anchor == "start" and not moved.box.overlaps(right_taken[0])


def test_a_line_label_with_no_free_spot_is_plated_inside_the_chart():
    everything = [CHART]
    spot = place_line_label("mean 0.25", 100.0, everything, CHART)
    assert spot.css == "plated" and spot.box.within(CHART)


def test_label_sizes_are_what_the_stylesheet_draws():
    # A bar label's box is as tall as its glyphs reach at the bar-label size.
    bar = Box(0, 0, 200, 200)
    spot = place_bar_label(bar_label("1", bar), [bar], CHART)
    assert spot.box.bottom - spot.box.top == pytest.approx((ASCENT + DESCENT) * LABEL_SIZE)
