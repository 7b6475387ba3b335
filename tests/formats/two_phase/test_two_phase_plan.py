"""The two-phase plan (docs/formats/two-phase.md): items in the order the phases run, each
episode's seed derived as documented, the stages a runner is told, and the env it names."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.formats.base import options_from_dict, reset_seed
from arbiter.server.formats.two_phase import FORMAT
from arbiter.server.formats.two_phase.options import TwoPhaseOptions
from arbiter.server.formats.two_phase.plan import make_env

SEED = 77


def make_plan(**options):
    options.setdefault("num_episodes", 2)
    options.setdefault("phase2", {"num_runs": 2, "goal_reward": 50.0, "stability_window": 2, "max_steps": 1000,
                                  "step_s": 3.0})  # fmt: skip
    spec = types.SimpleNamespace(
        name="two-phase-test", seed=SEED, max_episodes=None, budgets=BudgetPolicy(step_s=0.5),
        options=options_from_dict(TwoPhaseOptions, options, "test"),
    )  # fmt: skip
    return FORMAT.make_plan(spec, FORMAT.rules["two-phase"](spec.options), tests=None)


@pytest.fixture
def plan():
    made = make_plan()
    yield made
    made.close()


def test_phase_1_then_each_run_training_and_its_evaluation_as_one_group(plan):
    assert [i.unit for i in plan.items] == [
        "phase1/eval/0", "phase1/eval/1",
        "phase2/run0/train", "phase2/run0/eval/0", "phase2/run0/eval/1",
        "phase2/run1/train", "phase2/run1/eval/0", "phase2/run1/eval/1",
    ]  # fmt: skip
    assert [i.group for i in plan.items] == [None, None] + ["phase2/run0"] * 3 + ["phase2/run1"] * 3
    assert plan.items[0].budgets is None
    assert plan.items[2].budgets.step_s == 3.0  # phase 2's own step budget
    stages = plan.handshake()["stages"]
    assert [(s["phase"], s["stage"], s["run"], s["items"]) for s in stages] == [
        (1, "eval", None, [0, 2]), (2, "train", 0, [2, 3]), (2, "eval", 0, [3, 5]),
        (2, "train", 1, [5, 6]), (2, "eval", 1, [6, 8]),
    ]  # fmt: skip


def test_evaluation_episodes_are_reset_with_the_documented_seeds(plan):
    for item, path in ((plan.items[1], (1, 1)), (plan.items[7], (3, 1, 1))):
        opened = plan.open(item)
        own = gym.make("CartPole-v1")
        expected, _ = own.reset(seed=reset_seed(SEED, *path))
        own.close()
        np.testing.assert_array_equal(opened.create_payload()["observation"], expected)
        assert opened.seed == reset_seed(SEED, *path)
    training = plan.open(plan.items[5])
    assert training.seed == reset_seed(SEED, 2, 1, 0)


def test_one_phase_alone_plans_that_phase_only():
    first, second = make_plan(phase=1), make_plan(phase=2)
    try:
        assert {i.fields["phase"] for i in first.items} == {1} and len(first.items) == 2
        assert {i.fields["phase"] for i in second.items} == {2} and len(second.items) == 6
    finally:
        first.close()
        second.close()


def test_an_unplayed_evaluation_scores_the_worst_return_and_an_unplayed_run_no_episode(plan):
    [evaluation] = plan.unplayed(plan.items[0])
    assert (evaluation["return"], evaluation["ended"], evaluation["seed"]) == (0.0, "not_played", None)
    [training] = plan.unplayed(plan.items[2])
    assert (training["episode"], training["total_steps"], training["complete"]) == (None, 0, False)


def test_a_training_run_is_announced_once_with_its_episodes_steps_and_ending(plan):
    record = {"phase": 2, "stage": "train", "run": 1, "episode": 4, "total_steps": 321, "converged_at": 321}
    assert plan.progress_text(record) == "phase 2 run 1 training: 5 episodes, 321 steps, converged at step 321"
    cut = {**record, "episode": 0, "total_steps": 1, "converged_at": None, "ended": "step_limit"}
    assert plan.progress_text(cut) == "phase 2 run 1 training: 1 episode, 1 step, ended step_limit"
    assert plan.progress_text({**record, "last_of_item": False}) is None


def test_env_ids_that_name_nothing_are_clear_errors():
    with pytest.raises(ConfigError, match="env_id 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0", {})
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_for_arbiter'"):
        make_env("no_such_module_for_arbiter:Env", {})
    env = make_env("gymnasium.envs.classic_control:CartPoleEnv", {})  # module:Class
    try:
        assert type(env).__name__ == "CartPoleEnv" and env.spec is None
    finally:
        env.close()


def test_env_kwargs_the_env_refuses_are_a_clear_error_naming_them():
    """Found when the plan is made, so `arbiter run --set 'env_kwargs={k = 1}'` says it in one line."""
    for env_id in ("CartPole-v1", "gymnasium.envs.classic_control:CartPoleEnv"):
        with pytest.raises(ConfigError, match=rf"env_id '{env_id}' with env_kwargs {{'k': 1}}: the env refuses them"):
            make_env(env_id, {"k": 1})
