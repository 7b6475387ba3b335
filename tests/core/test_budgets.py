"""Every budget with sub-second values: planning, step, overall, successive timeouts, idle.

The agent's slowness is what these tests exercise, so they sleep past budgets on purpose;
wherever the test then needs the evaluator to have acted, it awaits that condition.
"""

from __future__ import annotations

import time

import pytest
from harness import finish, play_episode, read_episodes, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol import codec, keys
from arbiter.protocol.messages import FLATLAND_RL, request

pytestmark = pytest.mark.alone  # sub-second budgets: a process slowed by another test would change what they decide


def client_for(redis_url: str, service_id: str) -> RemoteClient:
    return RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)


def errors_pending(redis_conn, service_id: str) -> bool:
    return redis_conn.llen(keys.errors_key(service_id)) > 0


def test_step_timeout_scores_minus_one_and_the_evaluation_goes_on(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=0.3, planning_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        for step in range(3):
            client.env_step(seeded_actions(0, step, 2))
        time.sleep(0.15)  # half the step budget: no timeout
        client.env_step(seeded_actions(0, 3, 2))
        assert not errors_pending(redis_conn, service_id)
        time.sleep(0.6)  # twice the step budget
        wait_for(lambda: errors_pending(redis_conn, service_id), what="the step timeout")
        with pytest.raises(TimeoutException, match="step budget") as caught:
            client.env_step(seeded_actions(0, 4, 2))
        assert isinstance(caught.value, StopAsyncIteration)
        # The rest of the evaluation is unaffected.
        for episode in (1, 2):
            assert client.env_create()[0]
            play_episode(client, episode)
        assert client.env_create() == (False, False)
        client.submit()
        summary = finish(outcome)
    episodes = read_episodes(results)
    assert episodes[0]["timed_out"] is True and episodes[0]["timeout"] == "step"
    assert episodes[0]["normalized_return"] == -1.0
    assert episodes[0]["steps"] == 4  # the step sent after the timeout was never applied
    assert service.evaluation.counters["late_steps"] == 1
    assert [e["timed_out"] for e in episodes[1:]] == [False, False]
    assert summary["state"] == "SUCCESS"
    assert summary["episodes"]["timed_out"] == 1
    assert summary["score"]["primary"] == pytest.approx(sum(e["normalized_return"] for e in episodes) / 3)


def test_planning_timeout(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=0.3, step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        time.sleep(0.6)
        wait_for(lambda: errors_pending(redis_conn, service_id), what="the planning timeout")
        with pytest.raises(TimeoutException, match="planning budget"):
            client.env_step(seeded_actions(0, 0, 2))
        assert client.env_create()[0]
        client.submit()  # early submit: the episode in progress and the last one count as unfinished
        summary = finish(outcome)
    episodes = read_episodes(results)
    assert episodes[0]["timeout"] == "planning" and episodes[0]["steps"] == 0
    assert [e["normalized_return"] for e in episodes] == [-1.0, -1.0, -1.0]
    assert summary["state"] == "SUCCESS" and "ENV_SUBMIT after 2 of 3 episodes" in summary["termination_cause"]


def test_the_wait_after_the_last_step_is_not_a_step_window(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    """flatland-rl overwrote a finished episode's score after a pause longer than the step budget."""
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=0.2), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        play_episode(client, 0)
        first = wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")[0]
        time.sleep(0.5)  # 2.5 step budgets between the last step and the next env_create
        assert not errors_pending(redis_conn, service_id)
        assert client.env_create()[0]
        assert read_episodes(results)[0] == first
        assert first["timed_out"] is False
        client.submit()
        finish(outcome)


def test_successive_timeouts_end_the_evaluation_with_a_score(redis_url, service_id, tiny_tests, tmp_path):
    """A client that vanishes after env_create: each step budget counts, the limit ends it."""
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=0.2, step_s=0.2, max_successive_timeouts=3),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        started = time.monotonic()
        summary = finish(outcome)
        ended_after_s = time.monotonic() - started
    assert summary["state"] == "SUCCESS"
    assert "3 successive timeouts" in summary["termination_cause"]
    assert summary["score"]["primary"] == -1.0
    episodes = read_episodes(results)
    assert [e["timed_out"] for e in episodes] == [True, False, False]
    assert [e["skipped"] for e in episodes] == [False, True, True]
    assert ended_after_s < 3.0  # three 0.2 s budgets, not an idle budget


def test_overall_budget_fails_the_evaluation_but_keeps_finished_episodes(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(overall_s=1.0, step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        play_episode(client, 0)
        client.env_create()
        wait_for(lambda: "summary" in outcome, timeout_s=5, what="the overall budget to run out")
        summary = finish(outcome)
    assert summary["state"] == "FAILED"
    assert summary["score"]["primary"] is None and summary["score"]["secondary"] is None
    assert "overall budget" in summary["termination_cause"]
    assert [e["env"] for e in read_episodes(results)] == ["Test_0/Level_0.pkl"]


def test_overall_budget_checked_on_requests_too(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    """A busy client cannot outrun the overall budget by never letting the evaluator wait."""
    results = str(tmp_path / "r")
    with running_service(
        spec(overall_s=0.5, step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        give_up = time.monotonic() + 5
        while "summary" not in outcome and time.monotonic() < give_up:
            # a stream of out-of-order PINGs keeps the evaluator busy
            redis_conn.lpush(
                keys.commands_key(service_id),
                codec.encode(request(FLATLAND_RL.PING, {}, keys.response_key(service_id, "0" * 32))),
            )
            time.sleep(0.01)
        summary = finish(outcome)
    assert summary["state"] == "FAILED" and "overall budget" in summary["termination_cause"]


def test_no_client_ends_after_the_idle_budget(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(idle_s=0.3), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        summary = finish(outcome, timeout_s=5)
    assert summary["state"] == "FAILED"
    assert summary["termination_cause"] == "no client connected within the idle budget of 0.3 s"
    assert summary["score"]["primary"] is None


def test_ping_only_client_ends_after_the_idle_budget(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(idle_s=0.3), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client_for(redis_url, service_id)  # PING / PONG, then nothing
        summary = finish(outcome, timeout_s=5)
    assert summary["state"] == "FAILED"
    assert "connected but asked for no episode" in summary["termination_cause"]


def test_idle_between_episodes_ends_with_unplayed_episodes_unfinished(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(idle_s=0.3), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        client.env_create()
        play_episode(client, 0)
        summary = finish(outcome, timeout_s=5)
    episodes = read_episodes(results)
    assert summary["state"] == "SUCCESS" and "no new episode within the idle budget" in summary["termination_cause"]
    assert [e["skipped"] for e in episodes] == [False, True, True]
    assert summary["score"]["primary"] == pytest.approx((episodes[0]["normalized_return"] - 2) / 3)


def test_stale_errors_from_an_earlier_evaluation_do_not_break_the_handshake(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    redis_conn.rpush(keys.errors_key(service_id), codec.encode({"type": FLATLAND_RL.ENV_STEP_TIMEOUT}))
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = client_for(redis_url, service_id)
        assert client.env_create()[0]
        client.submit()
        finish(outcome)


def test_a_dead_evaluator_gives_a_clear_error_not_a_hang(redis_url, service_id):
    from arbiter.protocol.errors import ServerUnavailable

    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="is the evaluator running"):
        RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=0.5)
    assert time.monotonic() - started < 3.0


def test_the_transport_never_blocks_forever_near_a_deadline(redis_url, service_id):
    """A BRPOP timeout that rounds to 0 ms would block forever: every near-deadline wait returns."""
    from arbiter.server.service.transport import POLL_MARGIN_S, RedisTransport

    transport = RedisTransport(redis_url, service_id)
    try:
        for extra_s in (1e-7, 1e-4, 0.0009, 0.004, 0.0099, 0.0101):
            deadline = time.monotonic() + POLL_MARGIN_S + extra_s
            assert transport.pop(deadline) is None
            assert time.monotonic() - deadline < 0.05
    finally:
        transport.close()


def test_an_agent_stepping_without_replies_is_told_at_its_next_step_that_the_evaluation_ended(
    redis_url, service_id, tiny_tests, tmp_path
):
    """RemoteClient's steps wait for no reply: the overall budget ends the evaluation inside an
    episode, and the agent's next step raises EvaluationError saying so, as its next env_create
    would, instead of stepping on into an evaluation that is over (and no evaluator answers it)."""
    from arbiter.protocol.errors import EvaluationError

    with running_service(
        spec(overall_s=0.5, step_s=5), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url,
        service_id=service_id,
    ) as (_, outcome):  # fmt: skip
        client = client_for(redis_url, service_id)
        client.env_create()
        client.env_step({0: 2, 1: 2})
        wait_for(lambda: "summary" in outcome, timeout_s=5, what="the overall budget to run out")
        with pytest.raises(EvaluationError, match=r"the evaluation has ended \(FAILED\): overall budget of 0.5 s"):
            client.env_step({0: 2, 1: 2})
        assert finish(outcome)["state"] == "FAILED"
