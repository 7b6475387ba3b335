"""server/service/build.py: one evaluator assembled from a competition spec, against the session's
redis-server and a real results folder: a fresh evaluation starts clean, a resumed one keeps what
a client may be waiting on, one that already ended cannot be resumed, and the episode hook hears
of each item once it is on disk."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, remote_episode, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.server.service.build import build_service


def play_all(redis_url: str, service_id: str, episodes: int) -> None:
    env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
    for _ in range(episodes):
        remote_episode(env, lambda observation: 1, {})
    env.submit()
    env.close()


def test_a_service_id_that_could_reach_other_keys_is_refused(redis_url, tmp_path):
    with pytest.raises(ValueError, match="invalid service id"):
        build_service(
            counting_competition(), tests=None, results_dir=str(tmp_path), redis_url=redis_url, service_id="a::*"
        )


def test_a_fresh_evaluation_clears_the_folder_and_the_evaluations_keys(redis_url, redis_conn, service_id, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "episodes.jsonl").write_text('{"index": 0, "unit": "somebody else\'s"}\n')
    (results / "summary.json").write_text('{"state": "SUCCESS"}')
    redis_conn.rpush(keys.commands_key(service_id), b"a request of an earlier evaluation")
    redis_conn.rpush(keys.errors_key(service_id), b"a timeout of an earlier evaluation")
    redis_conn.xadd(keys.events_key(service_id), {"old": 1})
    service = build_service(
        counting_competition(), tests=None, results_dir=str(results), redis_url=redis_url, service_id=service_id
    )
    try:
        assert not (results / "episodes.jsonl").exists() and not (results / "summary.json").exists()
        assert redis_conn.llen(keys.commands_key(service_id)) == 0 and redis_conn.llen(keys.errors_key(service_id)) == 0
        # The events stream holds this evaluation's start only (published in the background).
        events = keys.events_key(service_id)
        wait_for(
            lambda: [fields.get(b"event") for _, fields in redis_conn.xrange(events)] == [b"started"],
            what="the stream to hold this evaluation's start alone",
        )
    finally:
        service.close()


def test_a_resumed_evaluation_keeps_the_requests_a_client_sent(redis_url, redis_conn, service_id, tmp_path):
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=2)
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        service.request_stop("the evaluator is killed")
        finish(outcome)
    redis_conn.lpush(keys.commands_key(service_id), b"a request sent while no evaluator ran")
    resumed = build_service(
        competition, tests=None, results_dir=results, redis_url=redis_url, service_id=service_id, resume=True
    )
    try:
        assert redis_conn.llen(keys.commands_key(service_id)) == 1
        assert os.path.exists(os.path.join(results, "summary.json"))  # the interrupted run's, kept
    finally:
        resumed.close()


def test_an_evaluation_that_ended_cannot_be_resumed(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=1)
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        play_all(redis_url, service_id, episodes=1)
        assert finish(outcome)["state"] == "SUCCESS"
    with pytest.raises(ConfigError, match=f"the evaluation in {results} already ended \\(SUCCESS.*nothing to resume"):
        build_service(competition, tests=None, results_dir=results, redis_url=redis_url, service_id=service_id,
                      resume=True)  # fmt: skip


def test_the_episode_hook_hears_of_each_item_once_it_is_on_disk(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    heard: list[tuple[int, int]] = []

    def on_episode(record: dict[str, Any], evaluation: Any) -> None:
        heard.append((record["index"], len(read_episodes(results))))

    service = build_service(
        counting_competition(num_episodes=2), tests=None, results_dir=results, redis_url=redis_url,
        service_id=service_id, on_episode=on_episode,
    )  # fmt: skip
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=service.run()))
    thread.start()
    try:
        play_all(redis_url, service_id, episodes=2)
    finally:
        thread.join(timeout=20)
        service.close()
    assert outcome["summary"]["state"] == "SUCCESS"
    assert heard == [(0, 1), (1, 2)]
