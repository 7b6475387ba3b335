"""A plain Gymnasium loop on RemoteEnv (the one the docs show, no stages followed) through a
two-phase evaluation with training runs: the step that ends a run is its episode's last, the
next reset() goes on to what the plan holds next, and every item gets played."""

from __future__ import annotations

from typing import Any

import pytest
from fake_envs import fake_spec
from harness import finish, read_episodes, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import OutOfOrder


def plain_loop(env: RemoteEnv, seen: list[dict[str, Any]]) -> None:
    """docs/reference/clients.md's loop, always action 1 (an episode of 10 ≥ the goal of 9)."""
    observation, info = env.reset()
    while not info["env_done"]:
        done = False
        while not done:
            observation, reward, terminated, truncated, info = env.step(1)
            done = terminated or truncated
        seen.append({"stage": env.episode.get("stage"), "stage_over": info["arbiter"].get("stage_over")})
        observation, info = env.reset()


def test_the_documented_loop_plays_every_training_run_and_its_evaluation(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    seen: list[dict[str, Any]] = []
    with running_service(fake_spec(phase=2), tests=None, results=results, redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        plain_loop(env, seen)
        assert env.finished
        with pytest.raises(OutOfOrder, match="no episode left.*submit"):
            env.step(1)
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    records = read_episodes(results)
    # Each run: three episodes of 10 complete the streak (goal 9, window 2) at step 15, the
    # third one ending the run; then its two evaluation episodes.
    for run in (0, 1):
        train = [r for r in records if r["run"] == run and r["stage"] == "train"]
        evaluation = [r for r in records if r["run"] == run and r["stage"] == "eval"]
        assert [r["return"] for r in train] == [10.0] * 3 and train[-1]["converged_at"] == 15
        assert [r["return"] for r in evaluation] == [10.0, 10.0]
    assert [s["stage"] for s in seen] == ["train"] * 3 + ["eval"] * 2 + ["train"] * 3 + ["eval"] * 2
    # The third training episode's last step ended its run; an evaluation episode is a stage of its own.
    assert [bool(s["stage_over"]) for s in seen] == [False, False, True, True, True] * 2
    assert [run["convergence_step"] for run in summary["score"]["runs"]] == [15, 15]


def test_a_step_after_the_run_ended_raises_stop_iteration_and_reset_goes_on(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    spec = fake_spec(phase=2, phase2={"num_runs": 1})
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for _ in range(3):
            env.reset()
            for _ in range(5):
                _, _, terminated, truncated, info = env.step(1)
        assert info["arbiter"]["stage_over"] is True and (terminated or truncated)
        with pytest.raises(StopIteration, match="ended this training run"):
            env.step(1)
        with pytest.raises(StopIteration):  # still over: nothing was sent
            env.step(0)
        _, info = env.reset()
        assert info["arbiter"]["stage"] == "eval" and not info["env_done"]
        env.submit()
        env.close()
        summary = finish(outcome)
    train = [r for r in read_episodes(results) if r["stage"] == "train"]
    assert sum(r["steps"] for r in train) == 15  # the refused steps were never applied
    assert summary["state"] == "SUCCESS"
