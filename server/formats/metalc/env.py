"""One MetaLC evaluation's moving parts (docs/formats/metalc.md): phases and their runs and seeds, the
6 folds, what a fold's agent meta-trains on, and one dataset's episode.

An episode is the challenge's environment for one meta-test dataset: the agent's action
``(A_star, A, delta_t)`` spends ``delta_t`` (clipped to what remains) exploring algorithm ``A`` on
its validation curve, and credits ``A_star`` with its point as of its counter before this step.

The episode keeps what the scorer needs, so ``scoring`` works from records alone: of each kept
step, its end time ``t`` (rounded to 2 decimals, as the challenge writes it) and the credited
score. Only the steps that change the scored curve are kept: those that raise the best credited
score so far, the first that credits a time missing from its curve (which makes the dataset
unscorable), and the last (its score is the final score). Every other step adds exactly 0 to the
ALC's sum, so the figures are the challenge's to the last bit, and an agent that steps forever
with ``delta_t = 0`` costs a counter, not a record that grows with every step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from arbiter.protocol.errors import ConfigError, InvalidAction
from arbiter.server.formats.metalc.data import LearningCurve, MetaDataset
from arbiter.server.formats.metalc.scoring import dataset_figures, round2

Phase = Literal["dev", "final"]
PHASES: tuple[Phase, ...] = ("dev", "final")
N_FOLDS = 6
DEV_SEED = 208  # the development phase seeds Python's random once, before the first fold
FINAL_RUNS = 3  # the final phase plays everything 3 times, run r seeded with r + 1


def check_phase(phase: str) -> Phase:
    if phase not in PHASES:
        raise ConfigError(f"unknown MetaLC phase {phase!r}; known: {', '.join(PHASES)}")
    return phase  # type: ignore[return-value]


# -- runs and seeds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSeed:
    """How the agent's process is seeded before a run's first fold."""

    run: int
    seed: int
    python_random: bool = True
    numpy: bool = False
    torch: bool = False

    def apply(self) -> None:
        """Seed this process the way the challenge's ingestion program seeds itself (torch only
        when it is installed; the agent shares the process, so this is the agent's seeding)."""
        if self.python_random:
            random.seed(self.seed)
        if self.numpy:
            np.random.seed(self.seed)
        if self.torch:
            try:
                import torch
            except ImportError:
                return
            torch.manual_seed(self.seed)
            torch.cuda.manual_seed_all(self.seed)

    def to_plain(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "seed": self.seed,
            "random": self.python_random,
            "numpy": self.numpy,
            "torch": self.torch,
        }


def run_seeds(phase: str) -> list[RunSeed]:
    """Development: one run, Python's random seeded with 208 (numpy and torch left alone).
    Final: 3 runs, run r seeds random, numpy and torch with r + 1."""
    if check_phase(phase) == "dev":
        return [RunSeed(run=0, seed=DEV_SEED)]
    return [RunSeed(run=r, seed=r + 1, numpy=True, torch=True) for r in range(FINAL_RUNS)]


# -- folds -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    index: int
    meta_train: tuple[str, ...]  # the other folds' datasets, in string order
    meta_test: tuple[str, ...]  # this fold's datasets, played in this order


def folds(datasets: tuple[str, ...] | list[str], n_folds: int = N_FOLDS) -> list[Fold]:
    """Unshuffled k-fold over the datasets in string order: contiguous blocks, the first
    ``len % n_folds`` one dataset longer (scikit-learn's ``KFold(shuffle=False)``)."""
    ordered = tuple(datasets)
    if len(ordered) < n_folds:
        raise ConfigError(f"MetaLC needs at least {n_folds} datasets for its {n_folds} folds, got {len(ordered)}")
    base, extra = divmod(len(ordered), n_folds)
    found, start = [], 0
    for index in range(n_folds):
        size = base + (1 if index < extra else 0)
        found.append(Fold(index, ordered[:start] + ordered[start + size :], ordered[start : start + size]))
        start += size
    return found


