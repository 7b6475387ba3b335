"""The time bank: per episode, seconds that planning and steps may run over their budgets in all.

The agent's slowness is what these tests exercise, so they sleep until chosen instants, on the
evaluator's own clock (``time.monotonic()``, the same in every thread): a step is sent a chosen
time after its budget ran out. Steps are confirmed (``step_replies=True``), so when a step
returns, the evaluator has opened the next window and its start can be read.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest
from harness import (
    finish,
    play_episode,
    read_episodes,
    read_events,
    read_summary,
    running_service,
    seeded_actions,
    spec,
)

from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.progress import Progress
from arbiter.server.cli.watch import render
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.report.page import render_report

pytestmark = pytest.mark.alone  # steps sent at chosen instants around their budgets

STEP_S = 0.3
BANK_S = 0.5
SLACK_S = 0.2  # how late the evaluator may handle a step on a loaded machine (it only ever adds)


def sleep_until(instant: float) -> None:
    while (left := instant - time.monotonic()) > 0:
        time.sleep(min(left, 0.01))


def step_late(client: RemoteClient, evaluation, *, episode: int, step: int, over_s: float) -> None:
    """Send the next step ``over_s`` after its budget ran out, by the evaluator's clock."""
    budget_s = evaluation.budgets.planning_s if evaluation.wait.value == "planning" else evaluation.budgets.step_s
    sleep_until(evaluation.wait_started + budget_s + over_s)
    client.env_step(seeded_actions(episode, step, 2))


def test_late_steps_draw_on_the_bank_until_it_is_spent(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=2, step_s=STEP_S, time_bank_s=BANK_S),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        evaluation = service.evaluation
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        assert client.server_info["budgets"]["time_bank_s"] == BANK_S  # the PONG announces the bank
        client.env_create()
        client.env_step(seeded_actions(0, 0, 2))
        step_late(client, evaluation, episode=0, step=1, over_s=0.15)  # within the bank: applied
        assert BANK_S - 0.15 - SLACK_S < evaluation.bank.left_s <= BANK_S - 0.15
        step_late(client, evaluation, episode=0, step=2, over_s=0.15)  # still within: applied
        left_s = evaluation.bank.left_s
        assert 0 < left_s <= BANK_S - 0.3
        assert evaluation.counters["step_timeouts"] == 0
        # Over by more than the rest of the bank: the step budget and the bank are spent.
        with pytest.raises(TimeoutException):
            step_late(client, evaluation, episode=0, step=3, over_s=left_s + 0.1)
        timed_out = read_episodes(results)[0]
        assert timed_out["timed_out"] and timed_out["timeout"] == "step" and timed_out["steps"] == 3
        assert timed_out["time_bank_used_s"] == BANK_S

        # Every episode starts with a full bank.
        client.env_create()
        client.env_step(seeded_actions(1, 0, 2))
        step_late(client, evaluation, episode=1, step=1, over_s=0.4)  # more than the first episode had left
        play_episode_from(client, episode=1, step=2)
        client.env_create()
        play_episode(client, 2)
        client.submit()
        summary = finish(outcome)
    episodes = read_episodes(results)
    assert [e["timed_out"] for e in episodes] == [True, False, False]
    assert 0.4 <= episodes[1]["time_bank_used_s"] <= BANK_S
    assert episodes[2]["time_bank_used_s"] < SLACK_S
    assert summary["budgets"]["time_bank_s"] == BANK_S
    bank_stats = summary["timing"]["time_bank_used_s"]
    assert bank_stats["n"] == 3 and bank_stats["max"] == BANK_S

    # What a person watching sees: `arbiter watch` renders the events, `arbiter run` its progress.
    watched = [render(event) for event in read_events(results)]
    assert f"time bank {BANK_S:g} s per episode" in watched[0]
    episode_lines = [line for line in watched if line.startswith("[")]
    assert f"bank used {BANK_S:.3f} s  TIMEOUT (step)" in episode_lines[0]
    assert f"bank used {episodes[1]['time_bank_used_s']:.3f} s  |" in episode_lines[1]
    assert ("bank used" in episode_lines[2]) is (episodes[2]["time_bank_used_s"] > 0)
    shown = io.StringIO()
    progress = Progress(shown)
    for record in episodes:
        progress.episode(record, service.evaluation)
    progress_lines = shown.getvalue().splitlines()
    assert f"bank used {BANK_S:.3f} s  TIMEOUT (step)" in progress_lines[0]
    assert f"bank used {episodes[1]['time_bank_used_s']:.3f} s  |" in progress_lines[1]


def play_episode_from(client: RemoteClient, *, episode: int, step: int) -> None:
    while not client.env_step(seeded_actions(episode, step, 2))[2]["__all__"]:
        step += 1


def test_planning_draws_on_the_bank_too_and_the_report_shows_it(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=0.3, step_s=5, time_bank_s=BANK_S, max_episodes=1),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        client.env_create()
        step_late(client, service.evaluation, episode=0, step=0, over_s=0.2)
        play_episode_from(client, episode=0, step=1)
        client.submit()
        summary = finish(outcome)
    episode = read_episodes(results)[0]
    assert not episode["timed_out"]
    assert episode["planning_s"] >= 0.5
    assert 0.2 <= episode["time_bank_used_s"] < 0.2 + SLACK_S
    page = render_report(summary, read_episodes(results))
    assert "Time bank used per episode against the bank" in page and "<td>Time bank</td><td>500 ms</td>" in page


def test_without_a_bank_the_report_has_no_bank_chart_and_the_deadline_is_the_budget(
    redis_url, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=STEP_S, max_episodes=1),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        client.env_create()
        client.env_step(seeded_actions(0, 0, 2))
        evaluation = service.evaluation
        assert evaluation.endings.deadline().at == evaluation.wait_started + STEP_S
        play_episode_from(client, episode=0, step=1)
        client.submit()
        summary = finish(outcome)
    assert summary["budgets"]["time_bank_s"] == 0
    assert read_episodes(results)[0]["time_bank_used_s"] == 0
    assert "Time bank used per episode" not in render_report(summary, read_episodes(results))


def test_the_bank_is_a_competition_key_and_a_command_line_option(redis_url, service_id, tiny_tests, tmp_path):
    assert spec_from_dict("c", {"budgets": {"time_bank_s": 2.5}}).budgets.time_bank_s == 2.5
    for bad in (-1, "3", True, float("inf")):
        with pytest.raises(ConfigError, match="time_bank_s"):
            spec_from_dict("c", {"budgets": {"time_bank_s": bad}})
    results = str(tmp_path / "r")
    serve = [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
             "--service-id", service_id, "--results", results, "--idle-timeout", "0.3", "--quiet"]  # fmt: skip
    done = subprocess.run([*serve, "--time-bank", "0.7"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # no client came: FAILED, with the budgets it had
    assert read_summary(results)["budgets"]["time_bank_s"] == 0.7
    refused = subprocess.run([*serve, "--time-bank", "-1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--time-bank" in refused.stderr
