"""The two-phase plan: phase 1's evaluation episodes, then per run a training stage and its
evaluation episodes (docs/formats/two-phase.md). The env is the organiser's (competition spec), never the
client's; one env serves the whole evaluation, reset with the server's seeds.

Seeds (recorded with every episode): phase-1 episode i is reset with ``reset_seed(seed, 1, i)``;
training run r's k-th reset with ``reset_seed(seed, 2, r, k)``; run r's evaluation episode i with
``reset_seed(seed, 3, r, i)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import Column, Item, reset_seed
from arbiter.server.formats.gym_episode import GymPlan
from arbiter.server.formats.two_phase.episodes import EvalEpisode, TrainingRun
from arbiter.server.formats.two_phase.options import TwoPhaseOptions, check_feasible, worst_return


def _episodes(record: dict[str, Any]) -> int:
    """The episodes a table row or progress line stands for: a training run's all, else one."""
    return (record.get("episode") or 0) + 1 if record.get("stage") == "train" else 1


def _steps(record: dict[str, Any]) -> int:
    return record.get("total_steps", 0) if record.get("stage") == "train" else record.get("steps", 0)


def _eval_return(record: dict[str, Any]) -> float | None:
    return None if record.get("stage") == "train" else record.get("return")


COLUMNS = (
    Column("phase", ">5"),
    Column("stage", "<5"),
    Column("run", ">3"),
    Column("episode", table=False),
    Column("seed", progress=False, table=False),
    Column("steps", ">5", table=False),
    Column("return", "g", table=False),
    Column("total_steps", progress=False, table=False, optional=True),  # a training episode's
    Column("complete", progress=False, table=False, optional=True),
    Column("timed_out", progress=False, table=False),
    Column("timeout", progress=False, table=False),
    Column("ended", progress=False, table=False),
    # the end table: a training run's row stands for all its episodes and env steps
    Column("episodes", ">8", value=_episodes, csv=False, progress=False),
    Column("run_steps", ">7", title="steps", value=_steps, csv=False, progress=False),
    Column("eval_return", ">10.2f", title="return", value=_eval_return, csv=False, progress=False),
)


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """A registered id (``CartPole-v1``, or ``module:EnvId`` which Gymnasium imports first), or
    ``module:Class`` naming an env class."""
    import gymnasium

    module_name, _, attr = env_id.partition(":")
    if attr and env_id not in gymnasium.registry:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"env_id {env_id!r}: cannot import {module_name!r}: {exc}") from None
        target = getattr(module, attr, None)
        if isinstance(target, type) and issubclass(target, gymnasium.Env):
            return _made(env_id, env_kwargs, lambda: target(**env_kwargs))
    return _made(env_id, env_kwargs, lambda: gymnasium.make(env_id, **env_kwargs))


def _made(env_id: str, env_kwargs: dict[str, Any], make: Any) -> Any:
    """The env ``make`` builds; what its constructor refuses (a keyword it does not take, a value
    out of its range) is the competition's error, named."""
    import gymnasium

    try:
        return make()
    except gymnasium.error.Error as exc:
        raise ConfigError(f"env_id {env_id!r}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env_id {env_id!r} with env_kwargs {env_kwargs!r}: the env refuses them: {exc}") from None


class TwoPhasePlan(GymPlan):
    prepare_ahead = False  # one env serves every item: opening the next would reset it
    columns = COLUMNS
    options: TwoPhaseOptions

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        super().__init__(spec, rule, tests=tests)
        self.source = self.options.env_id
        max_episode_steps = self.env.spec.max_episode_steps if self.env.spec is not None else None
        check_feasible(self.options, max_episode_steps)
        self.worst_return = worst_return(self.options, max_episode_steps)

    @property
    def item_nouns(self) -> tuple[str, str]:
        if self.options.runs_phase(2):
            return super().item_nouns  # training runs and evaluation episodes
        return ("episode", "episodes")

    def make_env(self) -> Any:
        return make_env(self.options.env_id, self.options.env_kwargs)

    def make_items(self) -> list[Item]:
        options = self.options
        p2 = options.phase2
        phase2_budgets = dataclasses.replace(self.spec.budgets, step_s=p2.step_s, planning_s=p2.planning_s)
        self.items = []
        if options.runs_phase(1):
            for i in range(options.num_episodes):
                self._add(f"phase1/eval/{i}", {"phase": 1, "stage": "eval", "run": None, "episode": i})
        if options.runs_phase(2):
            for run in range(p2.num_runs):
                # A run's evaluation episodes are played by the agent its training made: one group.
                group = f"phase2/run{run}"
                self._add(f"phase2/run{run}/train", {"phase": 2, "stage": "train", "run": run}, phase2_budgets, group)
                for i in range(options.num_episodes):
                    fields = {"phase": 2, "stage": "eval", "run": run, "episode": i}
                    self._add(f"phase2/run{run}/eval/{i}", fields, phase2_budgets, group)
        return self.items

    def _add(self, unit: str, fields: dict[str, Any], budgets: Any = None, group: str | None = None) -> None:
        self.items.append(Item(index=len(self.items), unit=unit, fields=fields, budgets=budgets, group=group))

    def open(self, item: Item) -> Any:
        fields = item.fields
        if fields["stage"] == "train":
            return TrainingRun(self.env, item, self.options, self.seed)
        path = (1, fields["episode"]) if fields["phase"] == 1 else (3, fields["run"], fields["episode"])
        return EvalEpisode(self.env, item, reset_seed(self.seed, *path), unfinished_return=self.worst_return)

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        if item.fields["stage"] == "train":
            return [{**item.fields, "episode": None, "seed": None, "steps": 0, "return": 0.0, "total_steps": 0,
                     "complete": False, "converged_at": None}]  # fmt: skip
        return [{**item.fields, "seed": None, "steps": 0, "return": self.worst_return, "partial_return": None}]

    def handshake(self) -> dict[str, Any]:
        """The spaces, and the stages in order, so a runner knows what comes next."""
        stages: list[dict[str, Any]] = []
        for item in self.items:
            fields = item.fields
            last = stages[-1] if stages else None
            if last and fields["stage"] == "eval" and last["stage"] == "eval" and last["run"] == fields["run"]:
                last["items"][1] = item.index + 1
                continue
            stages.append(
                {"phase": fields["phase"], "stage": fields["stage"], "run": fields["run"],
                 "items": [item.index, item.index + 1]}
            )  # fmt: skip
        return {"env_id": self.options.env_id, **super().handshake(), "stages": stages}

    def progress_text(self, record: dict[str, Any]) -> str | None:
        """A training run is announced once, with its last record: its episodes, its env steps
        and how it ended."""
        if record.get("stage") != "train" or not record.get("last_of_item", True):
            return super().progress_text(record)
        converged = record.get("converged_at")
        ended = f"converged at step {converged}" if converged is not None else f"ended {record.get('ended')}"
        episodes, steps = _episodes(record), _steps(record)
        return (
            f"phase 2 run {record['run']} training: {episodes} {'episode' if episodes == 1 else 'episodes'}, "
            f"{steps} {'step' if steps == 1 else 'steps'}, {ended}"
        )
