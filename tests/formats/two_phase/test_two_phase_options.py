"""The two-phase competition keys (docs/formats/two-phase.md, "Competition keys" and
"Feasibility"): bad values say why, an unreachable goal is refused at load, and a timed-out
episode's worst return comes from the env's reward bounds."""

from __future__ import annotations

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import options_from_dict
from arbiter.server.formats.two_phase.options import (
    Phase2Options,
    TwoPhaseOptions,
    check_feasible,
    worst_return,
)


@pytest.mark.parametrize(
    "data,message",
    [
        ({"num_episodes": 0}, "num_episodes must be a whole number >= 1"),
        ({"phase": 3}, "phase must be 1 or 2"),
        ({"reward_per_step": [1.0, -1.0]}, r"reward_per_step must be \[min, max\]"),
        ({"phase2": {"criterion": "median"}}, "phase2.criterion must be one of"),
        ({"phase2": {"stability_window": 0}}, "phase2.stability_window must be a whole number >= 1"),
        ({"phase2": {"penalty_factor": -1.0}}, "phase2.penalty_factor must be a positive number"),
        ({"phase2": {"goal": 1.0}}, r"unknown keys \['phase2.goal'\]"),
    ],
)
def test_bad_keys_are_refused_saying_which_and_why(data, message):
    with pytest.raises(ConfigError, match=message):
        options_from_dict(TwoPhaseOptions, data, "test")


def test_the_penalty_is_the_factor_times_the_step_limit():
    assert Phase2Options(max_steps=1000, penalty_factor=2.0).penalty == 2000.0
    assert Phase2Options().penalty == 1.5 * Phase2Options().max_steps


def options(env_id="CartPole-v1", **phase2):
    return TwoPhaseOptions(env_id=env_id, phase2=Phase2Options(**phase2))


def test_a_goal_is_feasible_when_window_plus_one_episodes_fit_in_max_steps():
    # CartPole-v1 pays 1 a step: goal 100 takes 100 steps, a streak of window 4 takes 5 such episodes
    check_feasible(options(goal_reward=100.0, stability_window=4, max_steps=500), max_episode_steps=500)
    with pytest.raises(ConfigError, match="= 500 env steps, more than phase2.max_steps = 499"):
        check_feasible(options(goal_reward=100.0, stability_window=4, max_steps=499), max_episode_steps=500)
    # the mean criterion needs the window alone
    check_feasible(options(goal_reward=100.0, stability_window=4, max_steps=400, criterion="mean"), 500)


def test_a_goal_one_episode_cannot_reach_is_refused():
    with pytest.raises(ConfigError, match="cannot be reached in one episode of CartPole-v1"):
        check_feasible(options(goal_reward=600.0, max_steps=100_000), max_episode_steps=500)
    with pytest.raises(ConfigError, match="gives at most 0 per step"):
        check_feasible(options("Acrobot-v1", goal_reward=1.0), max_episode_steps=500)
    # phase 1 alone trains nothing: nothing to check
    check_feasible(TwoPhaseOptions(phase=1, phase2=Phase2Options(goal_reward=600.0)), max_episode_steps=500)


def test_the_worst_return_is_the_lowest_the_env_can_give_and_never_above_zero():
    assert worst_return(options(), 500) == 0.0  # CartPole's lowest is 1 × 500, capped at 0
    assert worst_return(options("MountainCar-v0", goal_reward=-110.0), 200) == -200.0  # its "solved" goal
    assert worst_return(TwoPhaseOptions(env_id="MountainCar-v0", worst_return=-7, phase=1), 200) == -7.0
    assert worst_return(TwoPhaseOptions(env_id="x:Y", reward_per_step=[-2.0, 1.0]), 10) == -20.0
    with pytest.raises(ConfigError, match="set worst_return for x:Y"):
        worst_return(TwoPhaseOptions(env_id="x:Y"), 10)
