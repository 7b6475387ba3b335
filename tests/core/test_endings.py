"""server/core/endings.py: how an evaluation ends, read where its users read it: the state and cause
in summary.json, and the records of the items it did not finish.

Each test runs a real evaluator (two-phase on a counting env, sub-second budgets) over the
session's redis-server with a RemoteEnv or a silent agent; the waits are for the evaluator to
decide, never fixed sleeps.
"""

from __future__ import annotations

import re
import time

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, read_summary, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.client.wire import Wire
from arbiter.protocol import keys
from arbiter.protocol.errors import TimeoutException

pytestmark = pytest.mark.alone  # sub-second budgets: a process slowed by another test would change what they decide

HELLO = {"client": "an endings test", "formats": "server-side"}


def evaluate(redis_url, service_id, tmp_path, **keys):
    results = str(tmp_path / "results")
    return results, running_service(
        counting_competition(**keys), tests=None, results=results, redis_url=redis_url, service_id=service_id
    )


def connect(redis_url: str, service_id: str) -> RemoteEnv:
    return RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)


def timeout_posted(redis_conn, service_id: str) -> None:
    """Wait until the evaluator has posted a timeout for the client (it is told at its next call)."""
    errors = keys.errors_key(service_id)
    wait_for(lambda: redis_conn.llen(errors) > 0, what="the timeout on the errors list")


def play(env: RemoteEnv, steps: int = 5) -> None:
    env.reset()
    for _ in range(steps):
        env.step(1)


def test_no_client_within_the_idle_budget_fails(redis_url, service_id, tmp_path):
    results, running = evaluate(redis_url, service_id, tmp_path, budgets={"idle_s": 0.3})
    with running as (_, outcome):
        summary = finish(outcome)
    assert summary["state"] == "FAILED"
    assert summary["termination_cause"] == "no client connected within the idle budget of 0.3 s"
    assert read_summary(results) == summary


def test_a_client_that_asks_for_no_episode_fails_the_evaluation(redis_url, service_id, tmp_path):
    _, running = evaluate(redis_url, service_id, tmp_path, budgets={"idle_s": 0.3})
    with running as (_, outcome):
        wire = Wire(redis_url, service_id, reply_timeout_s=5)
        wire.handshake("test", asks=HELLO)
        summary = finish(outcome)
        wire.close()
    assert summary["state"] == "FAILED"
    assert summary["termination_cause"].startswith("the client connected but asked for no episode")


def test_a_step_timeout_is_recorded_and_told_at_the_next_call(redis_url, redis_conn, service_id, tmp_path):
    results, running = evaluate(redis_url, service_id, tmp_path, num_episodes=2, budgets={"step_s": 0.2})
    with running as (_, outcome):
        env = connect(redis_url, service_id)
        env.reset()
        env.step(1)
        timeout_posted(redis_conn, service_id)
        with pytest.raises(TimeoutException, match="timed out"):
            env.step(1)
        play(env)  # the next episode goes on as usual
        env.submit()
        env.close()
        summary = finish(outcome)
    first, second = read_episodes(results)
    assert (first["timed_out"], first["timeout"], second["timed_out"]) == (True, "step", False)
    assert summary["state"] == "SUCCESS" and summary["counters"]["step_timeouts"] == 1


def test_successive_timeouts_end_the_evaluation_with_the_rest_not_played(redis_url, redis_conn, service_id, tmp_path):
    budgets = {"planning_s": 0.2, "max_successive_timeouts": 2}
    results, running = evaluate(redis_url, service_id, tmp_path, num_episodes=4, budgets=budgets)
    with running as (_, outcome):
        env = connect(redis_url, service_id)
        env.reset()  # and never a step: the planning budget runs out
        timeout_posted(redis_conn, service_id)
        with pytest.raises(TimeoutException, match="planning"):
            env.reset()
        env.reset()  # the second episode, left alone too
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "SUCCESS"
    cause = summary["termination_cause"]
    assert re.fullmatch(r"2 successive timeouts; 2 [a-z ]+ not played count as unfinished", cause)
    records = read_episodes(results)
    assert [(r["timeout"], r["skipped"]) for r in records] == [("planning", False)] * 2 + [(None, True)] * 2
    assert summary["episodes"]["timed_out"] == 2 and summary["episodes"]["skipped"] == 2


