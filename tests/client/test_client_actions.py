"""What arbiter's client puts on the wire for the actions an agent hands to env_step."""

from __future__ import annotations

import numpy as np
from flatland.envs.rail_env_action import RailEnvActions

from arbiter.client.remote_client import _plain_actions


def test_plain_ints_pass_through_unchanged():
    actions = {0: 2, 1: 0, 7: 4}
    assert _plain_actions(actions) == actions


def test_flatland_actions_numpy_ints_and_strings_become_plain_ints():
    actions = _plain_actions(
        {np.int64(0): RailEnvActions.MOVE_FORWARD, 1: np.int32(3), "2": RailEnvActions.STOP_MOVING, 3.0: "1"}
    )
    assert actions == {0: 2, 1: 3, 2: 4, 3: 1}
    assert all(type(handle) is int and type(action) is int for handle, action in actions.items())


def test_no_actions():
    assert _plain_actions(None) == {} and _plain_actions({}) == {}
