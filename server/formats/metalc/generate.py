"""Synthetic MetaLC meta-datasets, in the real layout (see ``data``), for scale and for tests.

Each dataset gets a time budget among 100, 200, 300 and 1200 (in equal shares) and a difficulty; each algorithm a
speed and a strength. A curve's points come at geometrically spaced times (as the real ones do,
each training step roughly doubling the time spent), some past the budget; its scores saturate
towards the pair's asymptote, with the validation and test curves sharing their times and
differing by noise. Times have 2 decimals and scores 3, so the loader's 2-decimal rounding meets
halfway cases where numpy's rounding differs from Python's.

Everything follows from ``seed`` through Python's ``random`` (its generator and ``uniform`` /
``gauss`` are stable across Python versions), so a seed names a meta-dataset.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.words import plural
from arbiter.server.formats.metalc.data import TIME_BUDGETS
from arbiter.server.service.durable import folder_written_whole

TASKS = (
    ("binary.classification", "Binary", "auc_metric"),
    ("multiclass.classification", "Categorical", "bac_metric"),
    ("multilabel.classification", "Binary", "f1_metric"),
    ("regression", "Numerical", "r2_metric"),
)
FEATURE_TYPES = ("Numerical", "Categorical", "Binary", "Mixed")
MAX_POINTS = 16


@dataclass(frozen=True)
class GeneratorSettings:
    datasets: int = 12
    algorithms: int = 6
    seed: int = 0
    missing_fraction: float = 0.0  # share of scores.txt files left out (never the first dataset's)
    duplicate_fraction: float = 0.0  # share of curves with one time repeated (the real data has one)

    def __post_init__(self) -> None:
        if self.datasets < 6:
            raise ConfigError(f"a meta-dataset needs at least 6 datasets (6 folds), got {self.datasets}")
        if self.algorithms < 1:
            raise ConfigError(f"a meta-dataset needs at least 1 algorithm, got {self.algorithms}")
        for name in ("missing_fraction", "duplicate_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {getattr(self, name)}")


def dataset_names(count: int) -> list[str]:
    """'syn0', 'syn1', ...: names whose string order differs from their numeric order."""
    return [f"syn{i}" for i in range(count)]


def synthetic_files(settings: GeneratorSettings) -> dict[str, str]:
    """Relative path → file content of a whole meta-dataset (nothing written)."""
    rng = random.Random(settings.seed)
    files: dict[str, str] = {}
    algorithms = [str(a) for a in range(settings.algorithms)]
    speed = {a: rng.uniform(0.3, 3.0) for a in algorithms}  # > 1: slower to deliver its first point
    strength = {a: rng.gauss(0.0, 0.08) for a in algorithms}
    for index, name in enumerate(algorithms):
        files[f"algorithms_meta_features/{name}.info"] = (
            f"meta_feature_0 = {index % 2}\nmeta_feature_1 = {(index % 10 + 1) / 10}\n"
        )
    names = dataset_names(settings.datasets)
    first = sorted(names)[0]  # the challenge lists algorithms from the first dataset's folder
    budgets = [TIME_BUDGETS[i % len(TIME_BUDGETS)] for i in range(len(names))]
    rng.shuffle(budgets)  # every budget appears once there are 4 datasets or more
    for dataset, budget in zip(names, budgets, strict=True):
        task, target_type, metric = rng.choice(TASKS)
        files[f"dataset_meta_features/{dataset}_public.info"] = _dataset_info(
            rng, dataset, budget, task, target_type, metric
        )
        difficulty = rng.uniform(0.35, 0.9)
        for algorithm in algorithms:
            times = _times(rng, budget, speed[algorithm], settings.duplicate_fraction)
            ceiling = min(0.99, max(0.02, difficulty + strength[algorithm] + rng.gauss(0.0, 0.05)))
            start = ceiling * rng.uniform(0.2, 0.85)
            pace = times[0] * rng.uniform(1.5, 8.0)
            clean = [ceiling - (ceiling - start) * math.exp(-(t - times[0]) / pace) for t in times]
            for split in ("valid", "test"):
                path = f"{split}/{dataset}/{algorithm}/scores.txt"
                if dataset != first and rng.random() < settings.missing_fraction:
                    files[path] = ""  # the folder exists, its scores.txt does not
                    continue
                scores = [round(min(1.0, max(0.0, s + rng.gauss(0.0, 0.015))), 3) for s in clean]
                files[path] = f"times: {json.dumps(times)}\nscores: {json.dumps(scores)}\n"
    return files


def _times(rng: random.Random, budget: int, speed: float, duplicate_fraction: float) -> list[float]:
    first = max(0.01, budget * rng.uniform(0.002, 0.08) * speed)
    growth = rng.uniform(1.5, 2.3)
    horizon = budget * rng.uniform(0.6, 2.5)
    times: list[float] = []
    t = first
    while len(times) < MAX_POINTS and (not times or t <= horizon):
        value = round(t, 2)
        times.append(value if not times else max(value, round(times[-1] + 0.01, 2)))
        t *= growth
    if len(times) > 1 and rng.random() < duplicate_fraction:
        at = rng.randrange(1, len(times))
        times[at] = times[at - 1]
        for i in range(at + 1, len(times)):  # keep the rest increasing after the repeat
            times[i] = max(times[i], round(times[i - 1] + 0.01, 2))
    return times


def _dataset_info(rng: random.Random, name: str, budget: int, task: str, target_type: str, metric: str) -> str:
    train = rng.randrange(200, 50000)
    label_num = 2 if target_type == "Binary" else rng.randrange(3, 100)
    fields = [
        ("usage", "'synthetic'"),
        ("name", f"'{name}'"),
        ("task", f"'{task}'"),
        ("target_type", f"'{target_type}'"),
        ("feat_type", f"'{rng.choice(FEATURE_TYPES)}'"),
        ("metric", f"'{metric}'"),
        ("time_budget", f"{budget:>6}"),
        ("feat_num", f"{rng.randrange(2, 5000):>6}"),
        ("target_num", f"{1 if task != 'multilabel.classification' else rng.randrange(2, 10):>6}"),
        ("label_num", f"{label_num:>6}"),
        ("train_num", f"{train:>6}"),
        ("valid_num", f"{train // rng.randrange(5, 12):>6}"),
        ("test_num", f"{train // rng.randrange(2, 6):>6}"),
        ("has_categorical", f"{rng.randrange(2):>6}"),
        ("has_missing", f"{rng.randrange(2):>6}"),
        ("is_sparse", f"{rng.randrange(2):>6}"),
    ]
    return "".join(f"{key} = {value}\n" for key, value in fields)


def write_meta_dataset(out_dir: str, settings: GeneratorSettings, *, overwrite: bool = False) -> int:
    """Write the meta-dataset as the folder ``out_dir``, whole: written beside it, then renamed
    into place. A folder already there that holds anything is refused unless ``overwrite``, then
    replaced (never written into: a meta-dataset mixed with other files is not one). Returns the
    number of files written."""
    written = 0
    with folder_written_whole(out_dir, overwrite=overwrite) as folder:
        for relative, content in synthetic_files(settings).items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if not content:
                continue
            path.write_text(content, encoding="utf-8")
            written += 1
    return written


GENERATE_OPTIONS = ("datasets", "algorithms", "seed", "missing_fraction", "duplicate_fraction", "overwrite")


def write_generated(out_dir: str, options: dict[str, Any]) -> str:
    """The format's ``generate`` hook: a meta-dataset from ``arbiter generate``'s options (None
    where not given: ``GeneratorSettings``' defaults); the line saying what was written."""

    given = [name for name, value in options.items() if value is not None and value is not False]
    foreign = sorted(name for name in given if name not in GENERATE_OPTIONS)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ConfigError(
            f"the metalc generator takes --datasets, --algorithms, --seed, --missing-fraction, "
            f"--duplicate-fraction and --overwrite, not {flags}"
        )
    chosen = {name: options[name] for name in GENERATE_OPTIONS if name != "overwrite" and options.get(name) is not None}
    settings = GeneratorSettings(**chosen)
    written = write_meta_dataset(out_dir, settings, overwrite=bool(options.get("overwrite")))
    counts = [plural(settings.datasets, "dataset"), plural(settings.algorithms, "algorithm"), plural(written, "file")]
    return f"wrote a synthetic MetaLC meta-dataset ({', '.join(counts)}) to {out_dir}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write a synthetic MetaLC meta-dataset.")
    parser.add_argument("--out", required=True, help="folder to create")
    parser.add_argument("--datasets", type=int, default=GeneratorSettings.datasets)
    parser.add_argument("--algorithms", type=int, default=GeneratorSettings.algorithms)
    parser.add_argument("--seed", type=int, default=GeneratorSettings.seed)
    parser.add_argument("--missing-fraction", type=float, default=0.0)
    parser.add_argument("--duplicate-fraction", type=float, default=0.0)
    args = parser.parse_args(argv)
    settings = GeneratorSettings(
        args.datasets, args.algorithms, args.seed, args.missing_fraction, args.duplicate_fraction
    )
    print(f"{write_meta_dataset(args.out, settings)} files written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
