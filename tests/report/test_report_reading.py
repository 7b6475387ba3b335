"""The report reads right: bars rise from the worst value, labels sit where they can be read,
counts are whole numbers and an axis labels its negative side.

Every page here comes from a real evaluation (`arbiter run` with a real redis-server and an agent
process); its charts are read back as SVG geometry. Text sizes are measured with DejaVu Sans, the
font the page falls back to on a system with no UI font of its own (and the widest it names), so a
label found to fit here fits wherever the page is opened.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import paths
import pytest
import test_report
from report_pages import SVG, assert_labels_readable, bar_labels, bars, charts, classes, ticks

from arbiter.server.report.page import load_results, render_report
from arbiter.server.report.svg import Axis, Plot

REPO = paths.REPO


# --- reading the charts back -------------------------------------------------------------------


# --- real evaluations ----------------------------------------------------------------------------


def flatland_run(folder: Path, tests: str, redis_url: str, *extra: str) -> tuple[str, dict, list[dict]]:
    """`arbiter run` on the tiny test set with the agent that overruns its step budget once."""
    agent = folder / "agent.py"
    agent.write_text(test_report.AGENT, encoding="utf-8")
    results = folder / "results"
    done = test_report.run_arbiter(
        "run", "--tests", tests, "--redis-url", redis_url, "--service-id", "t-" + uuid.uuid4().hex[:12],
        "--results", str(results), "--step-timeout", "0.3", "--quiet", *extra, "--", sys.executable, str(agent),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = test_report.run_arbiter("report", str(results))
    assert written.returncode == 0, written.stderr
    summary, episodes = load_results(results)
    return (results / "report.html").read_text(encoding="utf-8"), summary, episodes


@pytest.fixture(scope="module")
def neurips(redis_server, tiny_tests, tmp_path_factory) -> tuple[str, dict, list[dict]]:
    return flatland_run(tmp_path_factory.mktemp("neurips"), tiny_tests, redis_server.url)


@pytest.fixture(scope="module")
def flatland3(redis_server, tiny_tests, tmp_path_factory) -> tuple[str, dict, list[dict]]:
    return flatland_run(tmp_path_factory.mktemp("flatland3"), tiny_tests, redis_server.url, "--scoring", "flatland3")


# --- better is taller ----------------------------------------------------------------------------


@pytest.mark.parametrize(("run", "floor"), [("neurips", "-1.00"), ("flatland3", "0.00")])
def test_return_bars_rise_from_the_worst_return(run, floor, request) -> None:
    """A timed-out episode scores the floor (−1 under NeurIPS 2020, 0 under flatland3): every bar
    starts there, so a better episode is a taller bar."""
    page, summary, episodes = request.getfixturevalue(run)
    assert [r["timeout"] for r in episodes] == [None, "step", None]
    chart = charts(page)["normalized-return"]
    axis = ticks(chart)
    base = axis[floor]
    assert base == max(axis.values()), "the floor is the axis's lowest tick"
    drawn = bars(chart)
    values = [float(rect.get("data-value")) for _, rect in drawn]
    assert values == pytest.approx([r["normalized_return"] for r in episodes], rel=1e-5)
    for box, _ in drawn:
        assert box.bottom == pytest.approx(base, abs=0.01), "every bar starts at the floor"
    heights = [(float(rect.get("data-value")), box.bottom - box.top) for box, rect in drawn]
    for value, height in heights:
        for other, other_height in heights:
            if value > other:
                assert height > other_height, f"a return of {value} is drawn shorter than {other}"
    timed_out = heights[1]
    assert timed_out[1] <= 1.0, "the timed-out episode, at the floor, is a sliver"


# --- counts are whole numbers --------------------------------------------------------------------


def test_counts_and_step_numbers_are_whole_numbers_everywhere(neurips) -> None:
    page, summary, episodes = neurips
    text = re.sub(r"<[^>]+>", " ", page)
    assert not re.findall(r"\d\.\d+ (?:steps?|episodes?)\b", text)
    steps = re.findall(r"(\S+) steps; min", text)
    assert len(steps) == 4 and all(re.fullmatch(r"\d+", n) for n in steps)  # three episodes and all steps
    # A summary whose counts went through floats (another tool rewrote it) still reads as counts.
    floated = {**summary, "episodes": {k: float(v) for k, v in summary["episodes"].items()}}
    floated["timing"] = {**summary["timing"], "step_think_s": {**summary["timing"]["step_think_s"], "n": 12.0}}
    floated["counters"] = {name: float(value) for name, value in summary["counters"].items()}
    refloated = [{**r, "steps": float(r["steps"]), "arrived": float(r["arrived"])} for r in episodes]
    page = render_report(floated, refloated, source="r")
    counts = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page))
    assert [counts[k] for k in ("recorded", "finished", "timed out", "abandoned", "not played")] == [
        "3 of 3", "2", "1", "0", "0"
    ]  # fmt: skip
    assert "all steps: 12 steps; min" in page
    cells = re.findall(r"<td>(\d+(?:\.\d+)?) / (\d+(?:\.\d+)?)</td>", page)
    assert cells == [(str(r["steps"]), str(r["max_episode_steps"])) for r in episodes]
    arrived = re.findall(r"<td>([\d.]+) \(\d+\.\d%\)</td>", page)
    assert arrived == [str(r["arrived"]) for r in episodes]
    [counters] = re.findall(r"<h2>Counters</h2>(.*?)</table>", page)
    assert re.findall(r"<tr><td>(\w+)</td><td>([^<]*)</td></tr>", counters) == [
        (name, str(value)) for name, value in sorted(summary["counters"].items())
    ]


# --- labels on the bars --------------------------------------------------------------------------


def test_every_bar_is_labelled_where_its_label_can_be_read(neurips) -> None:
    page, _, episodes = neurips
    drawn = charts(page)
    returns = drawn["normalized-return"]
    assert ["".join(t.itertext()) for t in bar_labels(returns)] == [f"{r['normalized_return']:.2f}" for r in episodes]
    arrived = drawn["arrived-fraction"]
    assert ["".join(t.itertext()) for t in bar_labels(arrived)] == [
        f"{100 * r['arrived_fraction']:.1f}%" for r in episodes
    ]
    for chart in drawn.values():
        assert_labels_readable(chart)
    # the timed-out episode's sliver of a bar cannot hold its label: it sits above it
    assert classes(bar_labels(returns)[1]) == ["bar-label", "outside"]


def crowded(count: int, values: list[float], css: list[str]) -> ET.Element:
    plot = Plot("crowded", title="t", count=count, axis=Axis(0.0, 1.0), tick_format=str, x_labels=[])
    for i, (value, kind) in enumerate(zip(values, css, strict=True)):
        plot.bar(i, value, tip="", css=kind, label=f"{value:.2f}")
    plot.rule(sum(values) / len(values), label=f"mean {sum(values) / len(values):.2f}", css="mean")
    return ET.fromstring(plot.svg())


@pytest.mark.parametrize(
    ("values", "css"),
    [
        ([0.9] * 12, ["finished"] * 12),  # tall bars under the mean's label at either end
        ([0.05, 0.9, 0.02, 0.5, 0.95, 0.3], ["finished", "abandoned", "timeout", "skipped", "finished", "abandoned"]),
        ([0.3, 0.6, 0.9] * 20, ["finished", "timeout", "skipped"] * 20),  # too narrow for any label
    ],
    ids=["tall", "mixed", "narrow"],
)
def test_labels_never_overflow_or_cover_a_bar(values, css) -> None:
    chart = crowded(len(values), values, css)
    assert_labels_readable(chart)
    labels = bar_labels(chart)
    if len(values) > 40:
        assert labels == [], "a bar too narrow for its label keeps it in its tooltip"
    else:
        assert len(labels) == len(values)


# --- the negative side of an axis is labelled ----------------------------------------------------


def test_the_diambra_score_chart_labels_its_negative_side(redis_server, tmp_path) -> None:
    pytest.importorskip("diambra.arena")
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "diambra", "--set", "game=doapp",
         "--set", "episodes=1", "--set", "frame_shape=[64, 64, 1]", "--redis-url", redis_server.url,
         "--service-id", "t-" + uuid.uuid4().hex[:12], "--results", str(results), "--quiet", "--",
         sys.executable, str(REPO / "examples" / "diambra_agent" / "agent.py")],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert test_report.run_arbiter("report", str(results)).returncode == 0
    _, [record] = load_results(results)
    low, high = record["bounds"]
    assert low < 0 < high
    chart = charts((results / "report.html").read_text(encoding="utf-8"))["diambra-score-curves"]
    values = {float(label.replace(",", "")): y for label, y in ticks(chart).items()}
    assert min(values) <= low < 0, f"no labelled value at or below the lowest reward {low}: {sorted(values)}"
    x_ticks = [t for t in chart.iter(f"{SVG}text") if "tick" in classes(t) and t.get("text-anchor") == "middle"]
    x_values = [float("".join(t.itertext()).replace(",", "")) for t in x_ticks]
    assert min(x_values) <= low, f"the reward axis labels nothing at or below {low}: {x_values}"
    curve_bottom = max(
        float(p.split(",")[1]) for line in chart.iter(f"{SVG}polyline") for p in line.get("points").split()
    )
    assert curve_bottom <= values[min(values)] + 0.01, "the curves stay within the labelled axis"


def test_a_last_line_cut_short_is_left_out_and_the_page_says_so(redis_server, tiny_tests, tmp_path) -> None:
    """The episodes the page shows and the counts summary.json holds differ when the last line was
    cut short: the page says which line was left out, so that neither reads as wrong."""
    page, summary, episodes = flatland_run(tmp_path, tiny_tests, redis_server.url)
    assert "cut short" not in page
    results = tmp_path / "results"
    whole = (results / "episodes.jsonl").read_bytes()
    (results / "episodes.jsonl").write_bytes(whole[:-40])
    written = test_report.run_arbiter("report", str(results))
    assert written.returncode == 0, written.stderr
    kept = load_results(results)[1]
    assert kept == episodes[:-1] and summary["episodes"]["recorded"] == len(episodes) == 3
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (results / "report.html").read_text(encoding="utf-8")))
    assert "episodes.jsonl ends in a line cut short" in text
    assert "the episodes shown are the 2 records before it" in text
    assert "Test_0/Level_1.pkl" in text and "Test_0/Level_2.pkl" not in text  # the cut one is nowhere


def test_the_page_names_the_participant_and_escapes_the_name(redis_server, tiny_tests, tmp_path) -> None:
    """`arbiter run --participant NAME` (as a hosted submission): the page says whose evaluation
    it is, at its top and among the run's facts, as text however the name is spelt."""
    name = '<script>alert("x")</script> O\'Brien "q" & co'
    page, summary, _ = flatland_run(tmp_path, tiny_tests, redis_server.url, "--participant", name)
    assert summary["submission"]["participant"] == name
    assert "<script" not in page and 'alert("x")' not in page
    assert page.count(html.escape(name)) == 2
    top = re.search(r'<p class="eyebrow">(.*?)</p>', page).group(1)
    assert html.unescape(top).startswith(f"arbiter evaluation report · {name} · ")
    assert f"<tr><td>participant</td><td>{html.escape(name)}</td></tr>" in page


