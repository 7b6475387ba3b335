"""Flatland test folders and their episodes (docs/formats/flatland.md): the folder's episodes in
(test, level) order, the documented invalid-action policy, and an episode's reward as the chosen
reward model gives it, on the session's tiny test set."""

from __future__ import annotations

import csv
import os
import shutil

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.flatland.episodes import BrokenTestFile, FlatlandTestFolder, sanitize_actions

DO_NOTHING = 0


@pytest.mark.parametrize(
    "action,clean,invalid",
    [
        (None, {}, 0),
        ({0: 2, 1: 4}, {0: 2, 1: 4}, 0),
        ({np.int64(1): np.int32(3), 0: "1"}, {1: 3, 0: 1}, 0),  # numpy ints, and digit strings as values
        ({"0": 1}, {}, 1),  # a string is no handle: flatland's env.get(0) does not find it
        ({0: 5, 1: -1}, {}, 2),  # values outside 0–4
        ({2: 1, -1: 1, 0: 1}, {0: 1}, 2),  # handles that are no agent of a 2-agent env
        ({0: True, 1: 2.5}, {0: 1}, 1),  # True == 1, as flatland reads it; 2.5 is no action
        ({0: 2.0, True: "3"}, {0: 2, 1: 3}, 0),
        ({0: "MOVE_FORWARD", 1: "RailEnvActions.STOP_MOVING"}, {0: 2, 1: 4}, 0),  # flatland's names
        ({0: " 2", 1: "move_forward"}, {}, 2),
        ([2, 2], {}, 1),  # not a map
    ],
)
def test_invalid_actions_are_dropped_and_counted_never_failing(action, clean, invalid):
    assert sanitize_actions(action, num_agents=2) == (clean, invalid)


@pytest.mark.parametrize(
    "action",
    [{0: 2, 1: 4}, {0: "MOVE_LEFT", 1: "RailEnvActions.MOVE_RIGHT"}, {True: 2, 0.0: "4"},
     {np.int64(1): np.float64(3.0)}, {"1": 2, 0: 9}, {0: False, 1: " 3"}, {0: None}, {}],
)  # fmt: skip
def test_each_agent_gets_the_action_flatlands_own_env_reads_from_the_same_map(action):
    """An unmodified client steps its own copy of the env with the map it sent: the evaluator's
    copy must get the same action for every agent, or the two part ways."""
    from flatland.envs.rail_env_action import RailEnvActions

    clean, _ = sanitize_actions(action, num_agents=2)
    for handle in range(2):
        flatlands = RailEnvActions.from_value(action.get(handle, RailEnvActions.DO_NOTHING))
        assert clean.get(handle, DO_NOTHING) == flatlands.value


def test_the_folder_lists_its_episodes_in_test_and_level_order_with_their_metadata(tiny_tests):
    folder = FlatlandTestFolder(tiny_tests, seed=5)
    with open(os.path.join(tiny_tests, "metadata.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [e.env for e in folder.episodes] == [f"{r['test_id']}/{r['env_id']}.pkl" for r in rows]
    assert [(e.index, e.test, e.level) for e in folder.episodes] == [
        (i, r["test_id"], r["env_id"]) for i, r in enumerate(rows)
    ]
    assert folder.metadata[folder.episodes[1].env]["n_agents"] == rows[1]["n_agents"]
    assert len(FlatlandTestFolder(tiny_tests, max_episodes=2).episodes) == 2


def test_broken_folders_are_refused_saying_what_is_missing(tiny_tests, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        FlatlandTestFolder(str(tmp_path / "nowhere"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):  # not "does not exist": it does
        FlatlandTestFolder(str(tmp_path / "a-file"))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_tests, copy)
    os.remove(copy / "metadata.csv")
    with pytest.raises(ConfigError, match="metadata.csv not found"):
        FlatlandTestFolder(str(copy))
    (copy / "metadata.csv").write_text("test,env\nTest_0,Level_0\n")
    with pytest.raises(ConfigError, match="needs test_id and env_id columns"):
        FlatlandTestFolder(str(copy))


def test_a_test_file_that_cannot_be_loaded_is_named(tiny_tests, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_tests, copy)
    folder = FlatlandTestFolder(str(copy))
    level = copy / folder.episodes[1].env
    level.write_bytes(level.read_bytes()[:300])  # cut short, as a failed copy leaves it
    folder.open(folder.episodes[0], "neurips2020")  # the others open as ever
    with pytest.raises(BrokenTestFile, match=f"the test file {folder.episodes[1].env} under .* cannot be loaded: "):
        folder.open(folder.episodes[1], "neurips2020")


def test_an_episode_collects_minus_one_per_agent_not_arrived_under_neurips2020(tiny_tests):
    folder = FlatlandTestFolder(tiny_tests, seed=5)
    episode = folder.open(folder.episodes[0], "neurips2020")
    try:
        agents = episode.num_agents
        for _ in range(3):  # nobody departs, nobody arrives: each agent pays 1 a step
            assert episode.step({handle: DO_NOTHING for handle in range(agents)}) is False
        assert (episode.steps, episode.reward, episode.arrived()) == (3, -3.0 * agents, 0)
        payload = episode.create_payload()
        assert (payload["random_seed"], payload["env_file_path"]) == (5, folder.episodes[0].env)
    finally:
        episode.close()
    assert episode.env is None and episode.reward == -3.0 * agents  # freed, figures kept


def test_flatlands_own_rewards_give_nothing_per_step(tiny_tests):
    folder = FlatlandTestFolder(tiny_tests, seed=5)
    episode = folder.open(folder.episodes[0], "flatland")
    try:
        for _ in range(3):
            episode.step({})
        assert episode.reward == 0.0
    finally:
        episode.close()


def test_the_same_seed_resets_the_same_episode(tiny_tests):
    folder = FlatlandTestFolder(tiny_tests, seed=9)
    first, second = (folder.open(folder.episodes[2], "neurips2020") for _ in range(2))
    try:
        starts = [
            [(a.initial_configuration, a.targets, a.earliest_departure, a.latest_arrival) for a in e.env.agents]
            for e in (first, second)
        ]
        assert starts[0] == starts[1]
        assert first.max_episode_steps == second.max_episode_steps > 0
    finally:
        first.close()
        second.close()


OPENING = """
import gc, sys
from arbiter.server.formats.flatland.episodes import FlatlandTestFolder
folder = FlatlandTestFolder(sys.argv[1], seed=5)
if sys.argv[2] == "frozen":
    gc.freeze()  # what a service does once it is built (service/build.py)
for spec in folder.episodes[:2]:
    episode = folder.open(spec, "neurips2020")
    episode.close()
flatland = [obj for obj in gc.get_objects() if isinstance(obj, type) and str(obj.__module__).startswith("flatland")]
print(len(flatland), gc.get_freeze_count() > 0)
"""


@pytest.mark.parametrize("process", ["frozen", "plain"])
def test_flatlands_modules_are_set_aside_with_what_a_freezing_process_loaded(tiny_tests, process):
    # flatland's modules load at the first episode; in a process that froze what it had loaded
    # before serving, they are frozen too, so the collection that opening every episode runs
    # does not scan them again. A process that never froze is left as it is.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", OPENING, tiny_tests, process], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    in_sight, frozen = done.stdout.split()
    if process == "frozen":
        assert (int(in_sight), frozen) == (0, "True")
    else:
        assert int(in_sight) > 0 and frozen == "False"