def test_the_overall_budget_ends_the_evaluation_without_a_score(redis_url, service_id, tmp_path):
    budgets = {"overall_s": 0.8}
    results, running = evaluate(redis_url, service_id, tmp_path, num_episodes=2, budgets=budgets)
    with running as (_, outcome):
        env = connect(redis_url, service_id)
        play(env)
        summary = finish(outcome)  # the agent takes its time with the second episode
        env.close()
    assert summary["state"] == "FAILED"
    assert summary["termination_cause"].startswith("overall budget of 0.8 s exceeded after")
    assert summary["score"]["primary"] is None and len(read_episodes(results)) == 1


def test_the_overall_budget_starts_at_the_first_env_create_not_the_handshake(redis_url, service_id, tmp_path):
    """As flatland's evaluator: an agent that connects, then loads its model for longer than the
    overall budget, is on the idle budget until it asks for its first episode."""
    budgets = {"overall_s": 0.8, "idle_s": 10.0}
    _, running = evaluate(redis_url, service_id, tmp_path, num_episodes=2, budgets=budgets)
    with running as (_, outcome):
        env = connect(redis_url, service_id)  # the handshake
        time.sleep(1.2)  # loading a model
        play(env)
        play(env)
        env.submit()
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["timing"]["evaluation_s"] < 0.8


def test_all_items_played_without_a_submit_is_a_success(redis_url, service_id, tmp_path):
    _, running = evaluate(redis_url, service_id, tmp_path, num_episodes=1, budgets={"idle_s": 0.3})
    with running as (_, outcome):
        env = connect(redis_url, service_id)
        play(env)
        assert env.reset()[1]["env_done"]  # the agent learns there is nothing left, then goes quiet
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "SUCCESS" and summary["score"]["primary"] == 10.0
    assert re.fullmatch(r"the 1 [a-z ]+ evaluated; no ENV_SUBMIT within the idle budget of 0.3 s",
                        summary["termination_cause"])  # fmt: skip


def test_an_agent_that_exits_early_leaves_its_episode_abandoned_and_the_rest_not_played(
    redis_url, service_id, tmp_path
):
    results, running = evaluate(redis_url, service_id, tmp_path, num_episodes=3)
    with running as (service, outcome):
        env = connect(redis_url, service_id)
        play(env)
        play(env, steps=2)  # inside the second episode
        env.close()
        service.agent_exited(1)
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert re.fullmatch(
        r"the agent process exited with status 1 before submitting; 1 [a-z ]+ not played counts as unfinished",
        summary["termination_cause"],
    )
    assert [(r["abandoned"], r["skipped"]) for r in read_episodes(results)] == [
        (False, False),
        (True, False),
        (False, True),
    ]


def test_an_agent_that_exits_after_its_last_episode_keeps_its_score(redis_url, service_id, tmp_path):
    _, running = evaluate(redis_url, service_id, tmp_path, num_episodes=1)
    with running as (service, outcome):
        env = connect(redis_url, service_id)
        play(env)
        assert env.reset()[1]["env_done"]
        env.close()
        service.agent_exited(0)
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["score"]["primary"] == 10.0
    assert re.fullmatch(r"the 1 [a-z ]+ evaluated; the agent exited without ENV_SUBMIT", summary["termination_cause"])


def test_an_agent_quiet_between_episodes_ends_the_evaluation_with_the_rest_not_played(redis_url, service_id, tmp_path):
    results, running = evaluate(redis_url, service_id, tmp_path, num_episodes=2, budgets={"idle_s": 0.3})
    with running as (_, outcome):
        env = connect(redis_url, service_id)
        play(env)
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "SUCCESS"
    cause = summary["termination_cause"]
    assert cause.startswith("the client asked for no new episode within the idle budget of 0.3 s")
    assert [record["skipped"] for record in read_episodes(results)] == [False, True]
