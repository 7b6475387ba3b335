"""Training runs against agents that reset mid-episode: an episode ended by a reset has ended. Its
return counts in the convergence criterion (its partial return where rewards are never negative,
the worst return where they can be), its steps count, and so does a reset before any step.

A real redis-server, the evaluator in this process, agents on RemoteEnv. Convergence is
recomputed with this file's own arithmetic from the records and from the agents' own plays."""

from __future__ import annotations

from typing import Any

import pytest
from harness import finish, read_episodes, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.core.competition import spec_from_dict

GOAL = 9.0  # the fake env's episode of five action-1 steps returns 10, of five action-0 steps 5


def competition(**extra: Any) -> Any:
    """Phase 2 on the fake env (1 per step, +1 for action 1; episodes of ``length`` steps)."""
    data: dict[str, Any] = {
        "format": "two-phase", "seed": 11, "phase": 2, "env_id": "fake_envs:CountingEnv",
        "env_kwargs": {"length": 5, "bonus": 1.0}, "reward_per_step": [1.0, 2.0], "worst_return": 0.0,
        "num_episodes": 1,
        "phase2": {"max_steps": 120, "goal_reward": GOAL, "stability_window": 2, "num_runs": 1,
                   "step_s": 5.0, "planning_s": 5.0, "run_budget_s": 60.0},
        "budgets": {"step_s": 5.0, "planning_s": 5.0, "idle_s": 10.0, "overall_s": 120.0},
    }  # fmt: skip
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return spec_from_dict("resets", data)


def episode_actions(episode: int, bad_episodes: set[int], length: int = 5) -> list[int]:
    """A noisy policy's episode: all action 1 (return 2 per step), or all action 0 on a bad one."""
    return [0 if episode in bad_episodes else 1] * length


def play_run(env: RemoteEnv, bad_episodes: set[int], *, hostile: bool) -> list[tuple[int, float, bool]]:
    """One training run until the evaluator ends it. The hostile agent resets an episode as soon
    as a step pays less than 2 (it is going badly); the honest one plays every episode out.
    Returns what the agent played, per episode: (steps, return, reset mid-episode)."""
    played: list[tuple[int, float, bool]] = []
    episode = 0
    try:
        while True:
            env.reset()
            steps, total, reset_early = 0, 0.0, False
            for action in episode_actions(episode, bad_episodes):
                _, reward, terminated, truncated, _ = env.step(action)
                steps, total = steps + 1, total + reward
                if terminated or truncated:
                    break
                if hostile and reward < 2.0:
                    reset_early = True
                    break
            played.append((steps, total, reset_early))
            episode += 1
    except StopIteration:
        return played


def streak_convergence(episodes: list[tuple[int, float]], goal: float, window: int) -> int | None:
    """The streak criterion over (steps, counted return) of every ended episode, at the run's
    total steps when the streak completes."""
    total = streak = 0
    for steps, counted in episodes:
        total += steps
        streak = streak + 1 if counted >= goal else 0
        if streak == window + 1:
            return total
    return None


def evaluate(spec: Any, tmp_path: Any, redis_url: str, service_id: str, agent: Any) -> tuple[Any, dict, list[dict]]:
    """Serve ``spec``; ``agent(env)`` plays the training run; the evaluation episode is played out."""
    results = str(tmp_path / f"r-{service_id}")
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        played = agent(env)
        env.begin_stage(env.stages[1])
        env.reset()
        for _ in range(5):
            env.step(1)
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    return played, summary, [r for r in read_episodes(results) if r["stage"] == "train"]


