"""``RemoteEnv.spec`` is the registration of the evaluator's env, as ``gymnasium.make`` gives it:
an agent that reads ``env.spec.max_episode_steps`` or ``env.spec.reward_threshold`` (or a
Gymnasium wrapper that does) sees the env it plays, with a real CartPole-v1 evaluation."""

from __future__ import annotations

import gymnasium
from gymnasium.wrappers import RecordEpisodeStatistics
from harness import finish, read_episodes, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.core.competition import load_competition


def test_the_spec_is_the_evaluators_envs_registration(redis_url, service_id, tmp_path):
    competition = load_competition(
        "two-phase-cartpole", ["phase=1", "num_episodes=1", "env_kwargs={max_episode_steps=30}"]
    )
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        registered = gymnasium.spec("CartPole-v1")
        assert env.spec is not None and env.spec.id == "CartPole-v1"
        assert env.spec.reward_threshold == registered.reward_threshold == 475.0
        assert env.spec.entry_point == registered.entry_point
        assert env.spec.max_episode_steps == 30  # the organiser's, as gymnasium.make made it
        wrapped = RecordEpisodeStatistics(env)
        assert wrapped.spec.id == "CartPole-v1"
        observation, _ = wrapped.reset()
        steps, done = 0, False
        while not done:  # push towards where the pole falls: it stays up past 30 steps
            action = int(observation[2] + 0.5 * observation[3] > 0)
            observation, _, terminated, truncated, info = wrapped.step(action)
            steps += 1
            done = terminated or truncated
        assert truncated and steps == env.spec.max_episode_steps and info["episode"]["l"] == steps
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert [record["steps"] for record in read_episodes(results)] == [30]
