"""The DIAMBRA plan: N episodes of one game at one difficulty, on one env the plan owns.

The env is diambra-arena's real gymnasium env (``env.DiambraEnv``). It runs on the DIAMBRA engine
at the address in ``DIAMBRA_ENVS`` when that variable is set (as ``diambra run`` sets it), else on
diambra-arena's engine mock; every output of a mocked evaluation says ``engine: mock`` (the
handshake, each episode's create payload and record, the plan's source, the score).

Seeds: episode i is reset with ``env.episode_seed(seed, i)`` (``base.reset_seed`` brought into
the engine's int32 range), the same seeds an in-process evaluation (``local``) uses; without a
competition seed the env draws one per episode. While an episode runs its seed is the server's
(it fixes the role, the characters and the engine's draws: an agent that knew it could rehearse
the episode): the step reply that ends the episode names it, and every record holds it.

Invalid actions: an action that is not an element of the action space is replaced by the no-op
action (no move, no attack) and counted, and the episode goes on: a fighting game's clock runs
whatever the controller does, so refusing the step would only stall the agent.

Endings: a finished episode scores its cumulative reward R; a timed-out one, one the agent left
(an ENV_CREATE mid-episode) and one the evaluation ended before its end score R = R_min, the
lowest reward the episode could have had (``scoring.episode_record``); the reward collected is
kept as ``partial_reward``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from arbiter.protocol.errors import OutOfOrder
from arbiter.server.core.summary import FINISHED, timeout_of
from arbiter.server.formats.base import Column, Item, plain, step_reply
from arbiter.server.formats.diambra.engine import ENGINE_MOCK, MOCK_NOTE, engine_address_from_environ
from arbiter.server.formats.diambra.env import DiambraEnv, episode_seed
from arbiter.server.formats.diambra.scoring import Bounds, episode_record
from arbiter.server.formats.diambra.settings import DiambraSettings
from arbiter.server.formats.gym_episode import GymEpisode, GymPlan

TRACE_POINTS = 512  # a record keeps at most about this many points of its reward-over-time trace

COLUMNS = (
    Column("game", label=""),
    Column("difficulty", "<10", label=""),
    Column("episode", progress=True, table=False),
    Column("level", progress=False, table=False),
    Column("seed", ">10"),
    Column("engine", progress=False),
    Column("steps", ">6"),
    Column("reward", ">8g", label="R", title="R"),
    Column("partial_reward", progress=False, table=False),
    Column("k", ">7.4f"),
    Column("score", ">9.1f"),
    Column("bounds_source", progress=False, table=False),
    Column("ended", progress=False, table=False),
    Column("invalid_actions", progress=False, table=False),
)


def engine_label(engine: str) -> str:
    """What every output says about the engine: loud when it is the mock."""
    return "engine: mock" if engine == ENGINE_MOCK else "engine: DIAMBRA engine"


class RewardTrace:
    """An episode's cumulative reward over its steps, kept compact: a point at a step that
    changed it (a fighting game's reward moves only on hits), at most one per ``stride`` steps.
    When the points reach twice ``TRACE_POINTS``, every other one is dropped and the stride
    doubles, so an hour-long episode keeps a few hundred points spread evenly over its steps."""

    def __init__(self) -> None:
        self.points: list[list[float]] = [[0, 0.0]]
        self.stride = 1
        self.round_ends: list[int] = []

    def add(self, step: int, total: float, reward: float, round_done: bool) -> None:
        if round_done and len(self.round_ends) < TRACE_POINTS:
            self.round_ends.append(step)
        if reward == 0.0 or step - self.points[-1][0] < self.stride:
            return
        self.points.append([step, total])
        if len(self.points) >= 2 * TRACE_POINTS:
            self.points = self.points[::2]
            self.stride *= 2

    def as_record(self, steps: int, total: float) -> dict[str, Any]:
        """The trace, ending exactly at the episode's last step and total."""
        points = self.points if self.points[-1][0] == steps else [*self.points, [steps, total]]
        return {"reward_trace": points, "round_ends": self.round_ends}


class DiambraEpisode(GymEpisode):
    """One episode being played: the plan's env, reset with the episode's seed when opened."""

    def __init__(self, env: DiambraEnv, item: Item, seed: int | None, bounds: Bounds, last: bool):
        self.bounds = bounds
        self.last = last  # the evaluation's last episode: its end is the agent's env_done
        self.invalid = 0
        self.trace = RewardTrace()
        super().__init__(env, item, seed)

    def reset_env(self, seed: int | None) -> tuple[Any, Any]:
        observation, info = self.env.reset(seed=seed)
        self.seed = self.env.seed_used  # drawn by the env when the competition has no seed
        return observation, info

    def place(self) -> dict[str, Any]:
        settings = self.env.settings
        return {
            **self.item.fields,
            "engine": self.env.engine,
            "game": settings.game,
            "difficulty": settings.difficulty,
            "level": settings.level,
        }

    def create_payload(self) -> dict[str, Any]:
        return {**super().create_payload(), "info": {**plain(self.info), "env_done": False}}

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """The no-op in place of an action outside the action space (counted), never a refusal:
        the game's clock runs whatever the controller does, so refusing would only stall the agent."""
        clean, invalid = self.env.sanitize(action)
        self.invalid += invalid
        return clean, invalid

    def step_env(self, action: Any) -> Any:
        return self.env.play(action)  # sanitize() checked it: the env need not again

    def step(self, action: Any) -> bool:
        if self.over:
            raise OutOfOrder("the episode is over: ENV_CREATE starts the next one")
        over = super().step(action)
        assert self.last_step is not None
        self.trace.add(self.steps, self.total_return, self.last_step[1], self.last_step[4].get("round_done", False))
        return over

    def step_reply(self, invalid: int) -> dict[str, Any]:
        if self.last_step is None:
            raise RuntimeError("DiambraEpisode.step_reply before any step")
        info = {**self.last_step[4], "invalid_action": bool(invalid), "env_done": self.over and self.last}
        place = {"episode": self.item.fields["episode"], "engine": self.env.engine}
        if self.over:
            place["seed"] = self.seed  # the episode has ended: its seed is no secret any more
        return step_reply(self.last_step, done=self.over, step=self.steps, invalid=invalid, info=info,
                          stage_over=self.over, **place)  # fmt: skip

    def record(self, ended: str) -> dict[str, Any]:
        finished = ended == FINISHED
        timeout = timeout_of(ended)
        record = episode_record(
            self.env.settings,
            reward=self.total_return,
            bounds=self.bounds,
            seed=self.seed,
            engine=self.env.engine,
            steps=self.steps,
            invalid_actions=self.invalid,
            timeout=timeout,
            # An episode the evaluation ended (overall budget, shutdown) is scored as one the
            # agent left: R_min, never its partial reward.
            abandoned=not finished and timeout is None,
            episode=self.item.fields["episode"],
        )
        return {**record, "drawn": self.env.drawn, **self.trace.as_record(self.steps, self.total_return)}


class DiambraPlan(GymPlan):
    prepare_ahead = False  # one env, reset in open(): nothing to build ahead
    packages = ("diambra-arena", "gymnasium")  # versions recorded in the summary
    columns = COLUMNS

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None, environ: Mapping[str, str] | None = None):
        self.settings: DiambraSettings = spec.options
        self.address = engine_address_from_environ(os.environ if environ is None else environ)
        super().__init__(spec, rule, tests=tests)
        self.bounds = self.env.reward_bounds()
        self.engine = self.env.engine
        settings, address = self.settings, self.address
        game = settings.game_facts
        self.source = (
            f"diambra-arena {settings.game} ({game.name}), {settings.difficulty} = level {settings.level}, "
            f"{engine_label(self.engine)}" + (f" ({MOCK_NOTE})" if self.engine == ENGINE_MOCK else f" at {address}")
        )

    def make_env(self) -> DiambraEnv:
        return DiambraEnv(self.settings, engine_address=self.address)

    def make_items(self) -> list[Item]:
        episodes = self.settings.episodes
        if self.spec.max_episodes is not None:
            episodes = min(episodes, self.spec.max_episodes)
        return [Item(index=i, unit=f"episode/{i}", fields={"episode": i}) for i in range(episodes)]

    def open(self, item: Item) -> DiambraEpisode:
        seed = episode_seed(self.seed, item.index)
        return DiambraEpisode(self.env, item, seed, self.bounds, last=item.index == len(self.items) - 1)

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        record = episode_record(
            self.settings,
            reward=0.0,
            bounds=self.bounds,
            seed=episode_seed(self.seed, item.index),
            engine=self.engine,
            steps=0,
            played=False,
            episode=item.index,
        )
        return [{**record, "reward_trace": [], "round_ends": []}]

    def handshake(self) -> dict[str, Any]:
        """The spaces, and what the agent plays: game, difficulty and level, the settings, the
        episodes, the reward bounds, the engine, and diambra-arena's own description of its env."""
        described = self.env.describe()
        return {
            **super().handshake(),
            "engine": self.engine,
            "engine_note": MOCK_NOTE if self.engine == ENGINE_MOCK else "a DIAMBRA engine runs the game",
            "game": self.settings.game,
            "difficulty": self.settings.difficulty,
            "level": self.settings.level,
            "episodes": len(self.items),
            "frame_shape": described["frame_shape"],
            "bounds": [self.bounds.low, self.bounds.high],
            "bounds_source": self.bounds.source,
            "settings": self.settings.as_record(),
            # diambra-arena's env_info and env_settings, as plain data: arbiter.client.diambra's
            # env has the attributes DIAMBRA's wrappers read from them
            "diambra": self.env.arena_description(),
        }

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {"engine": self.engine}