@dataclass(frozen=True)
class MetaTrainingData:
    """The four arguments of ``Agent.meta_train`` for one fold: the other folds' dataset
    meta-features and BOTH their validation and test curves, and every algorithm's meta-features."""

    datasets_meta_features: dict[str, dict[str, str]]
    algorithms_meta_features: dict[str, dict[str, str]]
    validation_learning_curves: dict[str, dict[str, LearningCurve]]
    test_learning_curves: dict[str, dict[str, LearningCurve]]

    def as_args(self) -> tuple[Any, Any, Any, Any]:
        return (
            self.datasets_meta_features,
            self.algorithms_meta_features,
            self.validation_learning_curves,
            self.test_learning_curves,
        )

    def to_plain(self) -> dict[str, Any]:
        """Lists and strings only, for the wire (curves as ``{"timestamps": [...], "scores": [...]}``)."""
        return {
            "datasets_meta_features": self.datasets_meta_features,
            "algorithms_meta_features": self.algorithms_meta_features,
            "validation_learning_curves": _plain_curves(self.validation_learning_curves),
            "test_learning_curves": _plain_curves(self.test_learning_curves),
        }


def _plain_curves(curves: dict[str, dict[str, LearningCurve]]) -> dict[str, dict[str, Any]]:
    return {d: {a: curve.to_plain() for a, curve in row.items()} for d, row in curves.items()}


