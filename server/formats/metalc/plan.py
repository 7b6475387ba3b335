"""The MetaLC plan: one item per (run, fold, meta-test dataset), in the challenge's order
(docs/formats/metalc.md): runs in order (development: one; final: three), the 6 folds in order, each fold's
datasets in string order. Every item is one dataset's episode (``DatasetItem``).

What travels, and when:

- handshake (PONG): the phase, the algorithms in string order with their meta-features, each
  run's process seeding (so a runner seeds the agent's process as the challenge seeded its own),
  and the spaces;
- ENV_CREATE reply: ``info["dataset_meta_features"]`` (the arguments of ``Agent.reset``), the
  item's fields with ``first_of_fold`` and ``last_of_fold`` (the runner's fold process asks for the
  next dataset with a step only within its fold, see ``client/metalc_play.py``) and, for
  a fold's first dataset, ``arbiter["meta_train"]``: the other folds' dataset meta-features and
  their validation and test curves (``meta_train_wire``), the arguments of ``Agent.meta_train``.
  The first item the plan opens after a client's handshake carries them too, so a runner joining
  mid-fold (``--resume``) can build its fold's agent. Only the running fold's data ever goes out,
  and only with the plan's order: no request asks for it, so none can ask out of order. The data
  holds the other folds' test curves, later folds' scored datasets among them; that an agent
  cannot carry them into a later fold is the runner's doing (a process per fold), since what an
  agent remembers lives where the evaluator cannot see;
- ENV_STEP reply: the observation ``[A, C_A, R_validation(C_A)]``, A echoed as the client sent it.
  The reward is always 0: the scored (credited) curve is revealed only in the results, as the
  challenge revealed it only to its scoring program.

Budgets: the spec's ``planning_s`` covers ``reset`` and the first ``suggest`` of a dataset,
``step_s`` every later ``suggest``; a fold's first dataset gets ``meta_train_s`` more planning
time (and stage time) for ``meta_train`` (``Item.budgets``). A dataset that times out, reaches
``max_steps`` or is abandoned scores 0, like a dataset the challenge failed to score.

Spaces (for ``RemoteEnv`` users; ``arbiter.client.metalc`` sends names and ignores them):
action ``Tuple(Discrete(n + 1, start=-1), Discrete(n), Box(0, inf, ()))`` = (A_star, A, delta_t),
observation ``Tuple(Discrete(n), Box(0, inf, ()), Box(-inf, inf, ()))`` = (A, C_A, score). An
algorithm is named as the challenge names it, by anything whose ``str`` is its name, so for
round 1 and every generated meta-dataset (algorithms '0' .. 'n-1') the integer k is algorithm
'k'. Where the challenge would have crashed, the spaces' meaning applies instead: -1 (or None)
as A_star credits nothing, and an integer that names no algorithm is its index in the
handshake's ``algorithms``. Anything else is refused (``INVALID_ACTION``, nothing applied).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from arbiter.protocol.errors import ConfigError, InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import space_to_wire
from arbiter.server.core.summary import FINISHED
from arbiter.server.formats.base import Column, Item, OpenItem, Plan
from arbiter.server.formats.metalc.data import LearningCurve, MetaDataset, load_meta_dataset
from arbiter.server.formats.metalc.env import DatasetEpisode, Fold, folds, meta_training_data, run_seeds
from arbiter.server.formats.metalc.options import MetaLCOptions

# The challenge's result file per run is (dataset, alc); the columns after those two say which
# run and fold a row belongs to, what else it scored, how it ended and why it scored 0 if it did.
COLUMNS = (
    Column("dataset", "<16", label=""),
    Column("alc", ">8.4f", label="ALC", title="ALC"),
    Column("run", ">3"),
    Column("fold", ">4"),
    Column("final_score", ">8.4f", label="final score", title="final"),
    Column("steps", ">6"),
    Column("time_budget", ">5", progress=False, title="T"),
    Column("timed_out", progress=False, table=False),
    Column("ended", progress=False, table=False),
    Column("zero_because", progress=False, table=False),
)

NO_DATA_HELP = (
    "MetaLC evaluates a meta-dataset folder given with --tests DIR (dataset_meta_features/, "
    "algorithms_meta_features/, valid/, test/). The real round-1 meta-dataset is the input_data/ folder "
    "of the MIT-licensed MetaLC round-1 post-challenge repository: "
    "`git clone https://github.com/LishengSun/metaLC-post-challenge-analysis-1st-round`, then "
    "--tests metaLC-post-challenge-analysis-1st-round/input_data. A synthetic meta-dataset in the same "
    "layout: `arbiter generate --format metalc --out DIR` (--datasets, --algorithms, --seed)."
)


def algorithm_spaces(count: int) -> dict[str, Any]:
    from gymnasium import spaces

    seconds = spaces.Box(0.0, np.inf, shape=(), dtype=np.float64)
    score = spaces.Box(-np.inf, np.inf, shape=(), dtype=np.float64)
    action = spaces.Tuple([spaces.Discrete(count + 1, start=-1), spaces.Discrete(count), seconds])
    observation = spaces.Tuple([spaces.Discrete(count), seconds, score])
    return {"observation": space_to_wire(observation), "action": space_to_wire(action)}


def _curves_wire(
    table: dict[str, dict[str, LearningCurve]], algorithms: tuple[str, ...], missing: list[bool]
) -> dict[str, Any]:
    """One split's curves, dataset by dataset (in ``table``'s order), algorithm by algorithm (in
    ``algorithms``' order), as flat numpy arrays: two arrays travel as raw bytes where a thousand
    small ones would each be packed and unpacked. ``missing`` marks the curves whose scores.txt did
    not exist, which the challenge handed over as lists."""
    curves = [table[d][a] for d in table for a in algorithms]
    return {
        "lengths": np.array([len(c.timestamps) for c in curves], dtype=np.int64),
        "timestamps": np.concatenate([c.timestamps for c in curves]),
        "scores": np.concatenate([c.scores for c in curves]),
        "missing": np.array(missing, dtype=bool),
    }


def meta_train_wire(meta: MetaDataset, fold: Fold) -> dict[str, Any]:
    """The arguments of ``Agent.meta_train`` for ``fold`` but the algorithms' meta-features (in the
    handshake, the same for every fold): the datasets' meta-features, and the curves of the
    datasets in ``datasets`` order and the algorithms in the handshake's order."""
    data = meta_training_data(meta, fold)
    gone = set(meta.missing_curves)

    def missing(split: str) -> list[bool]:
        return [(split, d, a) in gone for d in fold.meta_train for a in meta.algorithms]

    return {
        "datasets": list(fold.meta_train),
        "datasets_meta_features": data.datasets_meta_features,
        "validation_learning_curves": _curves_wire(data.validation_learning_curves, meta.algorithms, missing("valid")),
        "test_learning_curves": _curves_wire(data.test_learning_curves, meta.algorithms, missing("test")),
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class MetaLCPlan(Plan):
    columns = COLUMNS
    options: MetaLCOptions

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        if not tests:
            raise ConfigError(f"{spec.name}: no meta-dataset. {NO_DATA_HELP}")
        self.phase = spec.options.phase
        self.meta = load_meta_dataset(tests)
        self.runs = run_seeds(self.phase)
        self.folds = folds(self.meta.datasets)
        super().__init__(spec, rule, tests=tests)
        self.source = self.meta.source
        self.seed = self.runs[0].seed  # the challenge's seeds, whatever the spec's seed
        self._names = set(self.meta.algorithms)
        self._meta_train_cache: dict[int, dict[str, Any]] = {}
        self._client_joined = True  # the next opened item carries its fold's meta-training data
        self._spaces = algorithm_spaces(len(self.meta.algorithms))  # built now, not on a client's clock

    def make_items(self) -> list[Item]:
        spec, options = self.spec, self.options
        first_budgets = dataclasses.replace(spec.budgets, planning_s=spec.budgets.planning_s + options.meta_train_s)
        items: list[Item] = []
        for run_seed in self.runs:
            for fold in self.folds:
                for position, dataset in enumerate(fold.meta_test):
                    fields = {
                        "phase": self.phase,
                        "run": run_seed.run,
                        "fold": fold.index,
                        "dataset": dataset,
                        "time_budget": self.meta.time_budget(dataset),
                        "seed": run_seed.seed,
                    }
                    unit = f"{self.phase}/run{run_seed.run}/fold{fold.index}/{dataset}"
                    budgets = first_budgets if position == 0 else None
                    # A fold's datasets are played by the agent its meta-training made: one group.
                    group = f"{self.phase}/run{run_seed.run}/fold{fold.index}"
                    items.append(Item(index=len(items), unit=unit, fields=fields, budgets=budgets, group=group))
        if spec.max_episodes is not None:  # debug runs: the first datasets only
            items = items[: spec.max_episodes]
        return items

    # -- the seam --------------------------------------------------------------------------------

    def open(self, item: Item) -> DatasetItem:
        return DatasetItem(self, item)

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        fields = item.fields
        episode = DatasetEpisode(self.meta, fields["dataset"], self.phase, run=fields["run"], fold=fields["fold"])
        return [{**episode.record(cut_short=True), "seed": fields["seed"]}]

    def handshake(self) -> dict[str, Any]:
        self._client_joined = True
        return {
            "phase": self.phase,
            "algorithms": list(self.meta.algorithms),
            "algorithms_meta_features": {a: dict(f) for a, f in self.meta.algorithms_meta_features.items()},
            "datasets": len(self.meta.datasets),
            "folds": len(self.folds),
            # the dev phase seeds Python's random before the agent's module is imported; the final
            # phase imports it first, then seeds the process at the start of every run
            "seed_before_import": self.phase == "dev",
            "runs": [r.to_plain() for r in self.runs],
            "spaces": self._spaces,
        }

    def close(self) -> None:
        self._meta_train_cache.clear()

    # -- helpers for the items -------------------------------------------------------------------

    def first_of_fold(self, item: Item) -> bool:
        return self.folds[item.fields["fold"]].meta_test[0] == item.fields["dataset"]

    def last_of_fold(self, item: Item) -> bool:
        return self.folds[item.fields["fold"]].meta_test[-1] == item.fields["dataset"]

    def take_meta_train(self, item: Item) -> dict[str, Any] | None:
        """The fold's meta-training data if this item must carry it (a fold's first dataset, or
        the first item opened since a client's handshake), else None."""
        joined, self._client_joined = self._client_joined, False
        if not (joined or self.first_of_fold(item)):
            return None
        fold = item.fields["fold"]
        if fold not in self._meta_train_cache:  # the same for every run: built once
            self._meta_train_cache[fold] = meta_train_wire(self.meta, self.folds[fold])
        return self._meta_train_cache[fold]

    def resolve(self, value: Any, what: str, *, none_ok: bool) -> str | None:
        """An algorithm's name from what an action holds (see the module docstring)."""
        if value is None and none_ok:
            return None
        if isinstance(value, np.ndarray) and value.shape == ():
            value = value.item()
        if not isinstance(value, (bool, np.bool_)):
            name = str(value)
            if name in self._names:
                return name
            if isinstance(value, (int, np.integer)):
                index = int(value)
                if index == -1 and none_ok:
                    return None
                if 0 <= index < len(self.meta.algorithms):
                    return self.meta.algorithms[index]
        raise InvalidAction(f"{what} {_short(value)} names no algorithm; nothing was applied")


def _delta_t(value: Any) -> float:
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf":
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidAction(f"delta_t must be a number, got {_short(value)}; nothing was applied")
    seconds = float(value)
    if math.isnan(seconds):
        raise InvalidAction("delta_t is NaN; nothing was applied")
    return seconds


class DatasetItem(OpenItem):
    """One meta-test dataset of one run, played through ``env.DatasetEpisode``."""

    def __init__(self, plan: MetaLCPlan, item: Item):
        super().__init__(item)
        fields = item.fields
        self.plan = plan
        self.first_of_fold = plan.first_of_fold(item)
        self.stage_budget_s = plan.options.stage_budget_s(self.first_of_fold)
        self.max_steps = plan.options.max_steps
        self.episode = DatasetEpisode(plan.meta, fields["dataset"], plan.phase, run=fields["run"], fold=fields["fold"])
        self._observation: list[Any] | None = None

    def create_payload(self) -> dict[str, Any]:
        dataset_meta_features, _ = self.episode.reset()
        ext: dict[str, Any] = {
            **self.item.fields,
            "first_of_fold": self.first_of_fold,
            "last_of_fold": self.plan.last_of_fold(self.item),
        }
        meta_train = self.plan.take_meta_train(self.item)
        if meta_train is not None:
            ext["meta_train"] = meta_train
        return {
            "observation": None,  # the agent's first suggest() gets None, as in the challenge
            "info": {"dataset_meta_features": dataset_meta_features},
            "random_seed": self.item.fields["seed"],
            EXTENSION_KEY: ext,
        }

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """``(A_star name or None, A name, delta_t, A as sent)``, or ``InvalidAction``."""
        if not isinstance(action, (list, tuple)) or len(action) != 3:
            raise InvalidAction(f"an action is [A_star, A, delta_t], got {_short(action)}; nothing was applied")
        a_star, algorithm, delta_t = action
        clean = (
            self.plan.resolve(a_star, "A_star", none_ok=True),
            self.plan.resolve(algorithm, "A", none_ok=False),
            _delta_t(delta_t),
            algorithm,
        )
        return clean, 0

    def step(self, action: Any) -> bool:
        a_star, algorithm, delta_t, as_sent = action
        (_, reached, score), done = self.episode.step((a_star, algorithm, delta_t))
        self._observation = [as_sent, reached, score]
        if not done and self.max_steps and self.episode.step_count >= self.max_steps:
            self.limit_reached = True  # the dataset ends step_limit and scores 0
        self.over = done or self.limit_reached
        return self.over

    def step_reply(self, invalid: int) -> dict[str, Any]:
        return {
            "observation": self._observation,
            "reward": 0.0,
            "terminated": self.episode.done,
            "truncated": self.limit_reached,
            "info": {},
            "done": self.over,
            "step": self.episode.step_count,
            "invalid_actions": invalid,
            EXTENSION_KEY: {"stage_over": self.over, "remaining_budget": self.episode.remaining_budget},
        }

    def record(self, ended: str) -> dict[str, Any]:
        record = self.episode.record(cut_short=ended != FINISHED)
        return {**record, "seed": self.item.fields["seed"]}

    def close(self) -> None:
        self._observation = None
