"""server/core/restarts.py: what a change of agent costs, read on the wire and in the results folder.

Each test runs real evaluators (two-phase on a counting env) over the session's redis-server. Phase
2 has groups: a training run and its evaluation episode, here items 0-1 and 2-3. The evaluator is
"killed" by stopping it (INTERRUPTED, what a SIGTERM does) and resumed from its results folder.
"""

from __future__ import annotations

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, read_summary, remote_episode, running_service, train_until_the_run_ends

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import EvaluatorRestarted
from arbiter.server.service.records_file import read_records

PHASE2 = {"num_runs": 2, "max_steps": 20, "goal_reward": 9.0, "stability_window": 1}


def phase2(**budgets):
    return counting_competition(num_episodes=1, phase=2, phase2=PHASE2, budgets=budgets)


def connect(redis_url: str, service_id: str) -> RemoteEnv:
    return RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)


def play_stage(env: RemoteEnv, stage: dict) -> None:
    env.begin_stage(stage)
    if stage["stage"] == "train":
        train_until_the_run_ends(env, action=1)
    else:
        for _ in range(stage["items"][1] - stage["items"][0]):
            remote_episode(env, lambda observation: 1, {})


def stop(service, outcome) -> None:
    service.request_stop("the evaluator is killed")
    assert finish(outcome)["state"] == "INTERRUPTED"


def left_inside_item_1(competition, results: str, redis_url: str, service_id: str) -> RemoteEnv:
    """Item 0 played and one step of item 1 when the evaluator goes (stopped, as a SIGTERM
    stops it); the agent lives on."""
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = connect(redis_url, service_id)
        remote_episode(env, lambda observation: 1, {})
        env.reset()
        env.step(1)
        stop(service, outcome)
    return env


def test_the_agent_that_lived_on_inside_an_item_is_told_to_play_it_again(redis_url, service_id, tmp_path):
    competition = counting_competition(num_episodes=2)
    results = str(tmp_path / "results")
    env = left_inside_item_1(competition, results, redis_url, service_id)
    with running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (_, outcome):
        with pytest.raises(EvaluatorRestarted, match="goes on at item 1") as restarted:
            env.step(1)
        assert restarted.value.resume_item == 1 and env.next_item == 1
        remote_episode(env, lambda observation: 0, {})  # item 1 again, from its start
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["counters"]["restarted_items"] == 1
    assert [record["return"] for record in read_episodes(results)] == [10.0, 5.0]
    assert summary["replayed"] == []  # an item that stands alone: nothing finished is taken back


def test_a_new_agent_after_a_restart_plays_the_group_in_progress_again(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    with running_service(phase2(), tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = connect(redis_url, service_id)
        train, evaluate, *_ = env.stages
        play_stage(env, train)  # item 0 done; the evaluator goes before the run's evaluation episode
        env.close()
        stop(service, outcome)
    trained = read_episodes(results)
    assert {record["index"] for record in trained} == {0}
    with running_service(
        phase2(), tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (_, outcome):
        env = connect(redis_url, service_id)  # a new agent: it holds nothing the run trained
        assert env.next_item == 0
        for stage in env.stages:
            play_stage(env, stage)
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    [replayed] = summary["replayed"]
    assert replayed["items"] == [0] and replayed["group"] == "phase2/run0"
    assert replayed["records"] == len(trained) and "a new agent" in replayed["cause"]
    # The withdrawn records are kept for the record; the results hold the run played again.
    assert read_records(f"{results}/replayed.jsonl") == trained
    assert [record["index"] for record in read_episodes(results)].count(1) == 1
    assert read_summary(results)["counters"]["replayed_items"] == 1


def test_the_summary_names_what_every_run_played_again(redis_url, service_id, tmp_path):
    """Two resumes, each with a new agent inside the first group: the summary of the last run
    names both replays, the first one's read back from the events of the run that made it."""
    results = str(tmp_path / "results")
    with running_service(phase2(), tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = connect(redis_url, service_id)
        play_stage(env, env.stages[0])  # item 0 done, then the evaluator goes
        env.close()
        stop(service, outcome)
    for last in (False, True):
        with running_service(
            phase2(), tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
        ) as (service, outcome):
            env = connect(redis_url, service_id)  # a new agent: item 0 is played again
            for stage in env.stages if last else env.stages[:1]:
                play_stage(env, stage)
            if last:
                env.submit()
                env.close()
                summary = finish(outcome)
            else:
                env.close()
                stop(service, outcome)
    assert summary["state"] == "SUCCESS"
    assert [entry["items"] for entry in summary["replayed"]] == [[0], [0]]
    assert {entry["group"] for entry in summary["replayed"]} == {"phase2/run0"}
    assert all("a new agent" in entry["cause"] and entry["records"] >= 1 for entry in summary["replayed"])
    assert summary["counters"]["replayed_items"] == 2


def test_a_takeover_inside_a_group_leaves_the_rest_of_the_group_not_played(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    competition = phase2(step_s=0.2, planning_s=0.2)
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        crashed = connect(redis_url, service_id)
        crashed.begin_stage(crashed.stages[0])
        crashed.reset()
        crashed.step(1)  # then silent, inside the first training run: a crash
        restarted = connect(redis_url, service_id)  # its handshake waits for the takeover window
        assert restarted.next_item == 2  # the first run's group is over for this evaluation
        for stage in restarted.stages[2:]:
            play_stage(restarted, stage)
        restarted.submit()
        restarted.close()
        crashed.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["counters"]["takeovers"] == 1
    by_item = {}
    for record in read_episodes(results):
        by_item.setdefault(record["index"], record)
    assert by_item[0]["timed_out"] and by_item[1]["skipped"]  # the run cut short, its evaluation not played
    assert not by_item[2]["timed_out"] and not by_item[3]["skipped"]


def test_an_agent_started_again_after_being_told_to_restart_is_served_at_once(redis_url, service_id, tmp_path):
    """The step budget (the silence a takeover waits for between items) is far longer than the
    new agent's reply timeout: it gets in only because the evaluator told the old one to restart."""
    competition = counting_competition(num_episodes=2, budgets={"step_s": 60})
    results = str(tmp_path / "results")
    env = left_inside_item_1(competition, results, redis_url, service_id)
    with running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (_, outcome):
        with pytest.raises(EvaluatorRestarted):
            env.step(1)
        env.close()  # the agent exits, as an agent that does not catch EvaluatorRestarted does
        started_again = connect(redis_url, service_id)
        remote_episode(started_again, lambda observation: 0, {})  # item 1, from its start
        started_again.submit()
        started_again.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["counters"]["takeovers"] == 1
    assert [record["return"] for record in read_episodes(results)] == [10.0, 5.0]
