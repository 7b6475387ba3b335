"""A format around a Gymnasium env the server owns: the episode (``GymEpisode``) and the plan over
one env (``GymPlan``), shared by the two-phase and DIAMBRA formats and by any new format whose
env is a ``gymnasium.Env``.

The server resets the env with the seed the plan derives (``base.reset_seed``) and records it.
While an episode runs its seed stays the server's: no create reply carries it (an agent that knew
it could replay the episode on its own copy of the env and foresee every random outcome); the
step reply that ends the episode names it (``"arbiter": {"seed"}``), and the record keeps it.

An episode the format ends before its env does (a step cap of its own: ``limit_reached``) ends
``truncated`` in the step reply, as Gymnasium's ``TimeLimit`` ends one.

An action outside the action space is refused by default (an ``INVALID_ACTION`` error reply,
nothing applied, counted): a Gymnasium env has no universal no-op to put in its place. A format
whose env has one (DIAMBRA's) overrides ``invalid_action``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from arbiter.protocol.errors import InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import SPEC_FIELDS, action_for, space_to_wire
from arbiter.server.core.summary import FINISHED
from arbiter.server.formats.base import Item, OpenItem, Plan, finite, plain, reset_seed, step_reply
from arbiter.server.formats.columns import Column

Step = tuple[Any, float, bool, bool, Any]  # a Gymnasium step: observation, reward, terminated, truncated, info


class GymEpisode(OpenItem):
    """One episode of ``env``, reset with ``seed`` when it is opened. An episode that did not
    finish scores ``unfinished_return`` when one is given, else the return it collected (honest
    only where no reward is negative: an agent could otherwise stop before its losses)."""

    def __init__(self, env: Any, item: Item, seed: int | None, *, unfinished_return: float | None = None):
        super().__init__(item)
        self.env = env
        # Read once: a wrapped env's action_space walks its wrappers' properties, at every step's check.
        self.action_space = env.action_space
        self.unfinished_return = unfinished_return
        self.last_step: Step | None = None
        self.begin(seed)

    def begin(self, seed: int | None) -> None:
        """Reset the env for a new episode."""
        self.seed = seed
        self.observation, self.info = self.reset_env(seed)
        self.steps = 0
        self.total_return = 0.0
        self.over = False

    def reset_env(self, seed: int | None) -> tuple[Any, Any]:
        return self.env.reset(seed=seed)

    def place(self) -> dict[str, Any]:
        """The create reply's ``arbiter`` extension: where the episode sits in the plan."""
        return dict(self.item.fields)

    def create_payload(self) -> dict[str, Any]:
        return {"observation": self.observation, "info": plain(self.info), EXTENSION_KEY: self.place()}

    def sanitize(self, action: Any) -> tuple[Any, int]:
        clean = action_for(self.action_space, action)
        if clean is None:
            return self.invalid_action(action)
        return clean, 0

    def invalid_action(self, action: Any) -> tuple[Any, int]:
        """What stands in for an action outside the action space: by default nothing (refused)."""
        raise InvalidAction(
            f"action {repr(action)[:80]} ({type(action).__name__}) is not in the action space {self.action_space}; "
            "nothing was applied"
        )

    def step(self, action: Any) -> bool:
        """Play ``action``, one that ``sanitize`` returned."""
        observation, reward, terminated, truncated, info = self.step_env(action)
        self.steps += 1
        self.total_return += float(reward)
        self.last_step = (observation, float(reward), bool(terminated), bool(truncated), info)
        self.over = bool(terminated or truncated)
        return self.over

    def step_env(self, action: Any) -> Step:
        """The env's step for an action ``sanitize`` returned; a format whose env would check it
        again says so here."""
        return self.env.step(action)

    def step_reply(self, invalid: int) -> dict[str, Any]:
        if self.last_step is None:
            raise RuntimeError(f"{type(self).__name__}.step_reply before any step")
        revealed = {"seed": self.seed} if self.over else {}  # the episode has ended: its seed is no secret
        last_step = self.last_step
        if self.over and not (last_step[2] or last_step[3]):
            # The format ended the episode (its own step cap, limit_reached) where the env did not:
            # it is cut short, or a Gymnasium loop, stopping on terminated or truncated, steps past its end.
            observation, reward, terminated, _, info = last_step
            last_step = (observation, reward, terminated, True, info)
        return step_reply(last_step, done=self.over, step=self.steps, invalid=invalid, stage_over=self.over,
                          **revealed)  # fmt: skip

    def record(self, ended: str) -> dict[str, Any]:
        finished = ended == FINISHED
        scored = self.total_return if finished or self.unfinished_return is None else self.unfinished_return
        return {
            **self.item.fields,
            "seed": self.seed,
            "steps": self.steps,
            "return": scored,
            "partial_return": None if finished else finite(self.total_return),
        }

    def close(self) -> None:
        self.last_step = None


class GymPlan(Plan):
    """A plan whose items are episodes of one Gymnasium env the plan owns (``make_env``), item i
    reset with ``reset_seed(seed, i)``. A format writes ``make_items`` and ``make_env``; its
    records hold the item's fields, ``seed``, ``steps``, ``return`` and ``partial_return``."""

    packages: tuple[str, ...] = ("gymnasium",)
    columns: tuple[Column, ...] = (
        Column("seed", progress=False, table=False),
        Column("steps", ">5"),
        Column("return", "g"),
        Column("ended", progress=False, table=False),
    )
    # What an episode that did not finish (timed out, abandoned, not played) scores; None: the
    # return it collected (0 for one not played).
    unfinished_return: float | None = None

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        super().__init__(spec, rule, tests=tests)
        self.env = self.make_env()

    @abstractmethod
    def make_env(self) -> Any:
        """The env every item is played on (``self.options`` holds the competition's keys)."""

    def seed_of(self, item: Item) -> int | None:
        return reset_seed(self.seed, item.index)

    def open(self, item: Item) -> OpenItem:
        return GymEpisode(self.env, item, self.seed_of(item), unfinished_return=self.unfinished_return)

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        scored = 0.0 if self.unfinished_return is None else self.unfinished_return
        return [{**item.fields, "seed": None, "steps": 0, "return": scored, "partial_return": None}]

    def handshake(self) -> dict[str, Any]:
        """The spaces, so ``RemoteEnv`` is a ``gymnasium.Env`` with the server's env's spaces, and
        the env's registration (``spec``) when it has one."""
        described = {
            "spaces": {
                "observation": space_to_wire(self.env.observation_space),
                "action": space_to_wire(self.env.action_space),
            }
        }
        spec = spec_to_wire(getattr(self.env, "spec", None))
        if spec is not None:
            described["spec"] = spec
        return described

    def close(self) -> None:
        self.env.close()


def spec_to_wire(spec: Any) -> dict[str, Any] | None:
    """An env's ``spec`` (Gymnasium's ``EnvSpec``: id, ``max_episode_steps``,
    ``reward_threshold`` ...) as plain data, or None when it has none. A callable entry point and
    the specs of its wrappers stay on the evaluator."""
    if spec is None or not isinstance(getattr(spec, "id", None), str):
        return None
    fields = {name: getattr(spec, name, None) for name in SPEC_FIELDS}
    for name in ("entry_point", "vector_entry_point"):
        if not isinstance(fields[name], str):
            fields[name] = None
    return {name: plain(value) for name, value in fields.items() if value is not None}
