"""An outage is not a second try. An agent that can make Redis fail (push it past a memory limit
so that it restarts) and then skip a sequence number used to make the evaluator play its
episode again: a second try on the same seed, the better one kept; in a training run, a step
count started again from 0 while the agent kept what it had learnt. Whether anything is played
again is now never decided on the client's word: the episode and the run go on from where they
were, and the gap is only counted.
"""

from __future__ import annotations

import os
import signal

import pytest
from harness import finish, read_episodes, running_service, wait_for

from arbiter.client import RemoteEnv
from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port
from arbiter.server.core.competition import load_competition


@pytest.fixture
def restartable_redis():
    """A private redis-server this test may kill and start again on the same port."""
    port = free_port()
    servers = [EmbeddedRedis(port=port).start()]

    def restart() -> None:
        os.kill(servers[-1].pid, signal.SIGKILL)
        servers[-1].stop()
        servers.append(EmbeddedRedis(port=port).start())

    yield servers[0].url, restart
    servers[-1].stop()


def outage_then_skip(env: RemoteEnv, service, restart) -> None:
    """Redis restarts (losing everything it held); the evaluator sees the outage; the agent then
    skips a sequence number, as if a request had been lost in it."""
    outages = service.transport.outages
    restart()
    # The evaluator finds the outage at its next wait for Redis, and rides it out.
    wait_for(lambda: service.transport.outages > outages, what="the evaluator to see the outage")
    env.wire._seq += 1


def test_an_episode_goes_on_after_an_outage_and_a_skipped_request(restartable_redis, service_id, tmp_path):
    url, restart = restartable_redis
    competition = load_competition("two-phase-cartpole", ["phase=1", "num_episodes=1", "seed=5"])
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=url, service_id=service_id, reply_timeout_s=30)
        env.reset()
        sent = 0
        for _ in range(5):
            env.step(0)
            sent += 1
        outage_then_skip(env, service, restart)
        done = False
        while not done:  # the same episode: no EpisodeLost, no new reset
            _, _, terminated, truncated, _ = env.step(1)
            sent += 1
            done = terminated or truncated
        env.submit()
        env.close()
        summary = finish(outcome)
    records = read_episodes(results)
    assert [r["index"] for r in records] == [0]
    assert records[0]["steps"] == sent  # every step counted once, in one episode
    assert summary["counters"]["lost_requests"] == 1
    assert summary["counters"].get("replayed_items", 0) == 0
    assert summary["state"] == "SUCCESS"


def test_a_training_run_keeps_its_step_count_through_an_outage(restartable_redis, service_id, tmp_path):
    url, restart = restartable_redis
    competition = load_competition(
        "two-phase-cartpole",
        [
            "phase=2",
            "num_episodes=1",
            "phase2.num_runs=1",
            "phase2.max_steps=60",
            "phase2.goal_reward=20",
            "phase2.stability_window=1",
            "seed=5",
        ],
    )
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=url, service_id=service_id, reply_timeout_s=30)
        train = next(stage for stage in env.stages if stage["stage"] == "train")
        env.begin_stage(train)
        env.reset()
        sent = 0
        for _ in range(25):
            _, _, terminated, truncated, info = env.step(0)
            sent += 1
            if terminated or truncated:
                env.reset()
        outage_then_skip(env, service, restart)
        with pytest.raises(StopIteration):  # the run ends at its step limit, counted from its start
            while True:
                _, _, terminated, truncated, info = env.step(0)
                sent += 1
                if terminated or truncated:
                    env.reset()
        assert info["arbiter"]["total_steps"] == 60
        env.close()
    training = [r for r in read_episodes(results) if r["stage"] == "train"]
    assert sent == 60 and training[-1]["total_steps"] == 60
    assert service.evaluation.counters["lost_requests"] == 1