def test_the_budget_charts_have_one_slot_per_item_of_many_episodes(redis_server, tmp_path) -> None:
    """Two-phase: a training run is one item of many episodes, its planning and step times on its
    last record. The budget charts give each item one slot, labelled with its index, and a dot."""
    results = tmp_path / "results"
    done = test_report.run_arbiter(
        "run", "--competition", "two-phase-cartpole", "--set", "num_episodes=1", "--set", "phase2.num_runs=1",
        "--redis-url", redis_server.url, "--service-id", "t-" + uuid.uuid4().hex[:12], "--results", str(results),
        "--quiet", "--", sys.executable, "-m", "arbiter.client.reinforcelab",
        str(REPO / "examples" / "reinforcelab_cartpole"), timeout_s=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert test_report.run_arbiter("report", str(results)).returncode == 0
    _, records = load_results(results)
    items = [str(r["index"]) for r in records if r["last_of_item"]]
    assert len(records) > len(items) == 3  # phase 1's episode, the training run, its evaluation episode
    drawn = charts((results / "report.html").read_text(encoding="utf-8"))
    for name in ("planning-time", "step-time-max"):
        labels = ["".join(t.itertext()) for t in drawn[name].iter(f"{SVG}text") if "tick" in classes(t)]
        assert [label for label in labels if label.isdigit()] == items, name
        marks = [m for m in drawn[name].iter() if "mark" in classes(m)]
        assert len(marks) == len(items), name
