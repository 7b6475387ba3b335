"""An episode of a Gymnasium env the server owns (server/formats/gym_episode.py), on a real
CartPole: the seed stays secret until the episode ends, actions outside the space are refused,
and an unfinished episode scores what the format says."""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest

from arbiter.protocol.errors import InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import space_from_wire
from arbiter.server.formats.base import Item, reset_seed
from arbiter.server.formats.gym_episode import GymEpisode, GymPlan


class CartPolePlan(GymPlan):
    def make_env(self):
        return gym.make("CartPole-v1")

    def make_items(self):
        return [Item(index=i, unit=f"episode{i}", fields={"episode": i}) for i in range(3)]


def make_plan(seed=7):
    spec = types.SimpleNamespace(seed=seed, max_episodes=None, options=None, budgets=None, name="gym-test")
    return CartPolePlan(spec, rule=None)


@pytest.fixture
def plan():
    made = make_plan()
    yield made
    made.close()


def test_each_item_is_reset_with_its_derived_seed_like_a_fresh_env(plan):
    item = plan.items[1]
    opened = plan.open(item)
    own = gym.make("CartPole-v1")
    expected, _ = own.reset(seed=reset_seed(7, 1))
    own.close()
    payload = opened.create_payload()
    np.testing.assert_array_equal(payload["observation"], expected)
    assert payload[EXTENSION_KEY] == {"episode": 1}  # where it sits, never its seed


def test_the_seed_is_revealed_by_the_step_that_ends_the_episode_only(plan):
    opened = plan.open(plan.items[0])
    replies = []
    while not opened.over:
        action, invalid = opened.sanitize(0)  # always left: CartPole falls within a few dozen steps
        opened.step(action)
        replies.append(opened.step_reply(invalid))
    assert all("seed" not in reply[EXTENSION_KEY] for reply in replies[:-1])
    assert replies[-1][EXTENSION_KEY]["seed"] == reset_seed(7, 0)
    assert replies[-1]["done"] and replies[-1]["step"] == len(replies)
    record = opened.records(finished=True, timeout=None, abandoned=False)[0]
    assert record["return"] == float(len(replies))  # CartPole pays 1 a step
    assert (record["seed"], record["steps"], record["partial_return"]) == (reset_seed(7, 0), len(replies), None)


def test_an_action_outside_the_space_is_refused_and_nothing_is_applied(plan):
    opened = plan.open(plan.items[0])
    with pytest.raises(InvalidAction, match="not in the action space"):
        opened.sanitize(5)
    with pytest.raises(InvalidAction, match=r"^action '1' \(str\) is not in the action space Discrete\(2\)"):
        opened.sanitize("1")  # told apart from the number 1
    assert opened.steps == 0
    with pytest.raises(RuntimeError, match="before any step"):
        opened.step_reply(0)


def test_an_unfinished_episode_scores_its_partial_return_or_the_formats_figure():
    env = gym.make("CartPole-v1")
    try:
        item = Item(index=0, unit="e0", fields={"episode": 0})
        for unfinished, expected in ((None, 2.0), (-9.0, -9.0)):
            opened = GymEpisode(env, item, seed=3, unfinished_return=unfinished)
            opened.step(0)
            opened.step(1)
            record = opened.records(finished=False, timeout="step", abandoned=False)[0]
            assert (record["return"], record["partial_return"]) == (expected, 2.0)
    finally:
        env.close()


def test_the_handshake_gives_the_envs_spaces_and_unplayed_items_score_zero(plan):
    spaces = plan.handshake()["spaces"]
    assert space_from_wire(spaces["action"]) == plan.env.action_space
    assert space_from_wire(spaces["observation"]) == plan.env.observation_space
    assert plan.unplayed_records(plan.items[2]) == [
        {"episode": 2, "seed": None, "steps": 0, "return": 0.0, "partial_return": None}
    ]
