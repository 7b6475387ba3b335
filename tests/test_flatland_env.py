"""How the evaluator builds its env: cheaper than a participant's, never different."""

from __future__ import annotations

import os

import numpy as np
from flatland.envs.persistence import RailEnvPersister

from arbiter.protocol.flatland_env import build_rail_env, rewards_for

SEED = 1001


def built(tests: str, env_path: str, **options) -> object:
    env_dict = RailEnvPersister.load_env_dict(os.path.join(tests, env_path))
    env = build_rail_env(env_dict, rewards=rewards_for("neurips2020"), **options)
    env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=SEED)
    return env


def test_a_lazy_distance_map_is_computed_on_first_read_and_equals_the_eager_one(tiny_tests):
    lazy = built(tiny_tests, "Test_0/Level_1.pkl", eager_distance_map=False)
    eager = built(tiny_tests, "Test_0/Level_1.pkl")
    assert lazy.distance_map.distance_map is None  # nothing computed at build time
    assert np.array_equal(lazy.distance_map.get(), eager.distance_map.get())


def test_the_evaluators_env_steps_exactly_like_a_participants(tiny_tests):
    """No per-step log, no eager distance map: the same positions, states and rewards."""
    for level in range(3):
        path = f"Test_0/Level_{level}.pkl"
        server = built(tiny_tests, path, record_steps=False, eager_distance_map=False)
        client = built(tiny_tests, path)
        rng = np.random.default_rng(level)
        done = {"__all__": False}
        while not done["__all__"]:
            actions = {h: int(a) for h, a in enumerate(rng.integers(0, 5, size=client.get_num_agents()))}
            _, server_rewards, server_done, _ = server.step(actions)
            _, rewards, done, _ = client.step(actions)
            assert server_rewards == rewards and server_done == done
            assert [(a.current_configuration, a.state) for a in server.agents] == [
                (a.current_configuration, a.state) for a in client.agents
            ]
        assert server.distance_map.distance_map is None  # never needed by the 2020 rewards
        assert client.cur_episode and not server.cur_episode
