"""``DiambraEnv``: diambra-arena's real gymnasium env, made from arbiter's settings.

It is the env a DIAMBRA evaluation steps on the server: built on a real engine at
``engine_address``, or on diambra-arena's engine mock when the address is None (everything made
on the mock says ``engine: "mock"``). It resets at the level of the chosen difficulty with the
seed it is given, reports the episode's reward bounds, and hands out observations that are
members of its observation space (diambra-arena's own hold int64 arrays where the space says
int16) and ``info`` made of plain values only.

Invalid actions: an action that is not an element of the action space is replaced by the no-op
action (no move, no attack: a controller left alone, as the game's clock runs on whatever the
agent sends) and counted; the episode goes on. Nothing outside the space ever reaches the engine.
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium
import numpy as np

from arbiter.protocol.errors import EvaluationError
from arbiter.protocol.spaces import action_for
from arbiter.server.formats.base import reset_seed
from arbiter.server.formats.diambra.engine import (
    ENGINE_MOCK,
    ENGINE_REAL,
    MockEngine,
    PrivateRandom,
    build_single_player_env,
)
from arbiter.server.formats.diambra.scoring import Bounds, choose_bounds
from arbiter.server.formats.diambra.settings import DiambraSettings

GAME_STATES = ("round_done", "stage_done", "game_done", "episode_done")
# diambra-arena's EnvironmentSettings fields an agent's side is told (arena_description): what is
# played and how it is seen, never the seed, the engine's address or the agent's display.
ARENA_SETTINGS = (
    "game_id", "frame_shape", "step_ratio", "n_players", "action_space", "difficulty", "continue_game",
    "show_final", "tower", "role", "characters", "outfits", "super_art", "fighting_style", "ultimate_style",
    "speed_mode",
)  # fmt: skip
_SEED_LIMIT = 2**31  # the engine's seed field is an int32; diambra-arena wants it >= 0


def episode_seed(base: int | None, *path: int) -> int | None:
    """``base.reset_seed`` brought into the range of the engine's seed field (int32)."""
    seed = reset_seed(base, *path)
    return None if seed is None else seed % _SEED_LIMIT