def test_resetting_the_bad_episodes_converges_no_sooner_than_playing_them_out(redis_url, service_id, tmp_path):
    """Bad luck in episodes 2 and 5, then none. Honest play converges after episode 8 (45 steps).
    An agent that abandons its bad episodes after one step must not converge at its third good
    one (16 steps) as if the bad ones never happened: each abandoned episode breaks the streak,
    and its step counts. It converges after its episode 8 too, with 8 fewer steps played."""
    bad = {2, 5}
    honest, honest_summary, honest_train = evaluate(
        competition(), tmp_path, redis_url, service_id + "h", lambda env: play_run(env, bad, hostile=False)
    )
    hostile, hostile_summary, hostile_train = evaluate(
        competition(), tmp_path, redis_url, service_id + "x", lambda env: play_run(env, bad, hostile=True)
    )
    assert [steps for steps, _, _ in hostile] == [5, 5, 1, 5, 5, 1, 5, 5, 5]
    assert [r["agent_reset"] for r in hostile_train] == [False, False, True, False, False, True, False, False, False]
    assert [(r["steps"], r["return"], r["partial_return"]) for r in hostile_train if r["agent_reset"]] == [
        (1, 1.0, 1.0),
        (1, 1.0, 1.0),
    ]
    assert [r["total_steps"] for r in hostile_train] == [5, 10, 11, 16, 21, 22, 27, 32, 37]
    for played, summary, train in ((honest, honest_summary, honest_train), (hostile, hostile_summary, hostile_train)):
        want = streak_convergence([(steps, total) for steps, total, _ in played], GOAL, 2)
        run = summary["score"]["runs"][0]
        assert run["converged"] and run["convergence_step"] == want == train[-1]["converged_at"]
    assert honest_summary["score"]["convergence"] == 45.0
    assert hostile_summary["score"]["convergence"] == 37.0  # not 16: what the old rule gave it


def test_an_agent_that_abandons_every_bad_episode_is_penalized_like_honest_play(redis_url, service_id, tmp_path):
    """Every third episode goes badly: honest play never has three good episodes in a row, and
    neither does the agent that abandons the bad ones; both are penalized at the step limit."""
    bad = set(range(2, 1000, 3))
    for who, hostile in (("h", False), ("x", True)):
        played, summary, train = evaluate(
            competition(), tmp_path, redis_url, service_id + who, lambda env, h=hostile: play_run(env, bad, hostile=h)
        )
        run = summary["score"]["runs"][0]
        assert not run["converged"] and run["penalized"] and run["score"] == 1.5 * 120
        assert train[-1]["ended"] == "step_limit" and train[-1]["total_steps"] == 120
        assert sum(1 for r in train if r["agent_reset"]) == (sum(1 for *_, reset in played if reset) if hostile else 0)
        assert streak_convergence([(s, t) for s, t, _ in played], GOAL, 2) is None


def test_the_mean_criterion_counts_abandoned_episodes_too(redis_url, service_id, tmp_path):
    """Mean of the last 2 episodes ≥ 9: alternating good (10) and bad (5) episodes never get there,
    and abandoning the bad ones after a step (1) does not either (the old rule counted 10, 10)."""
    spec = competition(phase2={"criterion": "mean", "max_steps": 60})
    played, summary, train = evaluate(
        spec, tmp_path, redis_url, service_id, lambda env: play_run(env, set(range(1, 1000, 2)), hostile=True)
    )
    counted = [r["return"] for r in train if r["complete"] or r["agent_reset"]]
    assert counted[:4] == [10.0, 1.0, 10.0, 1.0]
    assert all((a + b) / 2 < GOAL for a, b in zip(counted, counted[1:], strict=False))
    assert not summary["score"]["runs"][0]["converged"]


def test_where_rewards_can_be_negative_an_abandoned_episode_counts_as_the_worst_return(redis_url, service_id, tmp_path):
    """-1 per step, +0.5 for action 1: a full good episode returns -2.5, the goal is -3. One step
    and a reset would "reach" it with a partial return of -0.5 every time; it counts as the worst
    return (-5) instead, so resetting after every step never converges."""
    spec = competition(
        env_kwargs={"length": 5, "reward": -1.0, "bonus": 0.5}, reward_per_step=[-1.0, -0.5], worst_return=-5.0,
        phase2={"goal_reward": -3.0, "max_steps": 40},
    )  # fmt: skip

    def reset_after_every_step(env: RemoteEnv) -> None:
        try:
            while True:
                env.reset()
                env.step(1)
        except StopIteration:
            return

    _, summary, train = evaluate(spec, tmp_path, redis_url, service_id, reset_after_every_step)
    abandoned = [r for r in train if r["agent_reset"]]
    assert len(abandoned) == 39 and all((r["return"], r["partial_return"]) == (-5.0, -0.5) for r in abandoned)
    assert not summary["score"]["runs"][0]["converged"] and summary["score"]["convergence"] == 1.5 * 40


