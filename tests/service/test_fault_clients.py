"""Exactly-once requests for arbiter's client (F8) and one client per evaluation (F9).

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import pytest
from flatland.evaluators.client import FlatlandRemoteClient
from harness import (
    finish,
    in_forked_child,
    play_episode,
    read_episodes,
    running_service,
    seeded_actions,
    spec,
    wait_for,
)

from arbiter.client import RemoteClient
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import ClientConflict
from arbiter.protocol.messages import FLATLAND_RL


def push(redis_conn, service_id: str, message: bytes) -> None:
    redis_conn.lpush(keys.commands_key(service_id), message)


def queue_empty(redis_conn, service_id: str) -> bool:
    return redis_conn.llen(keys.commands_key(service_id)) == 0


def test_a_duplicated_step_is_applied_once_and_a_stale_one_dropped(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, _):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        client.env_step({0: 2, 1: 2})
        step = client._tagged(FLATLAND_RL.ENV_STEP, {"action": {0: 2, 1: 2}}, client._new_channel())
        stale_seq = client._seq - 1
        push(redis_conn, service_id, step)
        push(redis_conn, service_id, step)  # the same request again (a retried push)
        stale = codec.encode(
            {
                "type": FLATLAND_RL.ENV_STEP,
                "payload": {"action": {0: 4}, "arbiter": {"session": client.session, "seq": stale_seq}},
                "response_channel": client._new_channel(),
                "timestamp": 0.0,
            }
        )
        push(redis_conn, service_id, stale)
        wait_for(lambda: queue_empty(redis_conn, service_id), what="the evaluator to read the requests")
        wait_for(lambda: service.evaluation.counters["stale_requests"] == 1, what="the stale request counted")
        assert service.evaluation.current.steps == 2  # 1 + the duplicated one once
        assert service.evaluation.counters["resent_requests"] == 1


def test_a_resent_env_create_is_answered_from_the_cache(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, _):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        channel = client._new_channel()
        create = client._tagged(FLATLAND_RL.ENV_CREATE, {}, channel)
        push(redis_conn, service_id, create)
        push(redis_conn, service_id, create)
        replies = [codec.decode(redis_conn.blpop([channel], timeout=5)[1], codec.REPLY_LIMITS) for _ in range(2)]
        assert [r["payload"]["env_file_path"] for r in replies] == ["Test_0/Level_0.pkl"] * 2
        assert service.evaluation.next_index == 1  # one episode handed out, not two
        assert service.evaluation.counters["resent_requests"] == 1


def test_the_client_resends_a_request_whose_message_was_lost(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, resend_after_s=0.2)
        real_lpush = client.redis.lpush
        dropped = []

        def lose_the_first_push(key, message):
            if not dropped:
                dropped.append(message)  # as if Redis lost it
                return 1
            return real_lpush(key, message)

        client.redis.lpush = lose_the_first_push
        observation, _ = client.env_create()
        assert observation and dropped
        assert client.current_env_path == "Test_0/Level_0.pkl"
        client.redis.lpush = real_lpush
        for episode in range(3):
            if episode:
                client.env_create()
            play_episode(client, episode)
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3


def test_a_second_arbiter_client_is_refused_and_never_interleaves(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        first = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        first.env_create()
        with pytest.raises(ClientConflict, match="one client per evaluation"):
            RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        # The intruder's fire-and-forget steps (its own session) are dropped, never applied.
        intruder = RemoteClient.__new__(RemoteClient)
        intruder.session, intruder._seq = "intruder", 0
        for _ in range(5):
            push(redis_conn, service_id, intruder._tagged(FLATLAND_RL.ENV_STEP, {"action": {0: 4}}, "x"))
        wait_for(lambda: service.evaluation.counters["foreign_requests"] >= 6, what="the intruder's requests")
        assert service.evaluation.current.steps == 0
        play_episode(first, 0)
        for episode in (1, 2):
            first.env_create()
            play_episode(first, episode)
        first.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert service.evaluation.counters["foreign_requests"] == 6  # 1 PING + 5 steps


def test_a_legacy_client_cannot_join_an_evaluation_bound_to_arbiters_client(
    redis_server, service_id, tiny_tests, tmp_path
):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_server.url, service_id=service_id
    ) as (service, _):
        RemoteClient(redis_url=redis_server.url, service_id=service_id, reply_timeout_s=10)
        with pytest.raises(Exception, match="OTHER_CLIENT"):
            FlatlandRemoteClient(
                test_env_folder=tiny_tests, flatland_rl_service_id=service_id, remote_port=redis_server.port
            )
        assert service.evaluation.counters["foreign_requests"] == 1


def test_episode_identity_comes_from_the_evaluator(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        seen = []
        while client.env_create()[0]:
            seen.append(client.episode_index)
            while not client.env_step(seeded_actions(seen[-1], 0, 2))[2]["__all__"]:
                pass
        client.submit()
        finish(outcome)
    assert seen == [0, 1, 2]
    assert [e["index"] for e in read_episodes(str(tmp_path / "r"))] == [0, 1, 2]


def test_a_forked_agent_process_does_not_write_on_its_parents_step_connection(
    redis_url, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        num_agents = client.env.get_num_agents()
        client.env_step(seeded_actions(0, 0, num_agents))  # the step connection is open now
        parents = client._step_connection()
        # e.g. an agent that forks workers after connecting: a worker must not step on it
        child, childs_connection_pid = in_forked_child(lambda: client._step_connection().pid)
        assert int(childs_connection_pid) == child  # the child got a connection of its own
        assert client._step_connection() is parents  # and the parent kept its own, untouched
        step, done = 1, {"__all__": False}
        while not done["__all__"]:
            _, _, done, _ = client.env_step(seeded_actions(0, step, num_agents))
            step += 1
        for episode in range(1, 3):
            client.env_create()
            play_episode(client, episode)
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert [r["steps"] for r in read_episodes(results)][0] == step
