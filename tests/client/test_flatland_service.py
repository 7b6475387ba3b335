"""client/flatland_service.py: what RemoteClient needs against flatland-rl's own evaluation service,
which sends no env state: the env is built from the participant's copy of the test folder. (The
client against flatland's real service is in tests/client/test_compatibility.py.)"""

from __future__ import annotations

import glob
import os

import flatland
import pytest

from arbiter.client.flatland_service import flatland_version, load_local_env
from arbiter.protocol.errors import ArbiterError


def test_the_handshake_names_the_installed_flatland():
    assert flatland_version() == flatland.__version__


def test_the_env_named_by_flatlands_reply_is_built_from_the_test_folder(tiny_tests):
    name = os.path.relpath(sorted(glob.glob(os.path.join(tiny_tests, "Test_*", "Level_*.pkl")))[0], tiny_tests)
    env = load_local_env(tiny_tests, name, None, record_steps=False)
    observation, _ = env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=1)
    assert env.get_num_agents() == 2 and len(observation) == 2


def test_without_a_test_folder_the_error_says_how_to_give_one():
    with pytest.raises(ArbiterError, match="set AICROWD_TESTS_FOLDER or pass test_env_folder="):
        load_local_env(None, "Test_0/Level_0.pkl", None, record_steps=False)


def test_a_test_file_not_in_the_folder_is_named(tiny_tests):
    with pytest.raises(ArbiterError, match=r"Test_9/Level_9.pkl not found \(AICROWD_TESTS_FOLDER="):
        load_local_env(tiny_tests, "Test_9/Level_9.pkl", None, record_steps=False)