def test_a_reset_after_reaching_the_goal_counts_and_can_end_the_run(redis_url, service_id, tmp_path):
    """Ten-step episodes: five action-1 steps already return 10 ≥ 9 and rewards are never
    negative, so an episode abandoned there reached the goal. The third completes the streak: the
    run converges at that reset (15 steps); the episode it hands out ends at its first step, with
    nothing applied, and the next reset is refused with StopIteration."""
    spec = competition(env_kwargs={"length": 10, "bonus": 1.0})
    seen: dict[str, Any] = {}

    def reach_then_reset(env: RemoteEnv) -> None:
        for _ in range(3):
            env.reset()
            for _ in range(5):
                env.step(1)
        _, info = env.reset()  # the run converged with this reset
        _, reward, terminated, truncated, info = env.step(1)
        seen.update(reward=reward, terminated=terminated, truncated=truncated, ext=info["arbiter"])
        with pytest.raises(StopIteration):
            env.reset()

    _, summary, train = evaluate(spec, tmp_path, redis_url, service_id, reach_then_reset)
    assert [(r["steps"], r["return"], r["agent_reset"]) for r in train] == [(5, 10.0, True)] * 3
    assert train[-1]["converged_at"] == 15 and train[-1]["ended"] == "finished"
    assert not any(r["timed_out"] for r in train)
    assert (seen["reward"], seen["terminated"], seen["truncated"]) == (0.0, False, True)
    assert seen["ext"]["stage_over"] is True and seen["ext"]["total_steps"] == 15  # the step was not applied
    assert summary["score"]["runs"][0]["convergence_step"] == 15


def test_a_reset_before_any_step_is_an_episode_too(redis_url, service_id, tmp_path):
    """Rerolling the start is not free: two resets in a row record an episode of no step, which
    breaks the streak (return 0); the run converges three good episodes later than without it."""

    def reroll_once(env: RemoteEnv) -> None:
        try:
            for episode in range(100):
                env.reset()
                if episode == 2:
                    env.reset()  # the start looked hard: another one
                for _ in range(5):
                    env.step(1)
        except StopIteration:
            return

    _, summary, train = evaluate(competition(), tmp_path, redis_url, service_id, reroll_once)
    assert [(r["steps"], r["return"], r["agent_reset"]) for r in train] == (
        [(5, 10.0, False)] * 2 + [(0, 0.0, True)] + [(5, 10.0, False)] * 3
    )
    assert summary["score"]["runs"][0]["convergence_step"] == 25  # 15 had the reroll been free


def test_a_run_holds_no_more_episodes_than_steps_however_often_the_agent_resets(redis_url, service_id, tmp_path):
    """Resets without a step each record an episode: at max_steps episodes (20 here) the run ends
    at its limit, as if it had taken its steps, and the resets after it record nothing more."""
    spec = competition(phase2={"max_steps": 20})
    seen: dict[str, Any] = {}

    def reset_only(env: RemoteEnv) -> None:
        for _ in range(20):
            env.reset()
        env.reset()  # the twentieth episode ended: the run is over, and this one is never played
        _, reward, _, truncated, info = env.step(1)
        seen.update(reward=reward, truncated=truncated, stage_over=info["arbiter"]["stage_over"])
        with pytest.raises(StopIteration):
            env.reset()

    _, summary, train = evaluate(spec, tmp_path, redis_url, service_id, reset_only)
    assert len(train) == 20 and all((r["steps"], r["agent_reset"]) == (0, True) for r in train)
    assert train[-1]["ended"] == "step_limit"
    assert (seen["reward"], seen["truncated"], seen["stage_over"]) == (0.0, True, True)
    assert not summary["score"]["runs"][0]["converged"] and summary["score"]["convergence"] == 1.5 * 20
