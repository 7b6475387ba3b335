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
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import space_to_wire
from arbiter.server.formats.base import Item, plain, step_reply
from arbiter.server.formats.diambra.engine import ENGINE_MOCK, MOCK_NOTE, engine_address_from_environ
from arbiter.server.formats.diambra.env import DiambraEnv, episode_seed
from arbiter.server.formats.diambra.scoring import Bounds, episode_record
from arbiter.server.formats.diambra.settings import DiambraSettings

TRACE_POINTS = 512  # a record keeps at most about this many points of its reward-over-time trace

CSV_COLUMNS = [
    "episode",
    "game",
    "difficulty",
    "level",
    "seed",
    "steps",
    "reward",
    "partial_reward",
    "k",
    "score",
    "bounds_source",
    "ended_by",
    "invalid_actions",
    "engine",
]


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


class DiambraEpisode:
    """One episode being played: the plan's env, reset with the episode's seed when opened."""

    spans_resets = False
    stage_budget_s = None

    def __init__(self, env: DiambraEnv, item: Item, seed: int | None, bounds: Bounds, last: bool):
        self.env = env
        self.item = item
        self.bounds = bounds
        self.last = last  # the evaluation's last episode: its end is the agent's env_done
        self.observation, self.info = env.reset(seed=seed)
        self.seed = env.seed_used
        self.steps = 0
        self.total = 0.0
        self.invalid = 0
        self.over = False
        self.trace = RewardTrace()
        self._last: tuple[Any, float, bool, bool, dict[str, Any]] | None = None

    def _place(self) -> dict[str, Any]:
        settings = self.env.settings
        return {
            **self.item.fields,
            "engine": self.env.engine,
            "game": settings.game,
            "difficulty": settings.difficulty,
            "level": settings.level,
        }

    def create_payload(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "info": {**plain(self.info), "env_done": False},
            EXTENSION_KEY: self._place(),
        }

    def next_reset(self) -> dict[str, Any]:  # pragma: no cover - an episode never spans resets
        raise NotImplementedError

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """The no-op in place of an action outside the action space (counted); never raises."""
        clean, invalid = self.env.sanitize(action)
        self.invalid += invalid
        return clean, invalid

    def step(self, action: Any) -> bool:
        if self.over:
            raise OutOfOrder("the episode is over: ENV_CREATE starts the next one")
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.total += reward
        self.trace.add(self.steps, self.total, reward, info.get("round_done", False))
        self.over = terminated or truncated
        self._last = (observation, reward, terminated, truncated, info)
        return self.over

    def step_reply(self, invalid: int) -> dict[str, Any]:
        assert self._last is not None
        info = {**self._last[4], "invalid_action": bool(invalid), "env_done": self.over and self.last}
        place = {"episode": self.item.fields["episode"], "engine": self.env.engine}
        if self.over:
            place["seed"] = self.seed  # the episode has ended: its seed is no secret any more
        return step_reply(self._last, done=self.over, step=self.steps, invalid=invalid, info=info,
                          stage_over=self.over, **place)  # fmt: skip

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        if finished:
            ended_by = "finished"
        else:
            ended_by = f"{timeout}_timeout" if timeout else "agent" if abandoned else "evaluation"
        record = episode_record(
            self.env.settings,
            reward=self.total,
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
        return [
            {
                **record,
                "abandoned": abandoned,
                "ended_by": ended_by,
                "drawn": self.env.drawn,
                **self.trace.as_record(self.steps, self.total),
            }
        ]

    def close(self) -> None:
        self._last = None


class DiambraPlan:
    server_side = True  # every step gets a reply: the agent needs its next frame
    prepare_ahead = False  # one env, reset in open(): nothing to build ahead
    packages = ("diambra-arena", "gymnasium")  # versions recorded in the summary

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None, environ: Mapping[str, str] | None = None):
        settings: DiambraSettings = spec.options
        self.settings = settings
        self.seed = spec.seed
        self.csv_columns = CSV_COLUMNS
        address = engine_address_from_environ(os.environ if environ is None else environ)
        self.env = DiambraEnv(settings, engine_address=address)
        self.bounds = self.env.reward_bounds()
        self.engine = self.env.engine
        episodes = settings.episodes if spec.max_episodes is None else min(settings.episodes, spec.max_episodes)
        self.items = [Item(index=i, key=f"episode/{i}", fields={"episode": i}) for i in range(episodes)]
        game = settings.game_facts
        self.source = (
            f"diambra-arena {settings.game} ({game.name}), {settings.difficulty} = level {settings.level}, "
            f"{engine_label(self.engine)}" + (f" ({MOCK_NOTE})" if self.engine == ENGINE_MOCK else f" at {address}")
        )

    def open(self, item: Item) -> DiambraEpisode:
        seed = episode_seed(self.seed, item.index)
        return DiambraEpisode(self.env, item, seed, self.bounds, last=item.index == len(self.items) - 1)

    def unplayed(self, item: Item) -> list[dict[str, Any]]:
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
        return [{**record, "ended_by": "not_played", "reward_trace": [], "round_ends": []}]

    def handshake(self) -> dict[str, Any]:
        """The spaces, and what the agent plays: game, difficulty and level, the settings, the
        episodes, the reward bounds, and the engine."""
        described = self.env.describe()
        return {
            "spaces": {
                "observation": space_to_wire(self.env.observation_space),
                "action": space_to_wire(self.env.action_space),
            },
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
        }

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {"engine": self.engine}

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]:
        return {column: record.get(column, "") for column in CSV_COLUMNS}

    def progress_text(self, record: dict[str, Any]) -> str | None:
        return (
            f"{record['game']} {record['difficulty']} episode {record['episode']} (seed {record['seed']}, "
            f"{engine_label(record['engine'])}): steps {record['steps']:>5}  R {record['reward']:g}  "
            f"k {record['k']:.4f}  score {record['score']:g}"
        )

    def table_header(self) -> str:
        return f"{'game':<9} {'difficulty':<10} {'seed':>10} {'steps':>6} {'R':>8} {'k':>7} {'score':>9}  engine"

    def table_row(self, r: dict[str, Any]) -> str | None:
        return (
            f"{r['game']:<9} {r['difficulty']:<10} {r['seed'] if r['seed'] is not None else '-':>10} "
            f"{r['steps']:>6} {r['reward']:>8g} {r['k']:>7.4f} {r['score']:>9.1f}  {r['engine']}"
        )

    def close(self) -> None:
        self.env.close()
