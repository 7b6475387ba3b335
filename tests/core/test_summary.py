"""server/core/summary.py: what an evaluation reports about itself, as it lands on disk.

The per-step statistics and the outcome counts are checked directly; the record's core fields
and summary.json are read from real evaluations (two-phase on a counting env): every record
carries the core's fields, item-wide figures sit on an item's last record only, and the summary
counts what the records hold.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, read_summary, remote_episode, running_service, train_until_the_run_ends

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.core.summary import CORE_FIELDS, counts, stats

# Item-wide figures: a sum over an item's records counts them once.
ITEM_WIDE = ("invalid_actions", "wall_s", "planning_s", "step_think_s", "time_bank_used_s")


def test_stats_of_no_values_are_none():
    assert stats([]) is None


def test_stats_give_count_extremes_mean_and_99th_percentile():
    values = [float(v) for v in range(200, 0, -1)]  # unordered input: 200 ... 1
    found = stats(values)
    assert (found["n"], found["min"], found["max"]) == (200, 1.0, 200.0)
    assert found["mean"] == pytest.approx(100.5)
    assert found["p99"] == 198.0  # the value 99 % of the steps stay at or under


def test_the_99th_percentile_of_few_values_is_their_maximum():
    assert stats([0.3, 0.1, 0.2])["p99"] == 0.3


def test_counts_tell_each_outcome_apart():
    def record(**flags: bool) -> dict[str, Any]:
        return {"timed_out": False, "abandoned": False, "skipped": False, **flags}

    records = [record(), record(), record(timed_out=True), record(abandoned=True), record(skipped=True)]
    assert counts(7, records) == {
        "total": 7,
        "recorded": 5,
        "finished": 2,
        "timed_out": 1,
        "abandoned": 1,
        "skipped": 1,
    }


def play_phase1(redis_url: str, service_id: str, results: str, episodes: int) -> dict[str, Any]:
    with running_service(
        counting_competition(num_episodes=episodes), tests=None, results=results, redis_url=redis_url,
        service_id=service_id,
    ) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for _ in range(episodes):
            remote_episode(env, lambda observation: 1, {})
        env.submit()
        env.close()
        return finish(outcome)


def test_every_record_carries_the_core_fields(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    play_phase1(redis_url, service_id, results, episodes=2)
    records = read_episodes(results)
    assert [(record["index"], record["unit"]) for record in records] == [(0, "phase1/eval/0"), (1, "phase1/eval/1")]
    for record in records:
        assert set(CORE_FIELDS) <= set(record)
        assert record["timed_out"] is False and record["timeout"] is None and record["skipped"] is False
        # The agent's time before its first step is planning: each later step has a think time.
        assert record["planning_s"] is not None and record["step_think_s"]["n"] == 4
    assert records[0]["elapsed_s"] <= records[1]["elapsed_s"]


def test_summary_json_counts_what_the_records_hold(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    returned = play_phase1(redis_url, service_id, results, episodes=3)
    summary = read_summary(results)
    assert summary == returned  # what the evaluation returns is what it wrote
    assert summary["state"] == "SUCCESS" and summary["format"] == "two-phase"
    assert summary["service_id"] == service_id and summary["scoring"] == "two-phase"
    assert summary["episodes"] == counts(3, read_episodes(results))
    assert (summary["items"]["total"], summary["items"]["recorded"]) == (3, 3)
    assert summary["timing"]["step_think_s"]["n"] == 3 * 4
    assert summary["timing"]["evaluation_s"] > 0
    # one durable append per item, each a real write and sync: never free, never longer than the run
    durable = summary["timing"]["record_durable_s"]
    assert (
        durable["n"] == 3
        and 0 < durable["min"] <= durable["mean"] <= durable["max"] < summary["timing"]["evaluation_s"]
    )
    assert summary["score"]["primary"] == 10.0  # five steps of reward 1 plus the bonus of action 1
    assert {"python", "arbiter", "numpy"} <= set(summary["versions"])


def test_an_interrupted_evaluation_has_an_empty_score_and_its_cause(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    with running_service(
        counting_competition(num_episodes=2), tests=None, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        service.request_stop("stopped before any episode")
        finish(outcome)
    summary = read_summary(results)
    assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == "stopped before any episode"
    assert summary["episodes"]["recorded"] == 0
    assert (summary["items"]["total"], summary["items"]["recorded"]) == (2, 0)
    assert summary["score"]["primary"] is None and summary["timing"]["step_think_s"] is None
    assert summary["timing"]["record_durable_s"] is None  # no item was written


def test_item_wide_figures_sit_on_a_training_runs_last_record_only(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    phase2 = {"num_runs": 1, "max_steps": 20, "goal_reward": 4.0, "stability_window": 2}
    competition = counting_competition(num_episodes=1, phase=2, phase2=phase2)
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for stage in env.stages:
            env.begin_stage(stage)
            if stage["stage"] == "train":
                train_until_the_run_ends(env, action=1)
            else:
                for _ in range(stage["items"][1] - stage["items"][0]):  # [first, end) of the stage's items
                    remote_episode(env, lambda observation: 1, {})
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    run = [record for record in read_episodes(results) if record["index"] == 0]
    assert len(run) > 1, "the training run should have written a record per episode"
    *earlier, last = run
    for record in earlier:
        assert record["wall_s"] is None and record["step_think_s"] is None and record["invalid_actions"] == 0
    assert last["wall_s"] > 0 and last["step_think_s"]["n"] >= len(run) * 4  # every episode's steps but the first
    assert all(set(CORE_FIELDS) <= set(record) for record in run)
