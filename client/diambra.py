"""``arbiter.client.diambra``: diambra-arena's ``make`` for a DIAMBRA evaluation's env.

A DIAMBRA agent script makes its env with ``diambra.arena.make(game_id, settings,
wrappers_settings, ...)``; under arbiter it imports ``make`` from here instead and changes nothing
else. The env is a ``RemoteEnv`` (``DiambraRemoteEnv``) that also carries what diambra-arena's
own env carries and its wrappers read: ``env_info`` (the engine's description: actions, RAM
states, characters, reward bounds), ``env_settings`` (diambra-arena's ``EnvironmentSettings``),
``max_delta_health``, ``reward_normalization_value``, ``logger``, and its methods
``get_no_op_action``, ``get_actions_tuples``, ``print_actions``, ``show_obs`` and
``get_cumulative_reward_bounds``. They are rebuilt from plain data the evaluator sends at the
handshake (``server_info["diambra"]``). Each reset's ``info["settings"]`` is diambra-arena's
protobuf again (``model.EnvSettings``, without the seed), as RoleRelativeObservation reads it.
``wrappers_settings`` are applied here, on the agent's side, by diambra-arena's own
``env_wrapping``: what the evaluator steps and scores is the env unwrapped.

The game and the settings are the organiser's. A ``game_id`` other than the evaluation's, or
settings that change what the agent sees or sends (``frame_shape``, ``step_ratio``,
``action_space``, ``n_players``), are a ``ConfigError``; an episode setting the evaluator decides
(difficulty, role, characters ...) that the script sets otherwise is a warning, and not applied.

diambra-arena is the ``diambra`` extra: it is imported when ``make`` or ``DiambraRemoteEnv`` is
used, never when this module is, and its absence is an ``ImportError`` that says how to install it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import warnings
from typing import Any

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ArbiterError, ConfigError

MISSING = (
    "arbiter.client.diambra needs diambra-arena, the 'diambra' extra of arbiter: "
    "pip install 'arbiter[diambra]' (or pip install diambra-arena==2.2.7)"
)
# Settings that change the observations or the actions: the agent's must be the evaluator's.
SEEN = ("n_players", "frame_shape", "step_ratio", "action_space")
# Episode settings: the evaluator's (or drawn at each reset); the agent's are not applied.
DECIDED = ("seed", "difficulty", "continue_game", "show_final", "tower", "role", "characters", "outfits",
           "super_art", "fighting_style", "ultimate_style", "speed_mode")  # fmt: skip


def _arena() -> Any:
    """diambra-arena's package, or an ImportError that says how to install it."""
    try:
        import diambra.arena
        from google.protobuf import json_format  # noqa: F401  (diambra-arena's dependency)
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return diambra.arena


