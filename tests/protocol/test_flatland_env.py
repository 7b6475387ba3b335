"""How both sides build their env: cheaper than flatland's ``load_new``, never different."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from flatland.envs.persistence import RailEnvPersister

from arbiter.protocol.legacy.flatland_env import build_rail_env, rewards_for

SEED = 1001


def reset(env: object) -> object:
    env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=SEED)
    return env


def built(path: str, reward_model: str = "neurips2020", **options) -> object:
    return reset(build_rail_env(RailEnvPersister.load_env_dict(path), rewards=rewards_for(reward_model), **options))


def loaded(path: str, reward_model: str = "neurips2020") -> object:
    env, _ = RailEnvPersister.load_new(path, rewards=rewards_for(reward_model))
    return reset(env)


def lockstep(ours: object, reference: object, seed: int) -> Iterator[tuple[tuple, tuple]]:
    """Both envs stepped with the same random actions until the reference is done: each step's
    (obs, rewards, done, info) from ours and from the reference."""
    rng = np.random.default_rng(seed)
    done = {"__all__": False}
    while not done["__all__"]:
        actions = {h: int(a) for h, a in enumerate(rng.integers(0, 5, size=reference.get_num_agents()))}
        ours_step = ours.step(actions)
        reference_step = reference.step(actions)
        done = reference_step[2]
        yield ours_step, reference_step


def test_the_distance_map_is_computed_on_first_read_and_equals_load_news(tiny_tests):
    path = os.path.join(tiny_tests, "Test_0/Level_1.pkl")
    lazy, eager = built(path), loaded(path)
    assert lazy.distance_map.distance_map is None  # nothing computed at build time
    assert np.array_equal(lazy.distance_map.get(), eager.distance_map.get())


def test_a_distance_map_saved_in_the_env_dict_is_recomputed_after_reset_as_by_load_new(tiny_tests):
    """After a reset, load_new's get() recomputes whatever the file saved; so must the lazy build."""
    path = os.path.join(tiny_tests, "Test_0/Level_1.pkl")
    eager = loaded(path)
    env_dict = RailEnvPersister.load_env_dict(path)
    env_dict["distance_map"] = np.zeros_like(eager.distance_map.get())  # a stale map in the file
    lazy = reset(build_rail_env(env_dict, rewards=rewards_for("neurips2020")))
    assert eager.distance_map.get().any()
    assert np.array_equal(lazy.distance_map.get(), eager.distance_map.get())


@pytest.mark.parametrize("reward_model", ["neurips2020", "flatland"])
def test_an_env_without_the_step_recorder_steps_exactly_like_load_news(tiny_tests, reward_model):
    """The evaluator's env and arbiter's client env (no per-step log, lazy distance map)
    against flatland's own load_new: the same positions, states, rewards and dones."""
    for level in range(3):
        path = os.path.join(tiny_tests, f"Test_0/Level_{level}.pkl")
        ours = built(path, reward_model, record_steps=False)
        reference = loaded(path, reward_model)
        for (_, our_rewards, our_done, _), (_, rewards, done, _) in lockstep(ours, reference, seed=level):
            assert our_rewards == rewards and our_done == done
            assert [(a.current_configuration, a.state) for a in ours.agents] == [
                (a.current_configuration, a.state) for a in reference.agents
            ]
        assert reference.cur_episode and not ours.cur_episode


def test_record_steps_keeps_flatlands_per_step_log(tiny_tests):
    path = os.path.join(tiny_tests, "Test_0/Level_0.pkl")
    ours, reference = built(path, record_steps=True), loaded(path)
    for step in range(5):
        actions = {h: (step + h) % 5 for h in range(reference.get_num_agents())}
        ours.step(actions)
        reference.step(actions)
    assert len(ours.cur_episode) == len(reference.cur_episode) == 5
    assert ours.cur_episode == reference.cur_episode


def tree_observer() -> object:
    from flatland.envs.observations import TreeObsForRailEnv
    from flatland.envs.predictions import ShortestPathPredictorForRailEnv

    return TreeObsForRailEnv(max_depth=2, predictor=ShortestPathPredictorForRailEnv(max_depth=10))


def test_tree_observations_read_the_lazy_distance_map_exactly_like_load_news(tiny_tests):
    """The usual Flatland agent's observations (tree + shortest-path predictions, both built on
    the distance map) are the same on arbiter's client env as on a load_new env."""
    for level in range(3):
        path = os.path.join(tiny_tests, f"Test_0/Level_{level}.pkl")
        ours = build_rail_env(RailEnvPersister.load_env_dict(path), obs_builder=tree_observer(), record_steps=False)
        reference, _ = RailEnvPersister.load_new(path, obs_builder=tree_observer())
        our_obs, _ = ours.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=SEED)
        obs, _ = reference.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=SEED)
        assert repr(our_obs) == repr(obs)
        assert any(node is not None for node in obs.values())  # real trees, not empty observations
        for (our_obs, _, _, _), (obs, _, _, _) in lockstep(ours, reference, seed=level):
            assert repr(our_obs) == repr(obs)
