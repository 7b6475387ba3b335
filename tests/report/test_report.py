"""`arbiter report`: a self-contained report.html, rendered for real in headless Chromium.

The page is built from a real evaluation (the `arbiter` command, a real redis-server, an agent
process); Chromium screenshots it and dumps its DOM, and the test checks that the screenshot
is not blank and that every chart has one mark per data point. The other tests check the page
for each kind of result (scored, failed, interrupted, no episode) without a browser.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from html import escape
from pathlib import Path

import numpy as np
import paths
import pytest
from report_pages import CHROMIUM_INSTALL, charts_of, count_near, headless

from arbiter.server.cli.main import main
from arbiter.server.report.charts import DURATION_TICKS, fmt_duration, fmt_share
from arbiter.server.report.page import load_results, render_report, write_report
from arbiter.server.report.svg import Axis, linear_axis, log_axis

REPO = paths.REPO
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
WINDOW = (1200, 2400)
BLUE = (0x2F, 0x6F, 0xD8)  # --blue in report_style.py: finished episodes' bars and dots
RED = (0xCF, 0x22, 0x2E)  # --red: timed-out episodes, budget lines

# An agent that overruns the step budget once, so the report shows a timed-out episode too.
AGENT = textwrap.dedent(
    """
    import time
    from arbiter.client import RemoteClient, TimeoutException

    client = RemoteClient()
    episode = 0
    while True:
        observation, info = client.env_create()
        if not observation:
            break
        episode += 1
        step = 0
        try:
            while True:
                if episode == 2 and step == 3:
                    time.sleep(0.6)
                actions = {handle: (step + handle) % 5 for handle in range(client.env.get_num_agents())}
                observation, rewards, done, info = client.env_step(actions)
                step += 1
                if done["__all__"]:
                    break
        except TimeoutException:
            pass
    print(client.submit())
    """
)


# --- helpers -----------------------------------------------------------------------------------


def run_arbiter(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def episode(index: int, **overrides) -> dict:
    record = {
        "index": index,
        "env": f"Test_0/Level_{index}.pkl",
        "test": "Test_0",
        "level": f"Level_{index}",
        "num_agents": 2,
        "max_episode_steps": 100,
        "steps": 100,
        "reward": -150.0,
        "normalized_return": -0.75,
        "arrived": 1,
        "arrived_fraction": 0.5,
        "timed_out": False,
        "timeout": None,
        "abandoned": False,
        "skipped": False,
        "invalid_actions": 0,
        "malfunctions": 0,
        "wall_s": 0.5,
        "planning_s": 0.02,
        "step_think_s": {"n": 99, "min": 1e-4, "mean": 3e-4, "p99": 1e-3, "max": 2e-3},
        "seed": 1001,
        "debug": False,
        "elapsed_s": 0.5 * (index + 1),
    }
    record.update(overrides)
    return record


SPREAD = {"n": 3, "std": 0.1, "ci95": None}
SUMMARY = {
    "state": "SUCCESS",
    "debug": False,
    "competition": "flatland-neurips2020",
    "scoring": "neurips2020",
    "service_id": "T12345",
    "score": {
        "primary": -0.75,
        "secondary": 0.5,
        "primary_name": "mean normalized return",
        "secondary_name": "mean fraction of agents arrived",
        "per_test": {"primary": {"Test_0": -0.75}, "secondary": {"Test_0": 0.5}},
        "spread": {"primary": SPREAD, "secondary": SPREAD},
    },
    "termination_cause": "all 3 episodes evaluated",
    "episodes": {"total": 3, "recorded": 3, "finished": 3, "timed_out": 0, "abandoned": 0, "skipped": 0},
    "budgets": {"planning_s": 300, "step_s": 5, "overall_s": 28800, "idle_s": 300, "max_successive_timeouts": 10},
    "counters": {},
    "timing": {
        "evaluation_s": 1.5,
        "step_think_s": {"n": 297, "min": 1e-4, "mean": 3e-4, "p99": 1e-3, "max": 2e-3},
        "server_step_s": {"n": 300, "min": 1e-4, "mean": 2e-4, "p99": 5e-4, "max": 1e-3},
        "record_durable_s": {"n": 3, "min": 1.5e-4, "mean": 0.0123, "p99": 0.03, "max": 0.03},
    },
    "seed": 1001,
    "versions": {"python": "3.11", "arbiter": "0.1.0"},
}


def unscored(state: str, cause: str) -> dict:
    summary = copy.deepcopy(SUMMARY)
    summary["state"] = state
    summary["termination_cause"] = cause
    summary["score"] = {key: None for key in SUMMARY["score"]}
    return summary


def write_results(folder: Path, summary: dict, episodes: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    if episodes:
        lines = "".join(json.dumps(record) + "\n" for record in episodes)
        (folder / "episodes.jsonl").write_text(lines, encoding="utf-8")
    return folder


def assert_self_contained(page: str) -> None:
    """Nothing to fetch and nothing to run: the page must open with no network."""
    lowered = page.lower()
    for forbidden in ("<script", "<link", "<img", "<iframe", "src=", "href=", "@import", "url("):
        assert forbidden not in lowered, forbidden
    # the only URL is the SVG namespace, which is a name, not something fetched
    assert lowered.count("://") == lowered.count('xmlns="http://www.w3.org/2000/svg"')


# --- the page for each kind of result --------------------------------------------------------


def test_a_scored_evaluation_shows_scores_spread_budgets_and_a_mark_per_episode() -> None:
    episodes = [episode(0), episode(1, normalized_return=-1.0, timed_out=True, timeout="step"), episode(2)]
    summary = copy.deepcopy(SUMMARY)
    summary["score"]["spread"]["primary"] = {"n": 12, "std": 0.1234, "ci95": [-0.81, -0.69]}
    page = render_report(summary, episodes, source="results/run-1")
    assert_self_contained(page)
    assert "-0.7500" in page and "mean normalized return" in page and "0.5000" in page
    assert "std 0.1234" in page and "95% CI [-0.8100, -0.6900]" in page
    assert "all 3 episodes evaluated" in page and "Test_0" in page
    assert "5 min" in page and "8 h" in page  # the planning and overall budgets
    assert "timed out (step)" in page
    # what each item's record took to reach the disk, beside the steps' timing
    label = escape("each item's record made durable")
    assert f"<td>{label}</td><td>3</td><td>{fmt_duration(1.5e-4)}</td>" in page
    assert fmt_duration(0.0123) in page
    charts = charts_of(page).charts
    assert charts == {
        "normalized-return": [3, 3],
        "arrived-fraction": [3, 3],
        "step-time": [4, 4],  # three episodes and all steps together
        "planning-time": [3, 3],
        "step-time-max": [3, 3],
        "overall-time": [1, 1],
    }


@pytest.mark.parametrize(
    ("state", "cause"),
    [("FAILED", "overall budget of 10 s exceeded after 10.2 s; no score"), ("INTERRUPTED", "stopped by SIGTERM")],
)
def test_an_unscored_evaluation_says_so_and_still_shows_its_episodes(state: str, cause: str) -> None:
    page = render_report(unscored(state, cause), [episode(0), episode(1)], source="r")
    assert_self_contained(page)
    assert "No score" in page and state in page and cause in page
    assert "these are means over its recorded episodes only" in page
    assert charts_of(page).charts["normalized-return"] == [2, 2]


def test_an_evaluation_with_no_episode() -> None:
    summary = unscored("FAILED", "idle budget of 0.5 s exceeded waiting for a client; no episode was played")
    summary["episodes"] = {"total": 3, "recorded": 0, "finished": 0, "timed_out": 0, "abandoned": 0, "skipped": 0}
    summary["timing"] = {"evaluation_s": 0.0, "step_think_s": None, "server_step_s": None}
    page = render_report(summary, [], source="r")
    assert_self_contained(page)
    assert "No score" in page and "No episode was recorded" in page
    assert charts_of(page).charts == {"overall-time": [1, 1]}


def test_unplayed_and_planning_timeouts_have_no_times_but_a_place() -> None:
    episodes = [
        episode(0),
        episode(1, timed_out=True, timeout="planning", planning_s=None, step_think_s=None, steps=0),
        episode(2, skipped=True, num_agents=None, planning_s=None, step_think_s=None, wall_s=0.0, steps=0),
    ]
    page = render_report(SUMMARY, episodes, source="r")
    charts = charts_of(page).charts
    assert charts["normalized-return"] == [3, 3]
    assert charts["step-time"] == [2, 2]  # episode 0 and all steps
    assert charts["planning-time"] == [2, 2]  # the planning timeout sits on the budget line
    assert charts["step-time-max"] == [1, 1]
    assert "not played" in page


def test_a_debug_run_is_labelled() -> None:
    assert "debug run" not in render_report(SUMMARY, [episode(0)], source="r")
    page = render_report({**SUMMARY, "debug": True}, [episode(0, debug=True)], source="r")
    assert '<span class="badge debug">debug run</span>' in page


def test_participant_strings_are_escaped() -> None:
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    summary = copy.deepcopy(SUMMARY)
    summary.update(client_version=hostile, termination_cause=hostile, service_id=hostile)
    summary["counters"] = {hostile: 1}
    summary["score"]["per_test"] = {"primary": {hostile: -0.5}, "secondary": {hostile: 0.5}}
    record = {**episode(0), "env": hostile, "test": hostile, "index": hostile, "timeout": hostile, "timed_out": True}
    page = render_report(summary, [record], source=hostile)
    assert "<script" not in page and "<img" not in page and 'alert("x")' not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)") >= 8


def test_odd_values_do_not_break_the_page() -> None:
    """A hand-edited or foreign file: strings and nulls where numbers belong, missing keys."""
    odd = [episode(0, normalized_return="?", arrived_fraction=None, planning_s="slow", step_think_s={"n": 0})]
    page = render_report({"state": "SUCCESS", "score": None}, odd, source="r")
    assert charts_of(page).charts["normalized-return"] == [1, 1]


# --- the results folder and the command ----------------------------------------------------------


def test_write_report_defaults_to_the_results_folder(tmp_path: Path) -> None:
    results = write_results(tmp_path / "r", SUMMARY, [episode(0), episode(1), episode(2)])
    assert write_report(results) == results / "report.html"
    out = tmp_path / "elsewhere" / "page.html"
    assert main(["report", str(results), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_an_out_with_a_file_or_a_folder_in_the_way_is_a_clear_error(tmp_path: Path, capsys) -> None:
    results = write_results(tmp_path / "r", SUMMARY, [episode(0), episode(1), episode(2)])
    (tmp_path / "afile").write_text("kept", encoding="utf-8")
    assert main(["report", str(results), "--out", str(tmp_path / "afile" / "sub" / "r.html")]) == 2
    assert f"{str(tmp_path / 'afile')!r} is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "kept"
    assert main(["report", str(results), "--out", str(tmp_path)]) == 2
    assert f"--out {str(tmp_path)!r} is a folder: name the file to write" in capsys.readouterr().err


def test_no_episodes_file_is_fine_when_none_was_recorded(tmp_path: Path) -> None:
    summary = unscored("FAILED", "no episode was played")
    summary["episodes"]["recorded"] = 0
    results = write_results(tmp_path / "r", summary, [])
    assert load_results(results) == (summary, [])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no such directory"),
        (lambda d: d.mkdir(), "neither summary.json nor episodes.jsonl"),
        (lambda d: (d.mkdir(), (d / "episodes.jsonl").write_text("{}\n")), "no summary.json"),
        (lambda d: write_results(d, SUMMARY, []), "lists recorded episodes"),
        (lambda d: (write_results(d, SUMMARY, [episode(0)]), (d / "episodes.jsonl").write_text("{\n")), "line 1"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text("[1]")), "not hold a JSON object"),
    ],
    ids=["missing", "empty", "unfinished", "lost-episodes", "bad-line", "bad-summary"],
)
def test_a_folder_that_is_not_a_results_folder_is_a_clear_error(tmp_path, capsys, make, message) -> None:
    folder = tmp_path / "r"
    make(folder)
    assert main(["report", str(folder)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("arbiter: error:") and message in error


# --- the chart primitives ------------------------------------------------------------------------


def test_axes() -> None:
    assert Axis(0.0, 1.0).ticks() == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert linear_axis([-0.3, -1.0], lo=-1.0, hi=0.0) == Axis(-1.0, 0.0)
    assert linear_axis([1.7], lo=0.0, hi=1.0) == Axis(0.0, 2.0)
    axis = log_axis([3e-4, 0.02, 300.0], DURATION_TICKS)
    assert (axis.lo, axis.hi) == (1e-4, 600.0)
    assert axis.ticks()[0] == 1e-4 and axis.ticks()[-1] == 600.0 and len(axis.ticks()) <= 8
    assert axis.fraction(1e-4) == 0.0 and axis.fraction(600.0) == 1.0 and axis.fraction(0.0) == 0.0
    assert [fmt_duration(v) for v in (0, 4.2e-5, 0.0123, 5, 300, 28800)] == [
        "0 s",
        "42 µs",
        "12.3 ms",
        "5 s",
        "5 min",
        "8 h",
    ]
    assert fmt_share(0.5) == "50.0%" and fmt_share(1e-5) == "< 0.1%" and fmt_share(None) == "–"


# --- in a real browser -----------------------------------------------------------------------------


@pytest.mark.timeout(900)  # a first run may install chromium
def test_the_report_of_a_real_evaluation_renders_in_chromium(
    chromium, redis_url, service_id, tiny_tests, tmp_path_factory
) -> None:
    from PIL import Image

    work = tmp_path_factory.mktemp("report")
    agent = work / "agent.py"
    agent.write_text(AGENT, encoding="utf-8")
    results = work / "results"
    done = run_arbiter(
        "run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
        "--results", str(results), "--step-timeout", "0.3", "--quiet", "--", sys.executable, str(agent),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary, episodes = load_results(results)
    assert summary["state"] == "SUCCESS" and len(episodes) == 3
    assert [record["timeout"] for record in episodes] == [None, "step", None]

    written = run_arbiter("report", str(results))
    assert written.returncode == 0, written.stderr
    page = results / "report.html"
    assert str(page) in written.stdout

    dom = headless(chromium, page, work / "profile", "--dump-dom").stdout
    parsed = charts_of(dom)
    assert parsed.scripts == 0
    assert parsed.charts == {
        "normalized-return": [3, 3],
        "arrived-fraction": [3, 3],
        "step-time": [4, 4],
        "planning-time": [3, 3],
        "step-time-max": [3, 3],
        "overall-time": [1, 1],
    }
    assert "SUCCESS" in dom and f"{summary['score']['primary']:.4f}" in dom and "timed out (step)" in dom

    screenshot = work / "report-screenshot.png"
    headless(chromium, page, work / "profile", f"--screenshot={screenshot}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars")  # fmt: skip
    print(f"screenshot of the report: {screenshot}")
    with Image.open(screenshot) as image:
        assert image.size == WINDOW
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16).reshape(-1, 3)
    inked = float(np.mean(pixels.sum(axis=1) < 600))
    assert inked > 0.01, f"the screenshot is nearly blank ({inked:.2%} of it is not white)"
    # the charts were drawn, not only the text: blue bars and dots, a red bar, the red budget lines
    assert count_near(pixels, BLUE) > 2000
    assert count_near(pixels, RED) > 500


def test_a_report_with_no_episode_opens_in_chromium(chromium, redis_url, service_id, tiny_tests, tmp_path) -> None:
    """A real evaluation that no agent ever joined: FAILED, no score, no episodes.jsonl."""
    results = tmp_path / "results"
    done = run_arbiter(
        "serve", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
        "--results", str(results), "--idle-timeout", "0.3", "--quiet",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert not (results / "episodes.jsonl").exists()
    assert run_arbiter("report", str(results)).returncode == 0
    dom = headless(chromium, results / "report.html", tmp_path / "profile", "--dump-dom").stdout
    assert "No score" in dom and "FAILED" in dom
    assert charts_of(dom).charts == {"overall-time": [1, 1]}


def test_ci_installs_chromium_podman_and_perf_and_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    # the report's rendering; the container backend; scripts/step_trace.py's scheduler events
    for program in ("chromium", "podman", "runc", "perf"):
        assert f"command -v {program} >/dev/null" in ci
    assert f"|| ({CHROMIUM_INSTALL} podman runc linux-perf)" in ci
    assert 'pip install -e ".[dev]" && python -m pytest' in readme
    assert 'pip install --quiet --disable-pip-version-check -e ".[dev]"' in ci and "python3 -m pytest" in ci