class DiambraRemoteEnv(RemoteEnv):
    """A ``RemoteEnv`` on a DIAMBRA evaluation with the attributes and methods of diambra-arena's
    single-player env (``DiambraGym1P``), so that diambra-arena's wrappers and an agent written
    for its env work on it. Its ``step`` is ``RemoteEnv``'s own."""

    reward_normalization_value = 1.0  # NormalizeReward sets it, get_cumulative_reward_bounds divides by it

    def __init__(self, redis_url: str | None = None, service_id: str | None = None, *,
                 render_mode: str | None = None, **remote_options: Any):  # fmt: skip
        arena = _arena()
        from diambra.engine import model
        from google.protobuf.json_format import ParseDict

        remote_options.setdefault("client_name", "arbiter.client.diambra")
        super().__init__(redis_url, service_id, formats=["diambra"], **remote_options)
        described = self.server_info.get("diambra")
        if not isinstance(described, dict):
            self.close()
            raise ArbiterError(
                "the evaluator described no diambra-arena env at the handshake (an older arbiter?): "
                "arbiter.client.RemoteEnv plays its env, without diambra-arena's attributes and wrappers"
            )
        self.logger = logging.getLogger(__name__)
        self.render_mode = render_mode
        self.env_info = ParseDict(described["env_info"], model.EnvInitResponse(), ignore_unknown_fields=True)
        self.env_settings = _environment_settings(arena, described["env_settings"], self.env_info, render_mode)
        actions = self.env_info.available_actions
        self.n_actions = [actions.n_moves, actions.n_attacks]
        self.actions_tuples = (tuple(m.key for m in actions.moves), tuple(a.key for a in actions.attacks))
        self.print_actions_dict = [dict(enumerate(m.label for m in actions.moves)),
                                   dict(enumerate(a.label for a in actions.attacks))]  # fmt: skip
        self.max_delta_health = _max_delta_health(model, self.env_info)
        self._raw_observation_space = copy.deepcopy(self.observation_space)  # wrappers edit the env's own
        self._first_observation: Any = None  # the running (or last) episode's, as the evaluator sent it

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """``RemoteEnv.reset``, with ``info["settings"]`` as diambra-arena's env gives it: its
        ``EnvSettings`` protobuf (without the seed), also ``env_settings.pb_model``.

        The reset that says ``env_done`` returns the last episode's first observation (and its
        settings): the last observation was the wrappers' to change, and they transform what a
        reset returns once more."""
        from diambra.engine import model
        from google.protobuf.json_format import ParseDict

        observation, info = super().reset(seed=seed, options=options)
        if info.get("env_done"):
            if self._first_observation is None:  # this env started no episode
                self._raw_observation_space.seed(0)
                self._first_observation = self._raw_observation_space.sample()
            observation = copy.deepcopy(self._first_observation)
            if self.env_settings.pb_model is not None:
                info["settings"] = self.env_settings.pb_model
            return observation, info
        settings = info.get("settings")
        if isinstance(settings, dict):
            parsed = ParseDict(settings, model.EnvSettings(), ignore_unknown_fields=True)
            info["settings"] = self.env_settings.pb_model = parsed
        self._first_observation = copy.deepcopy(observation)
        return observation, info

    # -- diambra-arena's env methods (its own code, run on this env's attributes) ---------------

    def get_no_op_action(self) -> Any:
        """No move, no attack: ``[0, 0]``, or ``0`` for a Discrete action space."""
        from diambra.arena.arena_gym import DiambraGym1P

        return DiambraGym1P.get_no_op_action(self)

    def get_actions_tuples(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The keys of the moves and of the attacks, by action index."""
        return self.actions_tuples

    def print_actions(self) -> None:
        from diambra.arena.arena_gym import DiambraGymBase

        DiambraGymBase.print_actions(self)

    def get_cumulative_reward_bounds(self) -> list[float]:
        """The env's own bounds of an episode's total reward (the engine's, divided by the
        reward normalization a NormalizeReward wrapper set)."""
        from diambra.arena.arena_gym import DiambraGymBase

        return DiambraGymBase.get_cumulative_reward_bounds(self)

    def show_obs(self, observation: Any, wait_key: int = 1, viz: bool = True, **kwargs: Any) -> None:
        """Print an observation's entries (characters by name), and show its frame in a window
        when there is a display."""
        from diambra.arena.arena_gym import DiambraGymBase

        DiambraGymBase.show_obs(self, observation, wait_key=wait_key, viz=viz, **kwargs)


def make(
    game_id: str | None,
    env_settings: Any = None,
    wrappers_settings: Any = None,
    episode_recording_settings: Any = None,
    render_mode: str | None = None,
    rank: int = 0,
    env_addresses: Any = None,
    log_level: int = logging.INFO,
    *,
    redis_url: str | None = None,
    service_id: str | None = None,
    **remote_options: Any,
) -> Any:
    """``diambra.arena.make``'s signature and result, for the evaluation's env.

    ``game_id`` must be the evaluation's (None: whichever it is). ``env_settings`` (an
    ``EnvironmentSettings``, or a dict of its fields) is checked against the evaluator's (see the
    module's docstring); ``rank`` and ``env_addresses`` are the evaluator's business and ignored.
    ``wrappers_settings`` (a ``WrappersSettings`` or a dict) and ``episode_recording_settings``
    wrap the env here with diambra-arena's own wrappers. ``redis_url``, ``service_id`` and the
    other keywords go to ``RemoteEnv``."""
    arena = _arena()
    logging.basicConfig(level=log_level)  # as diambra.arena.make: its wrappers log their warnings
    env = DiambraRemoteEnv(redis_url, service_id, render_mode=render_mode, **remote_options)
    try:
        _check_game(env, game_id)
        if env_settings is not None:
            _check_settings(arena, env.env_settings, env_settings)
        wrapped: Any = env
        recording = _settings_object(arena, arena.RecordingSettings, episode_recording_settings)
        if recording.dataset_path is not None:
            from diambra.arena.wrappers.episode_recording import EpisodeRecorder

            recording.sanity_check()
            wrapped = EpisodeRecorder(wrapped, recording)
        wrappers = _settings_object(arena, arena.WrappersSettings, wrappers_settings)
        wrappers.sanity_check()
        from diambra.arena.wrappers.arena_wrappers import env_wrapping

        return env_wrapping(wrapped, wrappers)
    except BaseException:
        env.close()
        raise


# -- helpers ---------------------------------------------------------------------------------------


def _settings_object(arena: Any, kind: type, given: Any) -> Any:
    if given is None:
        return kind()
    if isinstance(given, dict):
        return arena.load_settings_flat_dict(kind, given)
    return given


def _environment_settings(arena: Any, fields: dict[str, Any], env_info: Any, render_mode: str | None) -> Any:
    """diambra-arena's ``EnvironmentSettings`` as the evaluator's env has them."""
    settings = arena.EnvironmentSettings()
    for key, value in fields.items():
        if key == "action_space":
            value = arena.SpaceTypes.Value(value)
        elif key == "role" and value is not None:
            value = arena.Roles.Value(value)
        elif isinstance(value, list):
            value = tuple(value)
        setattr(settings, key, value)
    settings.render_mode = render_mode
    settings.splash_screen = False
    settings.finalize_init(env_info)  # env_info, the games' table and the selectable characters
    return settings


def _max_delta_health(model: Any, env_info: Any) -> int:
    """A character's health range (max − min), from P1's health RAM state, as diambra-arena's
    env computes it for NormalizeReward."""
    states = env_info.ram_states_categories[model.RamStatesCategories.P1].ram_states
    for key in sorted(states):
        if "health" in model.RamStates.Name(key):
            return states[key].max - states[key].min
    raise ConfigError("the evaluator's env describes no health RAM state for P1")


def _check_game(env: DiambraRemoteEnv, game_id: str | None) -> None:
    played = env.env_settings.game_id
    if game_id is not None and game_id != played:
        raise ConfigError(
            f"make({game_id!r}): this evaluation plays {played!r}, the organiser's game; "
            f"make({played!r}) (or make(None)) plays it"
        )


def _normal(key: str, value: Any) -> Any:
    """A setting's value in one form for comparing: a name as a one-name tuple, a sequence as a
    tuple without trailing Nones (None when nothing is left)."""
    if key == "characters" and isinstance(value, str):
        value = (value,)
    if isinstance(value, (list, tuple)):
        members = [tuple(v) if isinstance(v, list) else v for v in value]
        while members and members[-1] is None:
            members.pop()
        return tuple(members) or None
    return value


def _check_settings(arena: Any, evaluators: Any, given: Any) -> None:
    """The agent's settings against the evaluator's: a ConfigError for one that changes what
    the agent sees or sends, a warning for an episode setting the evaluator decides."""
    if isinstance(given, dict):
        given = dict(given)
        kind = arena.EnvironmentSettingsMultiAgent if given.get("n_players") == 2 else arena.EnvironmentSettings
        given.pop("n_players", None)
        given = arena.load_settings_flat_dict(kind, given)
    names = {f.name: f.default for f in dataclasses.fields(given)}
    for key in SEEN:
        mine, theirs = getattr(given, key), getattr(evaluators, key)
        if _normal(key, mine) != _normal(key, theirs):
            raise ConfigError(
                f"settings.{key} = {_shown(arena, key, mine)}: this evaluation's env has {key} = "
                f"{_shown(arena, key, theirs)}, the organiser's; set it so (or pass no settings)"
            )
    for key in DECIDED:
        mine, theirs = getattr(given, key), getattr(evaluators, key)
        if _normal(key, mine) in (_normal(key, names.get(key)), _normal(key, theirs)):
            continue
        decided = "drawn by the evaluator at each reset" if theirs is None else f"{_shown(arena, key, theirs)}"
        warnings.warn(
            f"settings.{key} = {_shown(arena, key, mine)} is not applied: the evaluation's {key} is {decided}",
            UserWarning,
            stacklevel=3,
        )


def _shown(arena: Any, key: str, value: Any) -> str:
    if key == "action_space" and isinstance(value, int):
        return f"SpaceTypes.{arena.SpaceTypes.Name(value)}"
    if key == "role" and isinstance(value, int):
        return f"Roles.{arena.Roles.Name(value)}"
    return repr(value)
