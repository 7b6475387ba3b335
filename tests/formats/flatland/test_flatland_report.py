"""Flatland's report sections (docs/formats/flatland.md): per Test figures, one bar per episode
rising from the rule's worst return, and the table of episodes."""

from __future__ import annotations

import re
import statistics

import pytest

from arbiter.server.formats.flatland.report import report_sections, worst_return
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020


def episode(index, test, normalized, arrived, *, ended="finished", agents=2, **extra):
    return {"index": index, "env": f"{test}/Level_{index}.pkl", "test": test, "num_agents": agents, "steps": 10,
            "max_episode_steps": 22, "normalized_return": normalized, "arrived": arrived,
            "arrived_fraction": arrived / agents if agents else 0.0, "ended": ended,
            "timed_out": ended.endswith("timeout"), **extra}  # fmt: skip


EPISODES = [
    episode(0, "Test_0", -0.5, 1),
    episode(1, "Test_0", -0.25, 2),
    episode(2, "Test_1", -1.0, 0, ended="step_timeout", timeout="step"),
]


def rows_of(html: str, table_class: str) -> list[list[str]]:
    body = html.split(f'<table class="{table_class}">', 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td>(.*?)</td>", row) for row in body.split("<tr>")[2:]]


def test_the_per_test_table_holds_the_scores_figures_and_episode_counts():
    html = report_sections({"score": NeurIPS2020().aggregate(EPISODES)}, EPISODES)
    rows = rows_of(html, "numeric")
    assert rows == [
        ["Test_0", "2", f"{statistics.fmean([-0.5, -0.25]):.4f}", f"{statistics.fmean([0.5, 1.0]):.4f}"],
        ["Test_1", "1", "-1.0000", "0.0000"],
    ]


def test_without_a_score_the_per_test_means_come_from_the_records_and_say_so():
    html = report_sections({}, EPISODES[:2])
    assert "This evaluation has no score" in html
    assert rows_of(html, "numeric")[0] == ["Test_0", "2", "-0.3750", "75.0%"]


@pytest.mark.parametrize(
    "scoring,rule,floor", [("neurips2020", NeurIPS2020(), "-1.00"), ("flatland3", Flatland3(), "0.00")]
)
def test_return_bars_rise_from_the_rules_worst_return(scoring, rule, floor):
    worst = rule.normalized_return(reward=-5.0, max_episode_steps=22, num_agents=2, finished=False)
    assert worst_return({"scoring": scoring}) == worst
    records = [episode(0, "Test_0", worst + 0.5, 1), episode(1, "Test_0", worst, 0, ended="step_timeout")]
    html = report_sections({"scoring": scoring, "score": rule.aggregate(records)}, records)
    chart = html.split('data-chart="normalized-return"', 1)[1].split("</svg>", 1)[0]
    ticks = re.findall(r'<text class="tick" x="62" y="[\d.]+" text-anchor="end">([-\d.]+)</text>', chart)
    assert ticks[0] == floor  # the axis starts at the worst return
    heights = [float(h) for h in re.findall(r'<rect class="mark \w+" data-value="[-\d.e]+" x="[\d.]+" y="[\d.]+" '
                                            r'width="[\d.]+" height="([\d.]+)"', chart)]  # fmt: skip
    assert len(heights) == 2 and heights[0] > 10 * heights[1]  # the worst episode's bar is the lowest


def test_the_episodes_table_has_a_row_per_episode_and_a_dash_for_an_unplayed_ones_arrivals():
    unplayed = {**episode(3, "Test_1", -1.0, 0, ended="not_played", agents=None), "max_episode_steps": None}
    html = report_sections({}, [*EPISODES, unplayed])
    rows = rows_of(html, "numeric episodes")
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert rows[1][3:6] == ["10 / 22", "-0.2500", "2 (100.0%)"]
    assert rows[2][6] == "timed out (step)"
    assert rows[3][2] == "–" and rows[3][5] == "–"
    assert "No episode was recorded." in report_sections({}, [])
