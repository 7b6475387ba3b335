"""summary.json's ``leaderboard`` and ``submission`` blocks, read from real evaluations: `arbiter
run` of each format's example agent on the session's redis-server (one small evaluation per
format), and a resumed evaluation served in process.

Every figure's value is the score's own, its direction the one its format documents, its spread
the score's (n, std, ci95); Flatland's ``round2_score`` is recomputed from episodes.jsonl; the
identity ``--participant`` names survives a resume; every folder still rescores to itself.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import paths
import pytest
from fake_envs import counting_competition
from harness import finish, read_events, read_summary, remote_episode, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.core.scoring import scoring_rule, spread
from arbiter.server.formats.base import Rule
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020
from arbiter.server.service.submission_naming import name_submission

REPO = str(paths.REPO)
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
TWO_PHASE = ["--competition", "two-phase-cartpole", "--set", "num_episodes=2", "--set", "phase2.num_runs=1",
             "--set", "phase2.max_steps=3000", "--set", "phase2.goal_reward=100", "--set", "phase2.stability_window=2",
             "--", sys.executable, "-m", "arbiter.client.reinforcelab", "examples/reinforcelab_cartpole"]  # fmt: skip
DIAMBRA = ["--competition", "diambra", "--set", "game=doapp", "--set", "difficulty=hard", "--set", "episodes=2",
           "--set", "frame_shape=[64, 64, 1]", "--", sys.executable, "examples/diambra_agent/agent.py"]  # fmt: skip

# Per format: (figure name, the score's key holding its value, direction), in the order written.
FIGURES = {
    "flatland": [
        ("normalized_return", "primary", "higher"),
        ("arrived_fraction", "secondary", "higher"),
        ("round2_score", None, "higher"),  # not a figure of the score: recomputed below
    ],
    "two-phase": [("phase1", "phase1", "higher"), ("convergence", "convergence", "lower"), ("eval", "eval", "higher")],
    "diambra": [("score", "primary", "higher"), ("reward", "secondary", "higher")],
    "metalc": [("alc", "primary", "higher"), ("final_score", "secondary", "higher")],
}
# The spread map each figure's spread comes from (two-phase's carry more: the interquartile mean).
SPREADS = {"two-phase": {name: name for name in ("phase1", "convergence", "eval")}}


def arbiter_run(redis_url: str, results: Path, *run_args: str) -> str:
    """The results folder of a whole `arbiter run` on the session's Redis."""
    service_id = "t-" + uuid.uuid4().hex[:12]
    done = subprocess.run(
        [*ARBITER, "run", "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet",
         *run_args],
        capture_output=True, text=True, timeout=100, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return str(results)


@pytest.fixture(scope="module")
def flatland(redis_server, tiny_tests, tmp_path_factory) -> str:
    """Named by --participant: the one folder with a submission block."""
    results = tmp_path_factory.mktemp("flatland") / "results"
    agent = [sys.executable, "examples/random_agent.py"]
    return arbiter_run(redis_server.url, results, "--tests", tiny_tests, "--participant", "alice", "--", *agent)


@pytest.fixture(scope="module")
def two_phase(redis_server, tmp_path_factory) -> str:
    return arbiter_run(redis_server.url, tmp_path_factory.mktemp("two-phase") / "results", *TWO_PHASE)


@pytest.fixture(scope="module")
def diambra(redis_server, tmp_path_factory) -> str:
    pytest.importorskip("diambra.arena")
    return arbiter_run(redis_server.url, tmp_path_factory.mktemp("diambra") / "results", *DIAMBRA)


@pytest.fixture(scope="module")
def metalc(redis_server, tmp_path_factory) -> str:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    folder = tmp_path_factory.mktemp("metalc")
    write_meta_dataset(str(folder / "data"), GeneratorSettings(datasets=6, algorithms=4, seed=5))
    agent = [sys.executable, "-m", "arbiter.client.metalc", "examples/metalc_agent"]
    return arbiter_run(
        redis_server.url, folder / "results", "--competition", "metalc-wcci2022", "--tests", str(folder / "data"),
        "--", *agent,
    )  # fmt: skip


FOLDERS = {"flatland": "flatland", "two-phase": "two_phase", "diambra": "diambra", "metalc": "metalc"}


def episodes_as_written(results: str) -> list[dict[str, Any]]:
    with open(os.path.join(results, "episodes.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def reduced(found: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if found is None else {key: found[key] for key in ("n", "std", "ci95")}


@pytest.mark.parametrize("format_name", list(FIGURES))
def test_each_figure_is_the_scores_own_with_its_direction_and_spread(format_name, request):
    summary = read_summary(request.getfixturevalue(FOLDERS[format_name]))
    assert summary["state"] == "SUCCESS" and summary["format"] == format_name
    score, figures = summary["score"], summary["leaderboard"]["figures"]
    assert [(f["name"], f["direction"]) for f in figures] == [(name, way) for name, _, way in FIGURES[format_name]]
    rule = scoring_rule(format_name, summary["scoring"])
    assert {f["name"] for f in figures} <= set(rule.figure_names)  # what a competition file may name
    for found, (name, key, _) in zip(figures, FIGURES[format_name], strict=True):
        assert isinstance(found["title"], str) and found["title"] and format(1.5, found["spec"])
        if key is None:
            continue
        assert found["value"] == score[key] and type(found["value"]) is type(score[key]), name
        spread_key = SPREADS.get(format_name, {}).get(name, key)
        assert found["spread"] == reduced(score["spread"][spread_key]), name


def test_flatlands_round2_score_is_the_sum_of_normalized_returns_plus_one(flatland):
    episodes = episodes_as_written(flatland)
    shifted = [record["normalized_return"] + 1.0 for record in episodes]
    round2 = next(f for f in read_summary(flatland)["leaderboard"]["figures"] if f["name"] == "round2_score")
    assert round2["value"] == math.fsum(shifted) and 0.0 <= round2["value"] <= len(episodes)
    # Its spread is the sum's: the episodes' deviation times their number.
    assert round2["spread"]["n"] == len(episodes) == 3
    assert round2["spread"]["std"] == pytest.approx(statistics.pstdev(shifted) * len(episodes), rel=1e-12)
    assert round2["spread"]["ci95"] is None  # fewer than 10 episodes


def test_a_sums_interval_is_the_means_interval_scaled_to_the_sum():
    returns = [-1.0, -0.2, -0.35, -0.9, -0.05, -0.6, -0.41, -1.0, -0.12, -0.77, -0.3, -0.5]
    records = [{"test": "Test_0", "normalized_return": r, "arrived_fraction": 0.5} for r in returns]
    rule = NeurIPS2020()
    figures = {f["name"]: f for f in rule.figures(records, rule.aggregate(records))}
    mean_low, mean_high = figures["normalized_return"]["spread"]["ci95"]
    low, high = figures["round2_score"]["spread"]["ci95"]
    n = len(returns)  # the same resamples: each resampled sum is n × (its mean + 1)
    assert (low, high) == pytest.approx((n * (mean_low + 1.0), n * (mean_high + 1.0)))
    assert low <= figures["round2_score"]["value"] <= high


def test_flatland3s_summed_primary_has_the_spread_of_its_sum():
    returns = [0.0, 0.8, 0.65, 0.1, 0.95, 0.4, 0.59, 0.0, 0.88, 0.23, 0.7, 0.5]
    records = [{"test": "Test_0", "normalized_return": r, "arrived_fraction": 0.5} for r in returns]
    rule = Flatland3()
    summed = rule.figures(records, rule.aggregate(records))[0]
    # summed as flatland's service sums its results table (pandas: NumPy's pairwise sum)
    assert summed["name"] == "normalized_return" and summed["value"] == float(np.array(returns).sum())
    assert summed["spread"]["std"] == pytest.approx(len(returns) * statistics.pstdev(returns))
    low, high = summed["spread"]["ci95"]
    assert low < summed["value"] < high and high - low > 1.0  # an interval of the sum, not of the mean


def test_diambra_metalc_and_two_phase_say_what_they_played_beside_their_figures(diambra, metalc, flatland, two_phase):
    assert read_summary(diambra)["leaderboard"]["context"] == {
        "game": "doapp",
        "difficulty": "hard",
        "level": 4,
        "engine": "mock",
    }
    assert read_summary(metalc)["leaderboard"]["context"] == {"phase": "dev"}
    assert read_summary(two_phase)["leaderboard"]["context"] == {"env": read_summary(two_phase)["tests"]}
    assert read_summary(flatland)["leaderboard"]["context"] == {}


def test_run_with_a_participant_writes_who_and_when_and_without_one_writes_no_identity(flatland, two_phase):
    summary = read_summary(flatland)
    assert summary["submission"] == {
        "participant": "alice",
        "id": summary["service_id"],
        "submitted_at": summary["started_at"],  # when the evaluation started
        "debug": False,
    }
    assert datetime.datetime.fromisoformat(summary["submission"]["submitted_at"]).utcoffset() == datetime.timedelta(0)
    assert "submission" not in read_summary(two_phase)


@pytest.mark.parametrize("format_name", list(FIGURES))
def test_a_board_with_no_score_yet_titles_and_formats_each_column_as_a_scored_one(format_name, request):
    """What a board shows of a column before its first figure (the rule's ``unscored_column``) is
    what it shows once a figure is there: title, direction and format."""
    summary = read_summary(request.getfixturevalue(FOLDERS[format_name]))
    rule = scoring_rule(format_name, summary["scoring"])
    for found in summary["leaderboard"]["figures"]:
        assert rule.unscored_column(found["name"]) == (found["title"], found["direction"], found["spec"])


def test_flatland3s_columns_look_alike_before_and_after_a_score():
    rule = Flatland3()
    episodes = [{"test": "Test_0", "normalized_return": 0.5, "arrived_fraction": 1.0, "played": True}]
    figures = rule.figures(episodes, rule.aggregate(episodes))
    assert [f["name"] for f in figures] == list(rule.figure_names)
    for found in figures:
        assert rule.unscored_column(found["name"]) == (found["title"], found["direction"], found["spec"])


@pytest.mark.parametrize("format_name", list(FIGURES))
def test_a_fresh_folder_still_rescores_to_its_recorded_score(format_name, request):
    results = request.getfixturevalue(FOLDERS[format_name])
    done = subprocess.run([*ARBITER, "rescore", results], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "matches summary.json and episodes.jsonl"


class MeanReturn(Rule):
    """A rule of a format that names no figures of its own."""

    name = "mean-return"

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        returns = [r["return"] for r in records]
        return {"primary": statistics.fmean(returns), "secondary": None, "primary_name": "mean return",
                "secondary_name": None, "spread": {"primary": spread(returns), "secondary": None}}  # fmt: skip


def test_a_rule_that_names_no_figures_reports_its_primary_and_secondary():
    records = [{"return": float(r)} for r in range(12)]
    score = MeanReturn().aggregate(records)
    assert MeanReturn().figures(records, score) == [
        {"name": "primary", "title": "mean return", "value": 5.5, "direction": "higher", "spec": ".4f",
         "spread": {"n": 12, "std": score["spread"]["primary"]["std"], "ci95": score["spread"]["primary"]["ci95"]}},
    ]  # fmt: skip
    lower = {**score, "secondary": 2.0, "secondary_name": "mean steps", "primary_higher_is_better": False}
    figures = MeanReturn().figures(records, lower)
    assert [(f["name"], f["title"], f["direction"]) for f in figures] == [
        ("primary", "mean return", "lower"),
        ("secondary", "mean steps", "higher"),
    ]
    assert MeanReturn().context(records, score) == {}


def serve_named(competition: Any, results: str, redis_url: str, service_id: str, participant: str | None, *,
                resume: bool, stop_after: int | None) -> dict[str, Any]:  # fmt: skip
    """An evaluation served in process and named as `arbiter serve --participant` names it: played
    to its end, or stopped (as a killed evaluator's orchestrator stops it) after ``stop_after``
    episodes."""
    with running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=resume
    ) as (service, outcome):
        name_submission(service, participant, results_dir=results, resume=resume)
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        left = service.evaluation.total - service.evaluation.next_index
        for _ in range(left if stop_after is None else stop_after):
            remote_episode(env, lambda observation: 1, {})
        if stop_after is None:
            env.submit()
        env.close()
        if stop_after is not None:
            service.request_stop("the evaluator is stopped")
        return finish(outcome)


def test_a_resumed_evaluation_keeps_the_identity_of_its_first_start(redis_url, service_id, tmp_path):
    competition = counting_competition(num_episodes=3)
    results = str(tmp_path / "results")
    first = serve_named(competition, results, redis_url, service_id, "alice", resume=False, stop_after=1)
    assert first["state"] == "INTERRUPTED" and first["submission"]["participant"] == "alice"
    assert first["leaderboard"] == {"figures": [], "context": {}}  # no score, no figures

    resumed = serve_named(competition, results, redis_url, service_id, "bob", resume=True, stop_after=None)
    assert resumed["state"] == "SUCCESS"
    assert resumed["submission"] == first["submission"]  # alice's, submitted when it first started
    assert [f["name"] for f in resumed["leaderboard"]["figures"]] == ["phase1"]


def test_a_resume_after_a_kill_dates_the_submission_from_its_first_start(redis_url, service_id, tmp_path):
    competition = counting_competition(num_episodes=2)
    results = str(tmp_path / "results")
    serve_named(competition, results, redis_url, service_id, "alice", resume=False, stop_after=1)
    os.remove(os.path.join(results, "summary.json"))  # killed before it wrote one
    events = read_events(results)
    assert events[0]["event"] == "started"
    events[0]["time"] = "2026-03-14T09:26:53.589+00:00"  # the first run started well before this one
    # Killed before it was named, too: its events name no one.
    assert [event["participant"] for event in events if event["event"] == "submission"] == ["alice"]
    with open(os.path.join(results, "events.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(event) + "\n" for event in events if event["event"] != "submission")

    resumed = serve_named(competition, results, redis_url, service_id, "bob", resume=True, stop_after=1)
    assert resumed["submission"] == {
        "participant": "bob",  # the one named now: the killed run recorded none
        "id": service_id,
        "submitted_at": "2026-03-14T09:26:53+00:00",
        "debug": False,
    }


def test_a_resume_after_a_kill_keeps_the_identity_its_first_run_named(redis_url, service_id, tmp_path):
    """Killed before its summary: the identity its first run named is in its events, and kept."""
    competition = counting_competition(num_episodes=2)
    results = str(tmp_path / "results")
    first = serve_named(competition, results, redis_url, service_id, "alice", resume=False, stop_after=1)
    os.remove(os.path.join(results, "summary.json"))  # killed: it never wrote one
    for participant in ("bob", None):  # named again otherwise, or not at all
        resumed = serve_named(competition, results, redis_url, service_id, participant, resume=True, stop_after=0)
        assert resumed["submission"] == first["submission"]
        os.remove(os.path.join(results, "summary.json"))
    resumed = serve_named(competition, results, redis_url, service_id, "bob", resume=True, stop_after=None)
    assert resumed["state"] == "SUCCESS" and resumed["submission"] == first["submission"]
