"""Flatland test folders: ``Test_<t>/Level_<l>.pkl`` + ``metadata.csv``, served in (t, l) order.

The test files are the organiser's own (trusted) pickles; nothing that arrives over the wire is
ever unpickled. Each episode's env is rebuilt from the file's env dict, reset with the
evaluation seed exactly as flatland's service and client do, and its state is sent to
arbiter's client as allowlisted plain data (protocol.flatland_env).
"""

from __future__ import annotations

import ast
import csv
import gc
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from arbiter.protocol import codec
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.legacy.flatland_env import build_rail_env, env_state_to_wire, release_flatland_caches, rewards_for
from arbiter.server.formats.flatland.generate import list_env_paths

# flatland's RailEnvActions: DO_NOTHING, MOVE_LEFT, MOVE_FORWARD, MOVE_RIGHT, STOP_MOVING
NUM_ACTIONS = 5


class BrokenTestFile(Exception):
    """A test file that cannot be loaded. Not an ``ArbiterError``: no reply can make up for it,
    and the evaluation fails (no score) rather than count its episodes against the agent."""


@dataclass(frozen=True)
class EpisodeSpec:
    index: int
    env: str  # path relative to the test folder, e.g. "Test_0/Level_1.pkl"
    test: str  # "Test_0"
    level: str  # "Level_1"


# How flatland reads one agent's action (RailEnvActions.from_value): the five numbers, each
# action's name in its two spellings, and a digit string read as its number. Looked up with
# Python's own equality, as flatland does, so 2.0, numpy's 2 and True (== 1) read as it reads them.
_ACTION_NAMES = ("DO_NOTHING", "MOVE_LEFT", "MOVE_FORWARD", "MOVE_RIGHT", "STOP_MOVING")
_ACTIONS: dict[object, int] = {
    **{number: number for number in range(NUM_ACTIONS)},
    **{name: number for number, name in enumerate(_ACTION_NAMES)},
    **{f"RailEnvActions.{name}": number for number, name in enumerate(_ACTION_NAMES)},
}


def sanitize_actions(action: object, num_agents: int) -> tuple[dict[int, int], int]:
    """The documented invalid-action policy: drop what is invalid, count it, never fail.

    Each agent's action is what flatland's own env makes of the same map, ``action.get(handle)``
    read by ``RailEnvActions.from_value``, so an unmodified client, which steps its own copy of
    the env with that map, stays in step with the evaluator's. What flatland reads as no action
    (a value that is none of the five, a key that is no agent's handle) leaves that agent doing
    DO_NOTHING, flatland's own default, and is counted. Returns the clean actions and the count.
    """
    if action is None:
        return {}, 0
    if not isinstance(action, dict):
        return {}, 1
    clean: dict[int, int] = {}
    invalid = 0
    for handle, value in action.items():
        # What every client sends: plain ints (bool is a subclass, so exact types are checked).
        if type(handle) is int and type(value) is int and 0 <= handle < num_agents and 0 <= value < NUM_ACTIONS:
            clean[handle] = value
            continue
        agent = _agent_of(handle, num_agents)
        read = _action_of(value)
        if agent is None or read is None:
            invalid += 1
        else:
            clean[agent] = read
    return clean, invalid


def _agent_of(key: object, num_agents: int) -> int | None:
    """The handle ``key`` stands for in a map flatland reads with ``get(handle)``, or None."""
    if not isinstance(key, (int, float, np.number)):  # a string is no handle to flatland's get()
        return None
    try:
        handle = int(key)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # nan, infinities, complex numbers
        return None
    return handle if handle == key and 0 <= handle < num_agents else None


def _action_of(value: object) -> int | None:
    """The action flatland reads ``value`` as, or None where it reads none (DO_NOTHING by default)."""
    if isinstance(value, str) and value.isdigit():
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):  # "07", "²": flatland's own reading fails on these
            return None
    try:
        return _ACTIONS.get(value)
    except TypeError:  # unhashable: a list, a map
        return None


def _no_info() -> dict[str, Any]:
    return {}