class DiambraEnv(gymnasium.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, settings: DiambraSettings, *, engine_address: str | None = None, **mock_options: Any):
        """``mock_options`` go to ``DiambraEngineMock`` (``fps``, ``override_perfect_probability``)
        and are refused with a real engine."""
        super().__init__()
        if engine_address is not None and mock_options:
            raise ValueError(f"mock options {sorted(mock_options)} given with a real engine at {engine_address!r}")
        self.settings = settings
        self.engine = ENGINE_MOCK if engine_address is None else ENGINE_REAL
        self.engine_address = engine_address
        self.level = settings.level
        self._random = PrivateRandom()
        self._mock_options = mock_options
        factory = self._mock_engine if engine_address is None else None
        try:
            with self._random.active():
                self._env = build_single_player_env(arena_settings(settings, engine_address), factory)
        except AssertionError as exc:  # diambra-arena checks its settings with assert
            raise EvaluationError(f"diambra-arena refused the settings: {exc}") from None
        except Exception as exc:
            if engine_address is None:
                raise
            raise EvaluationError(f"no DIAMBRA engine answered at {engine_address}: {exc}") from exc
        self.observation_space = self._env.observation_space
        self.action_space = self._env.action_space
        self._selectable = list(self._env.env_settings.valid_characters)
        self.seed_used: int | None = None
        self.drawn: dict[str, Any] = {}  # the episode's settings as the env drew them (role, characters ...)
        self.invalid_actions = 0  # in the current episode

    def _mock_engine(self, _address: str, _timeout_s: int) -> MockEngine:
        return MockEngine(self.level, **self._mock_options)

    # -- gymnasium.Env ----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """A new episode at the settings' level. Without a seed one is drawn (and reported), so
        every episode's seed is known. ``options`` are not accepted: the settings are fixed."""
        if options:
            raise ValueError("DiambraEnv takes no reset options: its settings are fixed when it is made")
        if seed is None:
            seed = random.SystemRandom().randrange(_SEED_LIMIT)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_LIMIT:
            raise ValueError(f"seed must be a whole number from 0 to {_SEED_LIMIT - 1}, got {seed!r}")
        super().reset(seed=seed)
        # diambra-arena reseeds its draws only when the seed differs from the last reset's, and
        # its character draw shuffles the list of selectable characters in place: without these
        # two lines a seed would not replay the same role and characters.
        self._env.env_settings._last_seed = None
        self._env.env_settings.valid_characters = list(self._selectable)
        with self._random.active():
            observation, info = self._env.reset(seed=seed)
        self.seed_used = seed
        self.drawn = self._drawn_settings()
        self.invalid_actions = 0
        return self.observation(observation), {**self._info(info, invalid=False), "settings": self.episode_settings()}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        clean, invalid = self.sanitize(action)
        self.invalid_actions += invalid
        return self.play(clean, invalid)

    def play(self, clean: Any, invalid: int = 0) -> tuple[Any, float, bool, bool, dict]:
        """``step`` for an action ``sanitize`` made (the evaluator's episode checks and counts
        the agent's actions itself); ``invalid``: the agent's action was replaced by it."""
        with self._random.active(numpy=False):
            observation, reward, terminated, truncated, info = self._env.step(clean)
        return (
            self.observation(observation),
            float(reward),
            bool(terminated),
            bool(truncated),
            self._info(info, invalid=bool(invalid)),
        )

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            with self._random.active():
                env.close()
        super().close()

    # -- what an evaluation reads -----------------------------------------------------------------

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """(the action the engine gets, 1 if the agent's was replaced by the no-op else 0)."""
        clean = action_for(self.action_space, action)
        if clean is None:
            return self.no_op_action(), 1
        if isinstance(clean, int):
            return clean, 0
        return clean.tolist(), 0  # the engine's protobuf fields take Python ints

    def no_op_action(self) -> Any:
        return self._env.get_no_op_action()

    def reward_bounds(self) -> Bounds:
        """The lowest and highest cumulative reward of an episode, as the env reports them (the
        documented formula when it reports none)."""
        return choose_bounds(self.settings.game, self._env.get_cumulative_reward_bounds())

    def describe(self) -> dict[str, Any]:
        """What an evaluation records about the env it ran on."""
        bounds = self.reward_bounds()
        frame = self.observation_space["frame"].shape
        return {
            "engine": self.engine,
            "engine_address": self.engine_address,
            "game": self.settings.game,
            "difficulty": self.settings.difficulty,
            "level": self.level,
            "frame_shape": list(frame),
            "action_space": str(self.action_space),
            "bounds": [bounds.low, bounds.high],
            "bounds_source": bounds.source,
        }

    def observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        return _fit(self.observation_space, raw)

    def episode_settings(self) -> dict[str, Any]:
        """The episode's settings as diambra-arena's env gives them in a reset's
        ``info["settings"]`` (its protobuf, as plain data by field name, enums by name), without
        the seed: the role the agent plays, its characters and outfits, the level."""
        from google.protobuf.json_format import MessageToDict

        settings = MessageToDict(self._env.env_settings.pb_model, preserving_proto_field_name=True)
        settings.get("episode_settings", {}).pop("random_seed", None)
        return settings

    def arena_description(self) -> dict[str, Any]:
        """What diambra-arena's env knows about itself before any episode, as plain data for the
        agent's side (``arbiter.client.diambra``), which rebuilds from it the attributes DIAMBRA's
        wrappers read: ``env_info`` (the engine's answer at connection: actions, RAM states,
        characters, reward bounds; its protobuf by field name) and ``env_settings`` (the fields of
        diambra-arena's ``EnvironmentSettings`` that say what is played, enums by name; no seed,
        no engine address)."""
        from diambra.arena import Roles, SpaceTypes
        from google.protobuf.json_format import MessageToDict

        arena = self._env.env_settings
        fields: dict[str, Any] = {key: _plain(getattr(arena, key)) for key in ARENA_SETTINGS}
        fields["action_space"] = SpaceTypes.Name(arena.action_space)
        fields["role"] = None if arena.role is None else Roles.Name(arena.role)
        env_info = MessageToDict(self._env.env_info, preserving_proto_field_name=True)
        return {"env_info": env_info, "env_settings": fields}

    # -- helpers ---------------------------------------------------------------------------------

    def _info(self, raw: dict[str, Any], *, invalid: bool) -> dict[str, Any]:
        info: dict[str, Any] = {key: bool(raw.get(key, False)) for key in GAME_STATES}
        info["invalid_action"] = invalid
        return info

    def _drawn_settings(self) -> dict[str, Any]:
        from diambra.arena import Roles

        episode = self._env.env_settings.pb_model.episode_settings
        player = episode.player_settings[0]
        drawn: dict[str, Any] = {
            "level": int(episode.difficulty),
            "role": Roles.Name(player.role),
            "characters": list(player.characters),
            "outfits": int(player.outfits),
        }
        for key, _ in self.settings.game_facts.specific:
            if key == "tower":
                drawn[key] = int(episode.tower)
            elif key == "ultimate_style":
                style = player.ultimate_style
                drawn[key] = [int(style.dash), int(style.evade), int(style.bar)]
            else:
                drawn[key] = int(getattr(player, key))
        return drawn


def _plain(value: Any) -> Any:
    """A settings value as plain data: tuples as lists (nested too), numbers and strings as they are."""
    if isinstance(value, (list, tuple)):
        return [_plain(member) for member in value]
    return value


def _fit(space: Any, value: Any) -> Any:
    """``value`` as a member of ``space``: Box entries in the space's dtype and shape, Discrete
    entries as ints, Dicts member by member."""
    kind = type(space).__name__
    if kind == "Dict":
        return {key: _fit(sub, value[key]) for key, sub in space.spaces.items()}
    if kind == "Discrete":
        return int(value)
    array = np.asarray(value)
    if array.dtype != space.dtype:
        array = array.astype(space.dtype)
    return array.reshape(space.shape)


def arena_settings(settings: DiambraSettings, engine_address: str | None) -> Any:
    """diambra-arena's ``EnvironmentSettings`` for arbiter's settings (checked again by the env)."""
    from diambra.arena import EnvironmentSettings, Roles, SpaceTypes

    env = EnvironmentSettings()
    env.game_id = settings.game
    env.frame_shape = tuple(settings.frame_shape or (0, 0, 0))
    env.step_ratio = settings.step_ratio
    env.splash_screen = False
    env.env_address = engine_address or ENGINE_MOCK
    env.grpc_timeout = settings.engine_timeout_s
    env.seed = 0  # only the engine's initialisation draws before the first reset brings its seed
    env.difficulty = settings.level
    env.continue_game = float(settings.continue_game)
    env.show_final = settings.show_final
    env.role = None if settings.role is None else Roles.Value(settings.role)
    env.characters = None if settings.characters is None else tuple(settings.characters)
    env.outfits = settings.outfits
    env.action_space = SpaceTypes.DISCRETE if settings.action_space == "discrete" else SpaceTypes.MULTI_DISCRETE
    env.super_art = settings.super_art
    env.fighting_style = settings.fighting_style
    env.ultimate_style = None if settings.ultimate_style is None else tuple(settings.ultimate_style)
    env.speed_mode = settings.speed_mode
    env.tower = settings.tower
    return env
