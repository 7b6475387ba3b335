"""A two-phase training run on a real CartPole (docs/formats/two-phase.md, "Convergence" and "A
reset ends an episode"): the server counts steps, records every episode with its seed, ends the
run when the criterion is met or the step limit is reached, and a reset ends an episode."""

from __future__ import annotations

import gymnasium as gym
import pytest

from arbiter.server.core.summary import FINISHED, STEP_LIMIT
from arbiter.server.formats.base import Item, reset_seed
from arbiter.server.formats.two_phase.episodes import TrainingRun, reset_episode_cap
from arbiter.server.formats.two_phase.options import Phase2Options, TwoPhaseOptions

SEED = 4242
LEFT = 0  # always pushing left, a CartPole falls within a few dozen steps


@pytest.fixture
def env():
    made = gym.make("CartPole-v1")
    yield made
    made.close()


def training_run(env, run=1, **phase2):
    options = TwoPhaseOptions(phase2=Phase2Options(**phase2))
    item = Item(index=0, unit=f"phase2/run{run}/train", fields={"phase": 2, "stage": "train", "run": run})
    return TrainingRun(env, item, options, SEED)


def play_out(run) -> int:
    """Step the running episode to its end; its length."""
    steps = 0
    while True:
        steps += 1
        run.step(LEFT)
        if run.last_step[2] or run.last_step[3] or run.run_over:
            return steps


def test_the_run_converges_when_the_streak_completes_at_the_steps_counted_so_far(env):
    # CartPole pays 1 a step: every episode pushed left lasts more than 2 steps, so 2 reach goal 2
    run = training_run(env, goal_reward=2.0, stability_window=1, max_steps=10_000)
    first = play_out(run)
    assert not run.run_over
    run.next_reset()
    second = play_out(run)
    assert run.run_over and not run.limit_reached
    reply = run.step_reply(0)
    assert reply["done"] and reply["step"] == first + second
    records = run.records(finished=True, timeout=None, abandoned=False)
    assert [r["return"] for r in records] == [float(first), float(second)]
    assert [r["seed"] for r in records] == [reset_seed(SEED, 2, 1, 0), reset_seed(SEED, 2, 1, 1)]
    assert all(r["complete"] and r["converged_at"] == first + second and r["ended"] == FINISHED for r in records)
    assert reply["arbiter"]["seed"] == reset_seed(SEED, 2, 1, 1)  # the ending step names its seed


def test_a_reset_mid_episode_records_it_and_a_short_one_breaks_the_streak(env):
    run = training_run(env, goal_reward=5.0, stability_window=1, max_steps=10_000)
    first = play_out(run)
    run.next_reset()
    run.step(LEFT)
    run.step(LEFT)
    run.next_reset()  # abandoned after 2 steps: return 2 < goal 5
    third = play_out(run)
    assert not run.run_over  # episodes 1 and 3 reach the goal but the reset one stands between them
    records = run.records(finished=False, timeout=None, abandoned=True)
    reset = records[1]
    assert (reset["agent_reset"], reset["complete"], reset["steps"], reset["return"]) == (True, False, 2, 2.0)
    assert reset["partial_return"] == 2.0
    assert [r["total_steps"] for r in records] == [first, first + 2, first + 2 + third]


def test_a_reset_that_completes_the_streak_ends_the_run_at_the_next_step_with_nothing_applied(env):
    run = training_run(env, goal_reward=2.0, stability_window=1, max_steps=10_000)
    first = play_out(run)
    run.next_reset()
    run.step(LEFT)
    run.step(LEFT)
    run.step(LEFT)
    payload = run.next_reset()  # return 3 ≥ 2 after a first ≥ 2: converged at this reset
    assert run.run_over and run.tracker.step == first + 3
    assert run.step(LEFT) is True
    assert run.last_step[3] is True and run.total_steps == first + 3  # truncated, no env step taken
    assert payload["arbiter"]["episode"] == 2  # handed out by the converging reset, never played:
    assert [r["episode"] for r in run.records(finished=True, timeout=None, abandoned=False)] == [0, 1]


def test_the_step_limit_cuts_the_running_episode_and_it_does_not_count(env):
    """The cut episode stood above the goal (3 ≥ 1) when it was cut: it still counts for nothing."""
    run = training_run(env, goal_reward=1.0, stability_window=1, max_steps=3)
    for _ in range(3):
        over = run.step(LEFT)
    assert over and run.limit_reached
    assert run.last_step[3] is True  # the agent sees its episode truncated
    records = run.records(finished=True, timeout=None, abandoned=False)
    assert len(records) == 1 and records[0]["ended"] == STEP_LIMIT
    assert (records[0]["complete"], records[0]["agent_reset"], records[0]["converged_at"]) == (False, False, None)


def test_a_timeout_marks_only_the_episode_it_cut_short(env):
    run = training_run(env, goal_reward=500.0, stability_window=1, max_steps=10_000)
    play_out(run)
    run.next_reset()
    run.step(LEFT)
    records = run.records(finished=False, timeout="step", abandoned=False)
    assert [r["timed_out"] for r in records] == [False, True]
    assert records[1]["steps"] == 1 and not records[1]["complete"]


def test_a_reset_episode_counts_as_it_stood_unless_rewards_can_be_negative():
    cartpole, mountain_car = gym.make("CartPole-v1"), gym.make("MountainCar-v0")
    try:
        assert reset_episode_cap(TwoPhaseOptions(env_id="CartPole-v1"), cartpole) is None
        # MountainCar pays −1 a step for 200 steps: a reset episode counts as the worst, −200
        solved = Phase2Options(goal_reward=-110.0)  # MountainCar's own "solved" threshold
        assert reset_episode_cap(TwoPhaseOptions("MountainCar-v0", phase2=solved), mountain_car) == -200.0
    finally:
        cartpole.close()
        mountain_car.close()