class FlatlandEpisode:
    """One opened episode: the server's env, reset with the evaluation seed."""

    def __init__(
        self, tests_dir: str, spec: EpisodeSpec, seed: int | None, reward_model: str, keep_step_rewards: bool = False
    ):
        from flatland.envs.persistence import RailEnvPersister
        from flatland.envs.step_utils.states import TrainState

        self._done_state = TrainState.DONE
        self.spec = spec
        self.seed = seed
        try:
            env_dict = RailEnvPersister.load_env_dict(os.path.join(tests_dir, spec.env))
        except Exception as exc:  # a truncated or foreign file: the organiser's to fix, so it is named
            raise BrokenTestFile(
                f"the test file {spec.env} under {tests_dir} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        # Encoded before building (build_rail_env rewrites the dict's agents in place), and packed
        # now: an episode opened ahead of time is then sent without packing its state again.
        self.wire_state = codec.Packed(env_state_to_wire(env_dict))
        # flatland's per-step log is the client's business; the evaluator keeps what it needs.
        self.env = build_rail_env(env_dict, rewards=rewards_for(reward_model), record_steps=False)
        self.observation, self.info = self.env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=seed)
        # flatland builds a step's info (four dicts over every agent, ~10 % of a step) for the
        # caller; the evaluator never reads it (the participant's env builds its own), and
        # building it changes nothing in the env. The reset's info above is the real one.
        self.env.get_info_dict = _no_info
        self.num_agents = self.env.get_num_agents()
        self.max_episode_steps = int(self.env._max_episode_steps)
        self.steps = 0
        self.reward = 0.0
        # The steps' non-zero rewards, in order, where the rule sums them step by step (flatland3):
        # a zero step adds exactly nothing to flatland's running sum, so it need not be kept.
        self.step_rewards: list[float] | None = [] if keep_step_rewards else None
        self.done = False
        self.malfunctions = 0
        self.deadlocked: int | None = None  # trains deadlocked after the last step of a finished episode

    def create_payload(self) -> dict[str, Any]:
        """The legacy ENV_CREATE_RESPONSE fields (arbiter's extension is added by the caller)."""
        return {
            "observation": self.observation,
            "info": self.info,
            "random_seed": self.seed,
            "env_file_path": self.spec.env,
        }

    def step(self, actions: dict[int, int]) -> bool:
        """Apply one step; returns True when the episode is over."""
        _, rewards, dones, _ = self.env.step(actions)
        self.steps += 1
        step_reward = float(sum(rewards.values()))
        self.reward += step_reward
        if step_reward and self.step_rewards is not None:
            self.step_rewards.append(step_reward)
        self.malfunctions += sum(
            1 for agent in self.env.agents if agent.malfunction_handler.malfunction_down_counter == 1
        )
        self.done = bool(dones["__all__"])
        if self.done:
            self.deadlocked = self._deadlocked()
        return self.done

    def _deadlocked(self) -> int:
        """flatland's ``nb_deadlocked_trains``: the trains whose position is in the env's motion
        check's deadlocked set after the last step (its step recorder's last column)."""
        deadlocked = self.env.motion_check.deadlocked
        count = 0
        for agent in self.env.agents:
            configuration = agent.current_configuration
            position = configuration[0] if configuration is not None else None
            count += int(position in deadlocked)
        return count

    def arrived(self) -> int:
        return sum(1 for agent in self.env.agents if agent.state == self._done_state)

    def close(self) -> None:
        """The episode is recorded: its env is let go. flatland's caches and the cycle between the
        env and its observation builder are all that keep it; the cycle is broken here, and the
        caches are cleared by the next ``FlatlandTestFolder.open``, which frees the env without
        a collection. Clearing them here would put that work between the episode's last step and
        the agent's next ENV_CREATE; an episode opened ahead is opened while the evaluator would
        otherwise wait. ``steps``, ``reward`` and ``malfunctions`` stay; ``arrived()`` needs the
        env and is read before."""
        env, self.env = self.env, None
        if env is not None:
            env.obs_builder.env = None


_flatland_set_aside = False  # flatland's modules are loaded and, if the process freezes, frozen


class FlatlandTestFolder:
    """The env adapter for a Flatland test folder."""

    name = "flatland"

    def __init__(self, tests_dir: str, seed: int | None = 1001, max_episodes: int | None = None):
        if not os.path.isdir(tests_dir):
            what = "is a file, not a folder" if os.path.exists(tests_dir) else "does not exist"
            raise ConfigError(f"test folder {tests_dir!r} {what}")
        self.tests_dir = tests_dir
        self.seed = seed
        try:
            paths = list_env_paths(tests_dir)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if max_episodes is not None:
            paths = paths[:max_episodes]
        self.episodes = [
            EpisodeSpec(index=i, env=p, test=p.split("/")[0], level=os.path.splitext(p.split("/")[1])[0])
            for i, p in enumerate(paths)
        ]
        self.metadata_columns, self.metadata = self._read_metadata()

    def _read_metadata(self) -> tuple[list[str], dict[str, dict[str, str]]]:
        path = os.path.join(self.tests_dir, "metadata.csv")
        if not os.path.exists(path):
            raise ConfigError(f"metadata.csv not found in test folder {self.tests_dir!r}")
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns = list(reader.fieldnames or [])
            if "test_id" not in columns or "env_id" not in columns:
                raise ConfigError(f"{path} needs test_id and env_id columns")
            rows = {f"{row['test_id']}/{row['env_id']}.pkl": row for row in reader}
        return columns, rows

    def metadata_rows(self) -> tuple[dict[str, int], int]:
        """Each env's row in flatland's results table, and the table's length: the rows of
        ``metadata.csv`` in its order (flatland's service builds the table from it), then the
        envs it lacks, which flatland's table gains at its end as they are played."""
        positions = {env: row for row, env in enumerate(self.metadata)}
        for spec in self.episodes:
            positions.setdefault(spec.env, len(positions))
        return positions, len(positions)

    def open(self, spec: EpisodeSpec, reward_model: str, keep_step_rewards: bool = False) -> FlatlandEpisode:
        # Earlier episodes' envs are garbage once flatland's caches let go of them; each sits in
        # a reference cycle (env <-> observation builder), so collect now rather than at some
        # later full pass: the evaluator's memory stays flat over thousands of episodes.
        global _flatland_set_aside
        release_flatland_caches()  # flatland's env modules load at the first call
        gc.collect()
        if not _flatland_set_aside and gc.get_freeze_count():
            # A process that set aside what it had loaded before serving (service/build.py's
            # gc.freeze) sets aside flatland's modules too, now that they are loaded: each
            # episode's collection then scans what episodes left behind, not those modules again.
            gc.freeze()
        _flatland_set_aside = True
        return FlatlandEpisode(self.tests_dir, spec, self.seed, reward_model, keep_step_rewards)