def meta_training_data(meta: MetaDataset, fold: Fold) -> MetaTrainingData:
    return MetaTrainingData(
        datasets_meta_features={d: dict(meta.dataset_meta_features[d]) for d in fold.meta_train},
        algorithms_meta_features={a: dict(f) for a, f in meta.algorithms_meta_features.items()},
        validation_learning_curves={d: dict(meta.validation_curves[d]) for d in fold.meta_train},
        test_learning_curves={d: dict(meta.test_curves[d]) for d in fold.meta_train},
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- one dataset -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    number: int  # its place in the dataset, from 1
    a_star: str | None  # the credited algorithm's name
    credited_time: float  # its point's time on the test curve, as of its counter before the step
    time: float  # the step's end, T - remaining, rounded to 2 decimals
    score: float | None  # the credited score on the phase's curve; None: that time is not on it


class DatasetEpisode:
    """One meta-test dataset played to the end of its time budget (docs/formats/metalc.md, "One step")."""

    def __init__(self, meta: MetaDataset, dataset: str, phase: str, *, run: int = 0, fold: int = 0):
        if dataset not in meta.dataset_meta_features:
            raise ConfigError(f"no dataset {dataset!r} in the meta-dataset")
        self.meta = meta
        self.dataset = dataset
        self.phase = check_phase(phase)
        self.run = run
        self.fold = fold
        self.time_budget = meta.time_budget(dataset)
        self.remaining_budget = float(self.time_budget)
        self.counters = {a: 0.0 for a in meta.algorithms}
        self.step_count = 0
        self.last_step: Step | None = None
        self.curve_steps: list[Step] = []  # the steps that changed the scored curve, in order
        self._best_score = 0.0  # the best credited score so far, as the ALC's sum tracks it
        self._unscorable = False  # a step credited a time missing from its curve
        self.done = False

    def reset(self) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """``(dataset_meta_features, algorithms_meta_features)``, the arguments of ``Agent.reset``."""
        return dict(self.meta.dataset_meta_features[self.dataset]), {
            a: dict(f) for a, f in self.meta.algorithms_meta_features.items()
        }

    def check_action(self, action: Any) -> tuple[Any, Any, float]:
        """The action as ``(A_star, A, delta_t)``, or ``InvalidAction`` (nothing is applied).
        Algorithms are looked up as ``str(x)``, so 7 and '7' name the same one."""
        if self.done:
            raise InvalidAction("this dataset's time budget is spent")
        if not isinstance(action, (tuple, list)) or len(action) != 3:
            raise InvalidAction(f"an action is (A_star, A, delta_t), got {_short(action)}")
        a_star, algorithm, delta_t = action
        if a_star is not None and str(a_star) not in self.counters:
            raise InvalidAction(f"A_star {_short(a_star)} is no algorithm; known: {self._known()}")
        if algorithm is None or str(algorithm) not in self.counters:
            raise InvalidAction(f"A {_short(algorithm)} is no algorithm; known: {self._known()}")
        if isinstance(delta_t, bool) or not isinstance(delta_t, (int, float, np.integer, np.floating)):
            raise InvalidAction(f"delta_t must be a number, got {_short(delta_t)}")
        if math.isnan(delta_t):
            raise InvalidAction("delta_t is NaN")
        return a_star, algorithm, float(delta_t)

    def _known(self) -> str:
        names = self.meta.algorithms
        return ", ".join(names) if len(names) <= 20 else f"{len(names)} names from {names[0]!r} to {names[-1]!r}"

    def step(self, action: Any) -> tuple[tuple[Any, float, float], bool]:
        """Apply one action: ``((A, C_A, R_validation_C_A), done)``."""
        a_star, algorithm, delta_t = self.check_action(action)
        delta_t = min(max(delta_t, 0.0), self.remaining_budget)
        done = delta_t >= self.remaining_budget

        # A_star is credited as of its counter before this step, read on the test curve
        credited_name = None if a_star is None else str(a_star)
        credited_time = 0.0
        if credited_name is not None:
            _, credited_time = self.meta.test_curves[self.dataset][credited_name].last_point_within(
                0.0, self.counters[credited_name]
            )

        # the counter moves to the point reached, not by delta_t: time short of the next point is lost
        name = str(algorithm)
        score, reached = self.meta.validation_curves[self.dataset][name].last_point_within(delta_t, self.counters[name])
        self.counters[name] = reached
        self.remaining_budget = self.remaining_budget - delta_t

        end = round2(self.time_budget - self.remaining_budget)
        self.step_count += 1
        credited_score = self._credited_score(credited_name, credited_time)
        step = Step(self.step_count, credited_name, credited_time, end, credited_score)
        self._keep_if_it_changes_the_curve(step)
        self.last_step = step
        self.done = done
        return (algorithm, reached, score), done

    def _keep_if_it_changes_the_curve(self, step: Step) -> None:
        """The scorer's best-so-far rises only at these steps; at any other its term is 0."""
        if step.score is None:
            if not self._unscorable:
                self._unscorable = True
                self.curve_steps.append(step)
        elif step.score > self._best_score:
            self._best_score = step.score
            self.curve_steps.append(step)

    def scored_steps(self) -> list[Step]:
        """The steps the record keeps: those that changed the scored curve, and the last."""
        kept = list(self.curve_steps)
        if self.last_step is not None and (not kept or kept[-1] is not self.last_step):
            kept.append(self.last_step)
        return kept

    def _credited_score(self, name: str | None, time: float) -> float | None:
        """The scorer's lookup: time 0 scores 0; otherwise the first point at exactly that time on
        the validation curve and, in the final phase, its score on the test curve. A time missing
        from the validation curve makes the whole dataset unscorable (the challenge scores it 0)."""
        if name is None or time == 0:
            return 0.0
        on_validation = self.meta.validation_curves[self.dataset][name].score_at(time)
        if self.phase == "dev" or on_validation is None:
            return on_validation
        return self.meta.test_curves[self.dataset][name].score_at(time)

    def record(self, *, cut_short: bool = False) -> dict[str, Any]:
        """This dataset's result record: everything ``scoring`` needs, figures included. Its curve
        (``times``, ``scores``, ``a_star``, ``credited_times``, and ``step_numbers`` saying which
        steps they are) holds the scored steps only; ``steps`` counts them all. ``cut_short``:
        the dataset was stopped before the agent spent its budget (a timeout, a step limit), so
        it scores 0; ``zero_because`` says why a dataset scores 0."""
        kept = self.scored_steps()
        times = [s.time for s in kept]
        scores = [s.score for s in kept]
        alc, final_score, zero_because = dataset_figures(
            times, scores, self.time_budget, self.phase, finished=self.done and not cut_short
        )
        return {
            "phase": self.phase,
            "run": self.run,
            "fold": self.fold,
            "dataset": self.dataset,
            "time_budget": self.time_budget,
            "steps": self.step_count,
            "finished": self.done,
            "zero_because": zero_because,
            "alc": alc,
            "final_score": final_score,
            "times": times,
            "scores": scores,
            "a_star": [s.a_star for s in kept],
            "credited_times": [s.credited_time for s in kept],
            "step_numbers": [s.number for s in kept],
        }
