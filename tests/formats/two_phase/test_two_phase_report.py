"""`arbiter report` on a two-phase results folder: the format's sections, read back from the HTML.

The results come from real evaluations (the evaluator in this process, a real redis-server,
RemoteEnv) on the configurable fake env, so every figure on the page is known exactly: phase 1's
returns (one timed out), and per run the learning curve (its goal line and convergence point) and
the evaluation returns. The finished report is also opened in headless Chromium (test_report.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import paths
import pytest
import report_pages as test_report
from harness import finish, running_service, wait_for
from report_pages import assert_labels_readable, bar_labels, charts, ticks

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import TimeoutException
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.formats.base import reset_seed

REPO = paths.REPO


class Page(HTMLParser):
    """What a reader sees of the report: section titles, table rows, and per chart its marks (css,
    value, tooltip, position), reference lines (css, label) and curves (css, points)."""

    def __init__(self, html: str):
        super().__init__()
        self.sections: list[str] = []
        self.tables: list[list[dict[str, Any]]] = []
        self.notes: list[str] = []
        self.charts: dict[str, dict[str, Any]] = {}
        self._chart: dict[str, Any] | None = None
        self._open: list[tuple[str, dict[str, Any] | None]] = []  # (tag, the record its text goes to)
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        classes = values.get("class", "").split()
        target: dict[str, Any] | None = self._open[-1][1] if self._open else None
        if tag == "svg" and "chart" in classes:
            self._chart = {"points": int(values["data-points"]), "marks": [], "rules": [], "lines": []}
            self.charts[values["data-chart"]] = self._chart
        elif self._chart is not None and "mark" in classes:
            target = {"css": " ".join(c for c in classes if c != "mark"), "value": float(values["data-value"]),
                      "title": "", "at": (values.get("cx"), values.get("cy"))}  # fmt: skip
            self._chart["marks"].append(target)
        elif self._chart is not None and "rule" in classes:
            target = {"css": " ".join(c for c in classes if c != "rule"), "label": ""}
            self._chart["rules"].append(target)
        elif tag == "polyline":
            points = [tuple(float(v) for v in p.split(",")) for p in values["points"].split()]
            target = {"css": values["class"], "n": int(values["data-points"]), "points": points}
            self._chart["lines"].append(target)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            target = {"cells": []}
            self.tables[-1].append(target)
        elif tag in ("h2", "p"):
            target = {"text": ""}
            (self.sections if tag == "h2" else self.notes).append(target)
        self._open.append((tag, target))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            opened, _ = self._open.pop()
            if opened == tag:
                break
        if tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        if not self._open or self._open[-1][1] is None:
            return
        target = self._open[-1][1]
        tag = self._open[-1][0]
        if "cells" in target and tag in ("td", "th"):
            target["cells"].append(data)
        elif "text" in target:
            target["text"] += data
        elif "title" in target and tag == "title":
            target["title"] += data
        elif "label" in target and tag == "text":
            target["label"] += data

    def runs_table(self) -> list[list[str]]:
        """The rows of the phase-2 table (one per run)."""
        for rows in self.tables:
            if rows and rows[0]["cells"] == ["run", "converged", "step", "scored", "episodes", "eval return"]:
                return [row["cells"] for row in rows[1:]]
        raise AssertionError("no table of the phase-2 runs")


def headline(html: str) -> list[tuple[str, str, str]]:
    """The figures at the top of the page: value, name and which way is better."""
    return re.findall(
        r'<div class="value">([^<]*)</div><div class="label">([^<]*)</div><div class="direction">([^<]*)</div>', html
    )


def fake_spec(**extra: Any) -> Any:
    """Two-phase on the fake env: 5-step episodes worth 1 per step, +1 per action 1."""
    data: dict[str, Any] = {
        "format": "two-phase", "seed": 7, "env_id": "fake_envs:CountingEnv", "env_kwargs": {"length": 5, "bonus": 1.0},
        "reward_per_step": [1.0, 2.0], "worst_return": -3.0, "num_episodes": 2,
        "phase2": {"max_steps": 200, "goal_reward": 9.0, "stability_window": 2, "num_runs": 2,
                   "step_s": 2.0, "planning_s": 2.0, "run_budget_s": 60.0},
        "budgets": {"step_s": 0.3, "planning_s": 2.0, "idle_s": 10.0, "overall_s": 120.0},
    }  # fmt: skip
    data.update(extra)
    return spec_from_dict("report", data)


def episode(env: RemoteEnv, action: int, steps: int = 5) -> None:
    env.reset()
    for _ in range(steps):
        env.step(action)


def train(env: RemoteEnv, actions: Iterator[int]) -> None:
    """Episodes with ``actions`` (one per episode) until the evaluator ends the run."""
    with pytest.raises(StopIteration):
        for action in actions:
            episode(env, action)


def report(results: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "arbiter.server.cli", "report", str(results)], capture_output=True,
                          text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return (results / "report.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def scored(redis_server, tmp_path_factory) -> Path:
    """Phase 1: returns 10 and a step timeout (worst return -3). Run 0 converges at step 30
    (returns 5, 10, 5, 10, 10, 10), evaluation 10, 10; run 1 stays at 5 to max_steps 200 (40
    episodes, penalized 1.5 × 200), evaluation 5, 5."""
    results, service_id = tmp_path_factory.mktemp("scored") / "results", "t-" + uuid.uuid4().hex[:12]
    url = redis_server.url
    with running_service(fake_spec(), tests=None, results=str(results), redis_url=url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=url, service_id=service_id, reply_timeout_s=10)
        episode(env, 1)
        env.reset()
        env.step(1)
        wait_for(lambda: service.evaluation.counters["step_timeouts"] == 1, timeout_s=5, what="the step timeout")
        with pytest.raises(TimeoutException):
            env.step(1)
        for stage, actions in zip(env.stages[1:], ([0, 1, 0, 1, 1, 1, 1], [1, 1], iter(int, 1), [0, 0]), strict=True):
            env.begin_stage(stage)
            if stage["stage"] == "train":
                train(env, iter(actions))
            else:
                for action in actions:
                    episode(env, action)
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    return results


def test_the_report_shows_phase_1_returns_and_per_run_the_learning_curve_and_evaluation_returns(scored):
    html = report(scored)
    page = Page(html)
    assert "<script" not in html.lower()
    assert [s["text"] for s in page.sections][:2] == ["Phase 1: returns", "Phase 2: training runs"]
    assert headline(html) == [
        ("3.5000", "phase 1 mean return", "higher is better"),
        ("165", "phase 2 mean convergence step", "lower is better"),  # a step number: a whole one
        ("7.5000", "phase 2 mean evaluation return", "higher is better"),
    ]

    phase1 = page.charts["phase1-returns"]
    assert phase1["points"] == 2
    assert [(m["css"], m["value"], m["title"]) for m in phase1["marks"]] == [
        ("finished", 10.0, f"episode 0 (seed {reset_seed(7, 1, 0)}): 10"),
        ("timeout", -3.0, f"episode 1 (seed {reset_seed(7, 1, 1)}): -3"),  # the worst return, not its partial 2
    ]
    assert phase1["rules"] == [{"css": "mean", "label": "mean 3.5"}]

    for run, returns, converged in ((0, [5, 10, 5, 10, 10, 10], 30), (1, [5] * 40, None)):
        curve = page.charts[f"learning-curve-{run}"]
        [line] = curve["lines"]
        assert line["css"] == "line train" and line["n"] == len(returns)
        xs = [x for x, _ in line["points"]]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)  # one point per episode, in env-step order
        assert curve["rules"] == [{"css": "goal", "label": "goal 9"}]
        if converged is None:
            assert curve["marks"] == [] and curve["points"] == len(returns)
        else:
            [point] = curve["marks"]
            assert point["css"] == "converged" and point["value"] == 10.0
            assert point["title"] == f"converged at step {converged}"
            assert tuple(float(v) for v in point["at"]) == line["points"][-1]  # on the episode that completed it
        evals = page.charts[f"eval-returns-{run}"]
        assert [m["value"] for m in evals["marks"]] == ([10.0, 10.0] if run == 0 else [5.0, 5.0])

    assert page.runs_table() == [
        ["0", "yes", "30", "30", "6", "10.0000"],
        ["1", "no", "–", "300", "40", "5.0000"],
    ]
    note = "Criterion streak: goal 9, window 2; a run that does not converge scores 300 steps."
    assert note in [n["text"] for n in page.notes]


def test_the_returns_are_labelled_on_their_bars_and_on_both_sides_of_zero(scored):
    drawn = charts(report(scored))
    phase1 = drawn["phase1-returns"]
    assert ["".join(label.itertext()) for label in bar_labels(phase1)] == ["10", "-3"]
    values = sorted(float(label) for label in ticks(phase1))
    assert values[0] <= -3 < 0 < 10 <= values[-1], f"the axis labels the whole range of the returns: {values}"
    for chart in drawn.values():
        assert_labels_readable(chart)


def test_the_report_opens_in_chromium_with_every_chart_and_mark(scored, chromium, tmp_path):
    html = report(scored)
    dom = test_report.headless(chromium, scored / "report.html", tmp_path / "profile", "--dump-dom").stdout
    drawn = test_report.charts_of(dom)
    assert drawn.scripts == 0
    assert drawn.charts == test_report.charts_of(html).charts
    assert {"phase1-returns", "learning-curve-0", "eval-returns-0", "learning-curve-1", "eval-returns-1"} <= set(
        drawn.charts
    )
    assert drawn.charts["learning-curve-0"] == [7, 1]  # 6 episodes and the convergence point, which is a mark


def test_abandoned_and_unplayed_episodes_are_drawn_as_such(redis_url, service_id, tmp_path):
    """Phase 1: one finished episode, one abandoned (a new reset mid-episode), then ENV_SUBMIT
    mid-episode: the rest of the plan is not played. The frame's colours say which is which."""
    results = tmp_path / "results"
    with running_service(fake_spec(num_episodes=3, phase2={"num_runs": 1, "max_steps": 200, "goal_reward": 9.0,
                         "stability_window": 2}), tests=None, results=str(results), redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        episode(env, 1)
        episode(env, 1, steps=2)
        episode(env, 1, steps=2)
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    page = Page(report(results))
    assert [m["css"] for m in page.charts["phase1-returns"]["marks"]] == ["finished", "abandoned", "abandoned"]
    assert [m["css"] for m in page.charts["eval-returns-0"]["marks"]] == ["skipped"] * 3
    assert page.charts["learning-curve-0"]["points"] == 0  # a run never played has no curve
    assert page.runs_table()[0][:4] == ["0", "no", "–", "300"]


def test_a_phase_2_evaluation_shows_phase_1_as_not_played(redis_url, service_id, tmp_path):
    """Phase 2 alone: both runs converge at step 15, their third episode."""
    results = tmp_path / "results"
    with running_service(fake_spec(phase=2), tests=None, results=str(results), redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for stage in env.stages:
            env.begin_stage(stage)
            if stage["stage"] == "train":
                train(env, iter([1] * 6))
            else:
                episode(env, 1)
                episode(env, 0)
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    html = report(results)
    assert headline(html) == [
        ("–", "phase 1 mean return", "higher is better"),
        ("15", "phase 2 mean convergence step", "lower is better"),
        ("7.5000", "phase 2 mean evaluation return", "higher is better"),
    ]
    assert "phase 1 was not played in this evaluation" in html
    assert re.search(r'<div class="score primary"><div class="value">15</div>', html), "convergence is the primary"


def test_an_interrupted_evaluation_still_shows_what_its_records_say(redis_url, service_id, tmp_path):
    """Stopped during run 1: run 0 converged at step 15 (its records say so) and has a goal."""
    results = tmp_path / "results"
    with running_service(fake_spec(phase=2), tests=None, results=str(results), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        train(env, iter([1, 1, 1, 1]))
        env.begin_stage(env.stages[1])
        episode(env, 1)
        episode(env, 1)
        env.begin_stage(env.stages[2])
        episode(env, 0, steps=1)
        service.request_stop("stopped by the test")
        assert finish(outcome)["state"] == "INTERRUPTED"
        env.close()
    page = Page(report(results))
    assert "Phase 2: training runs" in [s["text"] for s in page.sections]
    assert page.runs_table()[0][:3] == ["0", "yes", "15"]
    curve = page.charts["learning-curve-0"]
    assert curve["rules"] == [{"css": "goal", "label": "goal 9"}]
    assert [m["title"] for m in curve["marks"]] == ["converged at step 15"]
