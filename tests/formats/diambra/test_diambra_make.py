"""``arbiter.client.diambra.make``: the env a DIAMBRA script makes has what diambra-arena's own env
has (its attributes and methods, ``info["settings"]``), the organiser's game and settings win
over the script's, diambra-arena stays an optional extra, and an unchanged DIAMBRA script (but
its import) with wrappers plays an evaluation under ``arbiter run``."""

from __future__ import annotations

import bz2
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from harness import finish, read_episodes, read_summary, running_service, wait_for

pytest.importorskip("diambra.arena")

import paths  # noqa: E402
from diambra.arena import (  # noqa: E402
    EnvironmentSettings,
    EnvironmentSettingsMultiAgent,
    RecordingSettings,
    Roles,
    SpaceTypes,
)

from arbiter.client.diambra import DiambraRemoteEnv, make  # noqa: E402
from arbiter.protocol.errors import ConfigError, WrongFormat  # noqa: E402
from arbiter.server.core.competition import load_competition  # noqa: E402
from arbiter.server.formats.diambra.env import DiambraEnv  # noqa: E402

REPO = str(paths.REPO)


def test_the_env_has_diambras_env_attributes_and_methods(redis_url, service_id, tmp_path, capsys):
    competition = load_competition("diambra", ["game=kof98umh", "frame_shape=[64, 64, 1]", "difficulty=hard"])
    holder = DiambraEnv(competition.options)
    own = holder._env  # diambra-arena's own env, made on the engine mock from the same settings
    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        env = make("kof98umh", redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        try:
            assert isinstance(env, DiambraRemoteEnv) and env.unwrapped is env
            assert env.env_info == own.env_info  # the engine's description, protobuf for protobuf
            for key in ("game_id", "frame_shape", "step_ratio", "n_players", "action_space", "difficulty", "outfits"):
                assert getattr(env.env_settings, key) == getattr(own.env_settings, key), key
            assert env.env_settings.difficulty == 8 and env.env_settings.seed is None
            assert env.env_settings.valid_characters == own.env_settings.valid_characters
            assert env.max_delta_health == own.max_delta_health > 0
            assert env.n_actions == own.n_actions and env.get_actions_tuples() == own.get_actions_tuples()
            assert env.get_no_op_action() == own.get_no_op_action() == [0, 0]
            assert env.get_cumulative_reward_bounds() == own.get_cumulative_reward_bounds()
            assert env.print_actions_dict == own.print_actions_dict
            observation, info = env.reset()
            seed = env.episode.get("seed")  # never told before the episode's end
            assert seed is None and info["settings"] is env.env_settings.pb_model
            player = info["settings"].episode_settings.player_settings[0]
            assert Roles.Name(player.role) in ("P1", "P2") and len(player.characters) == 3
            assert info["settings"].episode_settings.random_seed == 0
            env.show_obs(observation, viz=False)
            shown = capsys.readouterr().out
            own_observation, _ = own.reset(seed=3)
            own.show_obs(own_observation, viz=False)
            own_shown = capsys.readouterr().out
            # the same lines, entry by entry (the values differ: two episodes), characters by name
            assert [line.split(":")[0] for line in shown.splitlines()] == [
                line.split(":")[0] for line in own_shown.splitlines()
            ]
            character = int(observation["P1"]["character"])
            assert f"{character} / {own.env_info.characters_info.char_list[character]}" in shown
        finally:
            env.close()
            holder.close()


def test_the_organisers_game_and_settings_win(redis_url, service_id, tmp_path):
    competition = load_competition("diambra", ["game=doapp", "frame_shape=[64, 64, 1]", "difficulty=hard"])
    connect = {"redis_url": redis_url, "service_id": service_id, "reply_timeout_s": 10}

    def settings(**fields):
        made = EnvironmentSettings()
        for key, value in fields.items():
            setattr(made, key, value)
        return made

    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        with pytest.raises(ConfigError, match=r"make\('sfiii3n'\): this evaluation plays 'doapp'"):
            make("sfiii3n", **connect)
        with pytest.raises(ConfigError, match=r"frame_shape = \(0, 0, 0\).* has frame_shape = \(64, 64, 1\)"):
            make("doapp", EnvironmentSettings(), **connect)
        shown = r"action_space = SpaceTypes.DISCRETE.*SpaceTypes.MULTI_DISCRETE"
        with pytest.raises(ConfigError, match=shown):
            make("doapp", settings(frame_shape=(64, 64, 1), action_space=SpaceTypes.DISCRETE), **connect)
        with pytest.raises(ConfigError, match=r"step_ratio = 1"):
            make("doapp", {"frame_shape": (64, 64, 1), "step_ratio": 1}, **connect)
        with pytest.raises(ConfigError, match=r"n_players = 2"):
            make("doapp", EnvironmentSettingsMultiAgent(frame_shape=(64, 64, 1)), **connect)
        asked = settings(frame_shape=(64, 64, 1), difficulty=2, role=Roles.P1, characters="Kasumi", tower=3)
        with pytest.warns(UserWarning) as warned:
            env = make("doapp", asked, **connect)
        said = sorted(str(w.message) for w in warned if "is not applied" in str(w.message))
        assert said == [
            "settings.characters = 'Kasumi' is not applied: the evaluation's characters is drawn by the evaluator "
            "at each reset",
            "settings.difficulty = 2 is not applied: the evaluation's difficulty is 4",
            "settings.role = Roles.P1 is not applied: the evaluation's role is drawn by the evaluator at each reset",
        ]  # tower = 3 is diambra-arena's default: nothing said
        try:
            _, info = env.reset()
            assert info["settings"].episode_settings.difficulty == 4  # the evaluator's, not the script's
        finally:
            env.close()


def test_episode_recording_settings_record_the_episode_on_the_agents_side(redis_url, service_id, tmp_path):
    """diambra-arena's EpisodeRecorder, as its make applies it, writes the episode the agent played."""
    competition = load_competition("diambra", ["game=doapp", "frame_shape=[64, 64, 1]"])
    dataset = tmp_path / "dataset"
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        recording = RecordingSettings(dataset_path=str(dataset), username="agent")
        env = make("doapp", None, None, recording, redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        _, info = env.reset()
        settings = info["settings"]
        while not env.step(env.action_space.sample())[2]:
            pass
        env.reset()
        env.close()
        service.agent_exited(0)
        finish(outcome)
    (record,) = read_episodes(results)

    def recorded():
        files = list(dataset.glob("*.diambra"))
        try:
            with bz2.BZ2File(files[0]) as handle:
                return pickle.load(handle)  # the agent's own file, written by diambra-arena
        except (IndexError, EOFError, OSError):
            return None  # not written yet

    saved = wait_for(recorded, timeout_s=5, what="the recorded episode")
    assert saved["episode_summary"]["steps"] == record["steps"] == len(saved["data"])
    assert saved["episode_summary"]["username"] == "agent" and saved["episode_summary"]["env_settings"] == settings


def test_a_non_diambra_evaluation_refuses_the_diambra_env(redis_url, service_id, tmp_path):
    competition = load_competition("two-phase-cartpole", [])
    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        with pytest.raises(WrongFormat):
            make("doapp", redis_url=redis_url, service_id=service_id, reply_timeout_s=10)


def test_without_diambra_arena_the_module_imports_and_make_says_how_to_install_it():
    probe = textwrap.dedent(
        """
        import sys
        sys.modules["diambra"] = None  # as if the diambra extra were not installed
        import arbiter.client.diambra as module
        try:
            module.make("doapp")
        except ImportError as exc:
            print("ImportError:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "ImportError: arbiter.client.diambra needs diambra-arena" in done.stdout
    assert "pip install 'arbiter[diambra]'" in done.stdout


# DIAMBRA's single-player example with wrappers, as its documentation writes it, with one change:
# the import of make.
SCRIPT = """
from arbiter.client.diambra import make  # was: from diambra.arena import make
from diambra.arena import EnvironmentSettings, WrappersSettings

settings = EnvironmentSettings()
settings.frame_shape = (64, 64, 1)
settings.step_ratio = 6

wrappers_settings = WrappersSettings()
wrappers_settings.normalize_reward = True
wrappers_settings.stack_frames = 4
wrappers_settings.add_last_action = True
wrappers_settings.stack_actions = 12
wrappers_settings.role_relative = True
wrappers_settings.flatten = True
wrappers_settings.filter_keys = ["stage", "timer", "own_health", "opp_health", "action"]

env = make("doapp", settings, wrappers_settings, render_mode="human")
observation, info = env.reset(seed=42)
env.unwrapped.show_obs(observation, viz=False)
total, steps = 0.0, 0
while True:
    env.render()
    actions = env.action_space.sample()
    observation, reward, terminated, truncated, info = env.step(actions)
    total += reward
    steps += 1
    if terminated or truncated:
        observation, info = env.reset()
        if info["env_done"]:
            break
print("RESULT", steps, total, env.unwrapped.reward_normalization_value)
env.close()
"""


def test_an_unchanged_diambra_script_with_wrappers_plays_under_arbiter_run(redis_url, service_id, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(SCRIPT)
    results = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "diambra", "--set", "game=doapp",
         "--set", "difficulty=medium", "--set", "episodes=2", "--set", "frame_shape=[64, 64, 1]",
         "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--",
         sys.executable, str(agent)],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    records = read_episodes(str(results))
    assert [r["ended"] for r in records] == ["finished", "finished"]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    _, steps, seen, normalization = line.split()
    assert int(steps) == sum(r["steps"] for r in records)
    # the agent saw normalized rewards; the evaluation scored the env's own
    assert float(seen) * float(normalization) == pytest.approx(sum(r["reward"] for r in records), abs=1e-6)
    assert float(normalization) == 0.5 * 208
    assert summary["score"]["secondary"] == pytest.approx(sum(r["reward"] for r in records) / 2, abs=1e-9)
    assert json.loads(json.dumps(summary["options"]))["game"] == "doapp"
    assert os.path.exists(results / "results.csv")
