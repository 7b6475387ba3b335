"""The two-phase plan: phase 1's evaluation episodes, then per run a training stage and its
evaluation episodes (SCORING.md §2). The env is the organiser's (competition spec), never the
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
from arbiter.protocol.spaces import space_to_wire
from arbiter.server.formats.base import Item, reset_seed
from arbiter.server.formats.two_phase.episodes import EvalEpisode, TrainingRun
from arbiter.server.formats.two_phase.options import TwoPhaseOptions, check_feasible, worst_return

CSV_COLUMNS = [
    "phase",
    "stage",
    "run",
    "episode",
    "seed",
    "steps",
    "return",
    "total_steps",
    "complete",
    "timed_out",
    "timeout",
]


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
            return target(**env_kwargs)
    try:
        return gymnasium.make(env_id, **env_kwargs)
    except gymnasium.error.Error as exc:
        raise ConfigError(f"env_id {env_id!r}: {exc}") from None


class TwoPhasePlan:
    server_side = True
    prepare_ahead = False  # one env serves every item: opening the next would reset it
    packages = ("gymnasium",)

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        options: TwoPhaseOptions = spec.options
        self.options = options
        self.seed = spec.seed
        self.source = options.env_id
        self.csv_columns = CSV_COLUMNS
        self.env = make_env(options.env_id, options.env_kwargs)
        max_episode_steps = self.env.spec.max_episode_steps if self.env.spec is not None else None
        check_feasible(options, max_episode_steps)
        self.worst_return = worst_return(options, max_episode_steps)
        p2 = options.phase2
        phase2_budgets = dataclasses.replace(spec.budgets, step_s=p2.step_s, planning_s=p2.planning_s)
        self.items: list[Item] = []
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

    def _add(self, key: str, fields: dict[str, Any], budgets: Any = None, group: str | None = None) -> None:
        self.items.append(Item(index=len(self.items), key=key, fields=fields, budgets=budgets, group=group))

    def open(self, item: Item) -> Any:
        fields = item.fields
        if fields["stage"] == "train":
            return TrainingRun(self.env, item, self.options, self.seed)
        path = (1, fields["episode"]) if fields["phase"] == 1 else (3, fields["run"], fields["episode"])
        return EvalEpisode(self.env, item, reset_seed(self.seed, *path), self.worst_return)

    def unplayed(self, item: Item) -> list[dict[str, Any]]:
        if item.fields["stage"] == "train":
            return [{**item.fields, "episode": None, "seed": None, "steps": 0, "return": 0.0, "total_steps": 0,
                     "complete": False, "run_ended": "not_played", "converged_at": None}]  # fmt: skip
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
        return {
            "env_id": self.options.env_id,
            "spaces": {
                "observation": space_to_wire(self.env.observation_space),
                "action": space_to_wire(self.env.action_space),
            },
            "stages": stages,
        }

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def progress_text(self, record: dict[str, Any]) -> str | None:
        if record["stage"] == "train":
            if record.get("wall_s") is None:
                return None  # one line per run: its last record
            converged = record.get("converged_at")
            ended = f"converged at step {converged}" if converged is not None else f"ended: {record.get('run_ended')}"
            episodes, steps = (record.get("episode") or 0) + 1, record["total_steps"]
            return (
                f"phase 2 run {record['run']} training: {episodes} {'episode' if episodes == 1 else 'episodes'}, "
                f"{steps} {'step' if steps == 1 else 'steps'}, {ended}"
            )
        where = "phase 1" if record["phase"] == 1 else f"phase 2 run {record['run']}"
        return f"{where} eval episode {record['episode']}: steps {record['steps']:>5}  return {record['return']:g}"

    def table_header(self) -> str:
        return f"{'phase':>5} {'stage':<5} {'run':>3} {'episodes':>8} {'steps':>7} {'return':>10}"

    def table_row(self, r: dict[str, Any]) -> str | None:
        if r["stage"] == "train":
            if r.get("wall_s") is None:
                return None
            episodes = (r.get("episode") or 0) + 1
            return f"{2:>5} {'train':<5} {r['run']:>3} {episodes:>8} {r['total_steps']:>7} {'':>10}"
        run = "-" if r["run"] is None else r["run"]
        return f"{r['phase']:>5} {'eval':<5} {run:>3} {1:>8} {r['steps']:>7} {r['return']:>10.2f}"

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]:
        return {column: record.get(column, "") for column in CSV_COLUMNS}

    def close(self) -> None:
        self.env.close()
