"""server/report/page.py: ``report.html`` from a results folder, read as text and as HTML.

The folders are written by a real evaluation (two-phase on a counting env, over the session's
redis-server), then damaged or edited where a test needs it. Rendering in a real browser is in
tests/report/test_report.py and tests/report/test_report_reading.py.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fake_envs import counting_competition
from harness import finish, remote_episode, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ConfigError
from arbiter.server.report.page import REPORT_NAME, load_results, render_report, write_report


@pytest.fixture(scope="module")
def evaluated(redis_server, tmp_path_factory) -> Path:
    """The results folder of a whole two-episode evaluation."""
    results = tmp_path_factory.mktemp("page") / "results"
    service_id = "page-" + uuid.uuid4().hex[:12]
    with running_service(
        counting_competition(num_episodes=2), tests=None, results=str(results), redis_url=redis_server.url,
        service_id=service_id,
    ) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_server.url, service_id=service_id, reply_timeout_s=10)
        for _ in range(2):
            remote_episode(env, lambda observation: 1, {})
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    return results


@pytest.fixture
def results(evaluated, tmp_path) -> Path:
    """A copy of the evaluated folder this test may change."""
    return Path(shutil.copytree(evaluated, tmp_path / "results"))


class Elements(HTMLParser):
    """Every start tag of a page with its attributes, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(page: str) -> Elements:
    elements = Elements()
    elements.feed(page)
    return elements


def test_the_report_is_written_next_to_its_results_and_loads_nothing(results):
    path = write_report(results)
    assert path == results / REPORT_NAME
    page = path.read_text(encoding="utf-8")
    elements = parsed(page)
    tags = {tag for tag, _ in elements.tags}
    assert "script" not in tags and "link" not in tags and "img" not in tags
    csp = [attrs["content"] for tag, attrs in elements.tags if attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; style-src 'unsafe-inline'"]
    assert "<title>arbiter report: SUCCESS</title>" in page


def test_the_report_shows_the_state_score_and_counts_of_its_evaluation(results):
    summary = json.loads((results / "summary.json").read_text())
    elements = parsed(write_report(results, results.parent / "elsewhere" / "page.html").read_text())
    text = " ".join(" ".join(elements.text).split())
    assert "SUCCESS" in text and summary["termination_cause"] in text
    assert "10.0000" in text  # the primary score, as the page prints scores
    assert re.search(r"recorded\s*2 of 2", text)
    charts = [attrs.get("data-chart") for tag, attrs in elements.tags if tag == "svg"]
    assert "planning-time" in charts and "overall-time" in charts


def test_text_from_the_participants_side_is_escaped(results):
    summary, episodes = load_results(results)
    summary["termination_cause"] = "refused </p><script>alert(1)</script>"
    summary["client_version"] = '"><img src=x onerror=alert(1)>'
    page = render_report(summary, episodes, source="<b>folder</b>")
    assert "<script>" not in page and "<img" not in page and "<b>folder" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_an_evaluation_without_a_score_says_why(results):
    summary, episodes = load_results(results)
    summary.update(state="FAILED", score={"primary": None})
    text = " ".join(parsed(render_report(summary, episodes)).text)
    assert "No score" in text and "a failed evaluation is not scored" in text


def test_a_format_that_cannot_be_loaded_is_said_so(results):
    summary, episodes = load_results(results)
    summary["format"] = "chess"
    text = " ".join(parsed(render_report(summary, episodes)).text)
    assert "chess" in text and "unknown format" in text


def test_a_folder_that_is_not_there_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_results(tmp_path / "missing")
    with pytest.raises(ConfigError, match="holds neither summary.json nor episodes.jsonl"):
        load_results(tmp_path)


def test_an_evaluation_that_has_not_ended_points_to_resume(results):
    (results / "summary.json").unlink()
    with pytest.raises(ConfigError, match="has not ended.*--resume"):
        write_report(results)
    assert not (results / REPORT_NAME).exists()


@pytest.mark.parametrize(("text", "message"), [("{", "is not valid JSON"), ("[1, 2]", "does not hold a JSON object")])
def test_a_summary_that_is_not_one_is_refused(results, text, message):
    (results / "summary.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_results(results)


def test_a_summary_that_lists_records_needs_its_episodes(results):
    (results / "episodes.jsonl").unlink()
    with pytest.raises(ConfigError, match="no episodes.jsonl, but its summary.json lists recorded episodes"):
        load_results(results)
