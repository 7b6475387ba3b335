"""The MetaLC meta-dataset: its folder layout, read exactly as the challenge reads it (docs/formats/metalc.md).

    dataset_meta_features/<dataset>_public.info     `key = value` lines
    algorithms_meta_features/<algorithm>.info       `key = value` lines
    valid/<dataset>/<algorithm>/scores.txt          `times: [...]` and `scores: [...]`
    test/<dataset>/<algorithm>/scores.txt

Datasets are the folders of ``test/`` and algorithms the folders of the first dataset's, both in
string order ('0', '1', '10', ..., '19', '2', ...). Meta-feature values are kept as strings with
spaces, newlines and single quotes removed. Curve times and scores are rounded to 2 decimals with
numpy's rounding (not Python's). A missing ``scores.txt`` is the single point (0, 0).

The ``parse_*`` functions are pure; ``load_meta_dataset`` reads a folder and raises ``ConfigError``
naming the file for anything the challenge would have crashed on or silently misread.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arbiter.protocol.errors import ConfigError

TIME_BUDGETS = (100, 200, 300, 1200)  # the ones round 1 uses; any positive integer loads
SPLITS = ("valid", "test")


class LearningCurve:
    """One algorithm's curve on one dataset, as the challenge's agents receive it: ``timestamps``
    and ``scores`` are float64 numpy arrays (read-only here: the evaluator's copy is shared)."""

    __slots__ = ("timestamps", "scores", "_times", "_scores")

    def __init__(self, timestamps: Any, scores: Any):
        self.timestamps = _frozen(timestamps)
        self.scores = _frozen(scores)
        if self.timestamps.shape != self.scores.shape or self.timestamps.ndim != 1 or not len(self.timestamps):
            raise ValueError("a learning curve needs as many scores as times, and at least one point")
        # The same values as Python floats, which the lookups below scan once a step: a float64
        # compares and converts to the same float either way, and reading a list costs no numpy
        # scalar per point.
        self._times: list[float] = self.timestamps.tolist()
        self._scores: list[float] = self.scores.tolist()

    @classmethod
    def missing(cls) -> LearningCurve:
        return cls([0.0], [0.0])

    def last_point_within(self, delta_t: float, counter: float) -> tuple[float, float]:
        """(score, time) of the point reached by spending ``delta_t`` more on top of ``counter``:
        the point just before the first one whose time exceeds ``counter + delta_t``, (0, 0) when
        even the first is out of reach, the last point when none is. Scanning for the first point
        out of reach (rather than the last in reach) is the challenge's rule, and differs only on
        a curve whose times are not sorted."""
        reach = counter + delta_t
        times = self._times
        for i, time in enumerate(times):
            if reach < time:
                if i == 0:
                    return 0.0, 0.0
                return self._scores[i - 1], times[i - 1]
        return self._scores[-1], times[-1]

    def score_at(self, time: float) -> float | None:
        """The score of the first point at exactly ``time``, None when the curve has no such point
        (a NaN time is at no point)."""
        for i, point in enumerate(self._times):
            if point == time:
                return self._scores[i]
        return None

    def to_plain(self) -> dict[str, list[float]]:
        return {"timestamps": self.timestamps.tolist(), "scores": self.scores.tolist()}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> LearningCurve:
        return cls(data["timestamps"], data["scores"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LearningCurve):
            return NotImplemented
        return np.array_equal(self.timestamps, other.timestamps) and np.array_equal(self.scores, other.scores)

    def __repr__(self) -> str:
        return f"LearningCurve({len(self.timestamps)} points, last {self.timestamps[-1]}: {self.scores[-1]})"


def _frozen(values: Any) -> np.ndarray:
    array = np.array(values, dtype=np.float64)
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class MetaDataset:
    """A whole meta-dataset in memory; every mapping iterates in string order."""

    datasets: tuple[str, ...]
    algorithms: tuple[str, ...]
    dataset_meta_features: dict[str, dict[str, str]]
    algorithms_meta_features: dict[str, dict[str, str]]
    validation_curves: dict[str, dict[str, LearningCurve]]
    test_curves: dict[str, dict[str, LearningCurve]]
    missing_curves: tuple[tuple[str, str, str], ...] = field(default=())  # (split, dataset, algorithm)
    source: str | None = None

    def time_budget(self, dataset: str) -> int:
        return int(self.dataset_meta_features[dataset]["time_budget"])


# -- pure parsers ------------------------------------------------------------------------------------


def parse_info(text: str, source: str) -> dict[str, str]:
    """``key = value`` lines; keys and values lose every space, newline and single quote (so
    ``name = 'adult'`` gives ``{'name': 'adult'}``). Blank lines are skipped; a line without
    exactly one '=' is an error."""
    features: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if not line.strip():
            continue
        parts = line.split("=")
        if len(parts) != 2:
            raise ConfigError(f"{source}, line {number}: expected 'key = value', got {line.rstrip()!r}")
        key = parts[0].replace(" ", "").replace("\n", "")
        value = parts[1].replace(" ", "").replace("\n", "").replace("'", "")
        if not key:
            raise ConfigError(f"{source}, line {number}: empty key")
        features[key] = value
    return features


def parse_curve(text: str, source: str) -> LearningCurve:
    """A ``scores.txt``: a ``times: [...]`` and a ``scores: [...]`` line (JSON lists of numbers,
    as many of each, at least one); both rounded to 2 decimals."""
    fields: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(":")
        if len(parts) < 2:
            raise ConfigError(f"{source}, line {number}: expected 'times: [...]' or 'scores: [...]'")
        fields[parts[0]] = parts[1]
    values = {}
    for name in ("times", "scores"):
        if name not in fields:
            raise ConfigError(f"{source}: no '{name}:' line")
        try:
            parsed = json.loads(fields[name])
        except ValueError as exc:
            raise ConfigError(f"{source}: '{name}' is not a JSON list ({exc})") from None
        if not isinstance(parsed, list) or not parsed:
            raise ConfigError(f"{source}: '{name}' must be a non-empty list of numbers")
        if not all(_is_number(v) and math.isfinite(v) for v in parsed):
            raise ConfigError(f"{source}: '{name}' must hold finite numbers only")
        values[name] = np.around(np.array(parsed, dtype=np.float64), decimals=2)
    if len(values["times"]) != len(values["scores"]):
        raise ConfigError(
            f"{source}: {len(values['times'])} times but {len(values['scores'])} scores; they must pair up"
        )
    return LearningCurve(values["times"], values["scores"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_time_budget(features: dict[str, str], source: str) -> int:
    """The challenge reads ``time_budget`` as ``float`` to play and as ``int`` to score: it must
    be a positive integer."""
    if "time_budget" not in features:
        raise ConfigError(f"{source}: no time_budget")
    try:
        budget = int(features["time_budget"])
    except ValueError:
        raise ConfigError(f"{source}: time_budget must be a whole number, got {features['time_budget']!r}") from None
    if budget <= 0:
        raise ConfigError(f"{source}: time_budget must be positive, got {budget}")
    return budget


# -- the folder ----------------------------------------------------------------------------------------


def load_meta_dataset(root: str) -> MetaDataset:
    """Read a meta-dataset folder (see the module docstring)."""
    if not os.path.isdir(root):  # a typo in --tests, said as one rather than as a folder's missing part
        raise ConfigError(
            f"meta-dataset {root!r} {'is a file, not a folder' if os.path.exists(root) else 'does not exist'}"
        )
    for sub in ("dataset_meta_features", "algorithms_meta_features", *SPLITS):
        if not os.path.isdir(os.path.join(root, sub)):
            raise ConfigError(f"{root}: not a MetaLC meta-dataset (no {sub}/ folder)")
    datasets = _folders(os.path.join(root, "test"))
    if not datasets:
        raise ConfigError(f"{root}/test: no dataset folders")
    if _folders(os.path.join(root, "valid")) != datasets:
        raise ConfigError(f"{root}: valid/ and test/ must hold the same dataset folders")
    for name in datasets:
        # the challenge keys a dataset's meta-features by its file name cut at the first '_' or '.'
        if "_" in name or "." in name:
            raise ConfigError(f"{root}/test/{name}: dataset names cannot contain '_' or '.'")
    algorithms = _folders(os.path.join(root, "test", datasets[0]))
    if not algorithms:
        raise ConfigError(f"{root}/test/{datasets[0]}: no algorithm folders")
    if _folders(os.path.join(root, "valid", datasets[0])) != algorithms:
        raise ConfigError(f"{root}: valid/{datasets[0]}/ and test/{datasets[0]}/ must hold the same algorithms")

    dataset_features = {}
    for name in datasets:
        path = os.path.join(root, "dataset_meta_features", f"{name}_public.info")
        features = parse_info(_read(path, f"meta-features of dataset {name!r}"), path)
        check_time_budget(features, path)
        dataset_features[name] = features

    algorithm_features = {}
    folder = os.path.join(root, "algorithms_meta_features")
    described = sorted(f[: -len(".info")] for f in os.listdir(folder) if f.endswith(".info"))
    if described != sorted(algorithms):
        raise ConfigError(f"{folder}: needs one <algorithm>.info per algorithm {list(algorithms)}, found {described}")
    for name in algorithms:
        path = os.path.join(folder, f"{name}.info")
        algorithm_features[name] = parse_info(_read(path, f"meta-features of algorithm {name!r}"), path)

    curves: dict[str, dict[str, dict[str, LearningCurve]]] = {}
    missing = []
    for split in SPLITS:
        curves[split] = {}
        for dataset in datasets:
            row = {}
            for algorithm in algorithms:
                path = os.path.join(root, split, dataset, algorithm, "scores.txt")
                if not os.path.isfile(path):
                    row[algorithm] = LearningCurve.missing()
                    missing.append((split, dataset, algorithm))
                    continue
                row[algorithm] = parse_curve(_read(path, "learning curve"), path)
            curves[split][dataset] = row
    return MetaDataset(
        datasets=datasets,
        algorithms=algorithms,
        dataset_meta_features=dataset_features,
        algorithms_meta_features=algorithm_features,
        validation_curves=curves["valid"],
        test_curves=curves["test"],
        missing_curves=tuple(missing),
        source=os.path.abspath(root),
    )


def _folders(path: str) -> tuple[str, ...]:
    """Sub-folders in string order; hidden entries (.DS_Store, .git ...) are not datasets."""
    if not os.path.isdir(path):
        return ()
    return tuple(sorted(n for n in os.listdir(path) if not n.startswith(".") and os.path.isdir(os.path.join(path, n))))


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc})") from None
