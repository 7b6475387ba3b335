"""What both sides agree on about a Flatland episode: how its env is built and rewarded.

The evaluator builds its env from the test file's env dict; arbiter's client builds its local
copy from the same env dict received over the wire. Both go through ``build_rail_env``, which
mirrors ``RailEnvPersister.load_new`` step for step, so both envs (and a legacy client's,
loaded from the file) evolve identically under the same seed and actions.
"""

from __future__ import annotations

from typing import Any

from arbiter.protocol.legacy.envstate import Rebuilder, to_plain

# Flatland's env dicts only hold flatland classes and a few standard ones.
_ENV_STATE_PACKAGES = ("flatland", "fractions")


class Rewards2020:
    """NeurIPS 2020 reward model: −1 per step for every agent not DONE after that step.

    An agent arriving at step k collects −(k−1); nothing is added at the end of the episode.
    Implements flatland 4.x's ``Rewards`` interface (duck-typed to keep flatland imports lazy).
    """

    name = "neurips2020"

    def __init__(self) -> None:
        from flatland.envs.step_utils.states import TrainState

        self._done = TrainState.DONE  # bound once: step_reward runs for every agent at every step

    def step_reward(self, agent: Any, agent_transition_data: Any, distance_map: Any, elapsed_steps: int) -> float:
        return 0.0 if agent.state == self._done else -1.0

    def end_of_episode_reward(self, agent: Any, distance_map: Any, elapsed_steps: int) -> float:
        return 0.0

    def cumulate(self, *rewards: float) -> float:
        return float(sum(rewards))

    def empty(self) -> float:
        return 0.0

    def normalize(self, *rewards: float, num_agents: int, max_episode_steps: int) -> float:
        return float(sum(rewards)) / (num_agents * max_episode_steps)


def rewards_for(model: str) -> Any:
    """The reward object for a named reward model (``None`` = the env's own default)."""
    if model == "neurips2020":
        return Rewards2020()
    if model == "flatland":
        return None
    raise ValueError(f"unknown reward model {model!r}")


def env_state_to_wire(env_dict: dict) -> Any:
    return to_plain(env_dict)


# Rebuilds env states: it keeps the classes it has looked up, for every episode of a process.
_REBUILDER = Rebuilder(_ENV_STATE_PACKAGES)


# ``codec.decode``'s ``maps`` for a reply that carries an env state: the state comes out of the
# decoding rebuilt (``Rebuilder.map_from_wire``), for ``env_state_from_wire(..., rebuilt=True)``
# to check. The bound method itself: it is called once per map of the reply.
env_state_maps = _REBUILDER.map_from_wire


def env_state_from_wire(data: Any, *, rebuilt: bool = False) -> dict:
    """The env dict in ``data``, the env state as a reply carries it: decoded plain data, or, with
    ``rebuilt``, what decoding with ``env_state_maps`` made of it."""
    env_dict = data if rebuilt else _REBUILDER.rebuild(data)
    if not isinstance(env_dict, dict) or "grid" not in env_dict:
        from arbiter.protocol.errors import DecodeError

        raise DecodeError("env state is not a Flatland env dict")
    return env_dict


def preload() -> None:
    """Import what ``build_rail_env`` needs (about a second, once): a client calls this before
    its first episode, so the imports do not eat into that episode's planning budget."""
    from flatland.envs import persistence, rail_env  # noqa: F401


def release_flatland_caches() -> None:
    """Let finished episodes' envs go.

    flatland-rl 4.3 memoises methods of ``RailEnv`` and of the transition maps with class-level
    ``lru_cache``s whose keys hold ``self``: every env ever built (mostly its malfunction
    generator's random buffer) and every rail grid stay referenced, so a process that plays
    episode after episode grows without bound. The caches only memoise results (the grid ones
    are keyed on a uuid that changes with the grid), so clearing them changes no trajectory.
    Clearing frees what they held, which takes a while after a long episode: the evaluator does
    it as it opens the next episode, ahead of time (see ``FlatlandEpisode.close``).
    """
    from flatland.core.transition_map import GridTransitionMap
    from flatland.envs.rail_env import AbstractRailEnv
    from flatland.envs.rail_grid_transition_map import RailGridTransitionMap

    for cls in (AbstractRailEnv, GridTransitionMap, RailGridTransitionMap):
        for attribute in vars(cls).values():
            clear = getattr(attribute, "cache_clear", None)
            if clear is not None:
                clear()


_STEP_RECORDER = "flatland.envs.record_steps_effects_generator.RecordStepsEffectsGenerator"


def _drop_step_recorder(env_dict: dict) -> None:
    """Leave flatland's step recorder out of the effects an env dict restores.

    ``set_full_state`` rebuilds the env's effects (malfunctions, step recording) from the dict,
    whatever ``RailEnv(record_steps=...)`` said: a saved env brings its recorder back, listed
    beside the malfunction effects, or (older files) as a top-level ``actions`` key.
    """
    env_dict.pop("actions", None)
    effects = env_dict.get("effects_generator")
    specs = effects.get("specs") if isinstance(effects, dict) else None
    if isinstance(specs, dict) and isinstance(specs.get("args"), list):
        specs["args"] = [
            spec for spec in specs["args"] if not (isinstance(spec, dict) and spec.get("cls") == _STEP_RECORDER)
        ]


def build_rail_env(env_dict: dict, obs_builder: Any = None, rewards: Any = None, record_steps: bool = True) -> Any:
    """A RailEnv from an env dict, stepping exactly as one from ``RailEnvPersister.load_new``.

    ``env_dict`` is consumed (flatland rewrites its agents in place): pass a fresh one.
    ``record_steps`` keeps flatland's per-step log (``env.cur_episode``) as ``load_new`` does;
    it only records, so an env without it steps identically, about 5 % faster.

    One deliberate difference: ``set_full_state`` computes the distance map (most of the build
    time of a large env), and the ``reset`` that follows every build marks it stale, so the
    first ``DistanceMap.get()`` computes it again. Here it is computed only by that ``get()``
    (every reader in flatland goes through it: observations, predictors, shortest paths,
    rewards). Until then ``env.distance_map.distance_map`` holds what the file saved, if
    anything, where ``load_new`` would hold the stale copy.
    """
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.envs import (
        line_generators,
        malfunction_generators,
        rail_env,
        rail_generators,
        timetable_generators,
    )
    from flatland.envs.persistence import RailEnvPersister

    if not record_steps:
        _drop_step_recorder(env_dict)
    grid = env_dict["grid"]
    env = rail_env.RailEnv(
        width=len(grid[0]),
        height=len(grid),
        rail_generator=rail_generators.rail_from_file(env_dict=env_dict),
        line_generator=line_generators.line_from_file(env_dict=env_dict),
        timetable_generator=timetable_generators.timetable_from_file(env_dict=env_dict),
        malfunction_generator=malfunction_generators.FileMalfunctionGen(env_dict=env_dict),
        obs_builder_object=obs_builder if obs_builder is not None else DummyObservationBuilder(),
        record_steps=record_steps,
        rewards=rewards,
    )
    distance_map = env.distance_map
    distance_map._compute = lambda agents, rail: None  # shadows the method, for this call only
    try:
        RailEnvPersister.set_full_state(env, env_dict)
    finally:
        del distance_map._compute
    # What the skipped computation would have recorded: with it, get() after a reset computes
    # afresh (as after load_new) rather than trusting a map the file may have saved.
    distance_map.agents_previous_computation = distance_map.agents
    env.obs_builder.reset(env)
    return env
