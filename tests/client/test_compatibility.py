"""Both directions of compatibility with flatland-rl 4.3.0's own evaluator pieces.

- flatland's unmodified FlatlandRemoteClient completes an evaluation against arbiter's server,
  timeout path included, and receives its scores from submit();
- arbiter's client completes an evaluation against flatland's unmodified
  FlatlandRemoteEvaluationService.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import paths
import pytest
from flatland.core.env_observation_builder import DummyObservationBuilder
from flatland.evaluators.client import FlatlandRemoteClient
from flatland.evaluators.client import TimeoutException as FlatlandTimeoutException
from harness import finish, read_episodes, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.client.remote_client import flatland_redis_url
from arbiter.protocol import keys

HERE = str(paths.SUPPORT)


def test_flatland_client_against_arbiter_server(redis_server, redis_conn, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=0.3, planning_s=5),
        tests=tiny_tests,
        results=results,
        redis_url=redis_server.url,
        service_id=service_id,
    ) as (_, outcome):
        client = FlatlandRemoteClient(
            test_env_folder=tiny_tests, flatland_rl_service_id=service_id, remote_port=redis_server.port
        )
        episode = 0
        while True:
            observation, info = client.env_create(obs_builder_object=DummyObservationBuilder())
            if not observation:
                break
            step = 0
            try:
                while True:
                    if episode == 1 and step == 2:
                        # The agent stalls: the evaluator times the episode out, the client learns it.
                        time.sleep(0.6)
                        wait_for(lambda: redis_conn.llen(keys.errors_key(service_id)) > 0, what="the timeout")
                    _, _, done, _ = client.env_step(seeded_actions(episode, step, client.env.get_num_agents()))
                    step += 1
                    if done["__all__"]:
                        break
            except FlatlandTimeoutException as exc:
                assert str(exc) == "FLATLAND_RL.ENV_STEP_TIMEOUT"
                timed_out_at = (episode, step)
            episode += 1
        scores = client.submit()
        summary = finish(outcome)

    assert timed_out_at == (1, 2)
    assert summary["state"] == "SUCCESS"
    episodes = read_episodes(results)
    assert [e["timed_out"] for e in episodes] == [False, True, False]
    assert episodes[1]["normalized_return"] == -1.0
    # flatland's four submit figures, as its client prints and returns them
    assert set(scores) >= {"mean_reward", "sum_normalized_reward", "mean_percentage_complete", "mean_normalized_reward"}
    assert scores["mean_normalized_reward"] == pytest.approx(summary["score"]["primary"])


def test_flatland_and_arbiter_clients_see_the_same_scores(redis_server, service_id, tiny_tests, tmp_path):
    """Same seeded agent, two clients: the evaluator scores both runs identically."""
    scores = []
    for name, make_client in (
        (
            "flatland",
            lambda sid: FlatlandRemoteClient(
                test_env_folder=tiny_tests, flatland_rl_service_id=sid, remote_port=redis_server.port
            ),
        ),
        ("arbiter", lambda sid: RemoteClient(redis_url=redis_server.url, service_id=sid, reply_timeout_s=10)),
    ):
        sid = f"{service_id}-{name}"
        with running_service(
            spec(), tests=tiny_tests, results=str(tmp_path / name), redis_url=redis_server.url, service_id=sid
        ) as (_, outcome):
            client = make_client(sid)
            episode = 0
            while client.env_create(obs_builder_object=DummyObservationBuilder())[0]:
                step = 0
                while not client.env_step(seeded_actions(episode, step, client.env.get_num_agents()))[2]["__all__"]:
                    step += 1
                episode += 1
            client.submit()
            finish(outcome)
        scores.append([(e["steps"], e["normalized_return"]) for e in read_episodes(str(tmp_path / name))])
    assert scores[0] == scores[1]


def test_arbiter_client_against_flatland_service(redis_server, service_id, tiny_tests, tmp_path):
    service = subprocess.Popen(
        [
            sys.executable,
            os.path.join(HERE, "flatland_service_main.py"),
            tiny_tests,
            service_id,
            str(redis_server.port),
            str(tmp_path / "flatland_results.csv"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # flatland's service sends no env state: the client loads the participant's copy. Made as
        # a starter kit makes FlatlandRemoteClient, with its keywords, and stepped as kits step.
        client = RemoteClient(
            test_env_folder=tiny_tests,
            flatland_rl_service_id=service_id,
            remote_host="127.0.0.1",
            remote_port=redis_server.port,
            remote_db=0,
            remote_password=None,
            verbose=False,
            use_pickle=False,
        )
        episodes = 0
        while True:
            observation, info = client.env_create(obs_builder_object=DummyObservationBuilder())
            if not observation:
                break
            step = 0
            while True:
                actions = seeded_actions(episodes, step, client.env.get_num_agents())
                if step % 2:
                    _, _, done, _ = client.env_step(actions, render=True)
                else:
                    _, _, done, _ = client.env_step(action=actions, render=False)
                if done["__all__"]:
                    break
                step += 1
            episodes += 1
        scores = client.submit()
        output, _ = service.communicate(timeout=60)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert episodes == 3
    assert "FLATLAND_SERVICE_RESULT FLATLAND_RL.ENV_SUBMIT_RESPONSE" in output
    assert set(scores) == {"mean_reward", "sum_normalized_reward", "mean_percentage_complete", "mean_normalized_reward"}
    assert service.returncode == 0


def test_remote_client_takes_flatland_clients_keywords(redis_server, service_id, tiny_tests, tmp_path, caplog):
    """FlatlandRemoteClient's keywords, 4.3.0's and the 2020 client's: the Redis ones name the
    server, database and password; the service id and test folder map onto arbiter's; verbose
    logs the client's debug messages; use_pickle is accepted (the client speaks msgpack)."""
    database = 3
    url = f"redis://127.0.0.1:{redis_server.port}/{database}"
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=url, service_id=service_id
    ) as (_, outcome):
        with caplog.at_level(logging.DEBUG, logger="arbiter.client"):
            client = RemoteClient(
                flatland_rl_service_id=service_id,
                remote_port=redis_server.port,
                remote_db=database,
                test_envs_root=tiny_tests,
                verbose=True,
                use_pickle=True,
            )
            assert (client.redis_url, client.service_id, client.test_env_folder) == (url, service_id, tiny_tests)
            episode = 0
            while client.env_create(obs_builder_object=DummyObservationBuilder())[0]:
                step = 0
                while not client.env_step(seeded_actions(episode, step, client.env.get_num_agents()), True)[2][
                    "__all__"
                ]:
                    step += 1
                episode += 1
            scores = client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and episode == 3 and scores["score"] == summary["score"]["primary"]
    assert any(r.message.startswith("env_create: episode 0, ") for r in caplog.records)
    with pytest.raises(TypeError, match="as action_dict or as action, not both"):
        client.env_step({0: 2}, action={0: 2})


def test_flatlands_redis_keywords_make_the_url_flatlands_client_connects_to(monkeypatch):
    monkeypatch.delenv("redis_ip", raising=False)
    assert flatland_redis_url(None, None, None, None) is None  # none given: the environment decides
    assert flatland_redis_url(None, 6380, None, None) == "redis://127.0.0.1:6380/0"
    assert flatland_redis_url("cache", None, 2, "p@ss:w/rd") == "redis://:p%40ss%3Aw%2Frd@cache:6379/2"
    assert flatland_redis_url("::1", 6379, 0, None) == "redis://[::1]:6379/0"
    monkeypatch.setenv("redis_ip", "10.0.0.5")  # flatland's default host
    assert flatland_redis_url(None, None, 1, None) == "redis://10.0.0.5:6379/1"
