"""Deterministic generation of Flatland test folders.

The evaluator (flatland-rl's ``FlatlandRemoteEvaluationService``) reads a folder laid out as
``<dir>/Test_<t>/Level_<l>.pkl`` plus ``<dir>/metadata.csv``. Shipping such folders around is awkward, so
arbiter regenerates them from a named preset and a seed instead: the same preset + seed always yields the
same envs, which keeps local runs, CI and benchmarks comparable without storing pickles in git.

Folders are written to a temporary sibling and renamed into place at the end, so a reader (or a second
process racing on the same cache folder) never sees a half-written test set.

The format's hooks: ``write_test_folder`` (``arbiter generate``) and ``debug_test_set`` (the test
set of an ``arbiter run`` given none).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.words import plural
from arbiter.server.service.durable import folder_written_whole

logger = logging.getLogger(__name__)

#: Column names and order expected by flatland's evaluator (it builds ``test_id + "/" + env_id + ".pkl"``).
METADATA_COLUMNS = [
    "test_id",
    "env_id",
    "n_agents",
    "x_dim",
    "y_dim",
    "n_cities",
    "max_rail_pairs_in_city",
    "n_envs_run",
    "seed",
    "grid_mode",
    "max_rails_between_cities",
    "malfunction_duration_min",
    "malfunction_duration_max",
    "malfunction_interval",
    "speed_ratios",
]

#: flatland's own default speed mix (Flatland 3 test sets).
DEFAULT_SPEED_RATIOS: dict[float, float] = {1.0: 0.25, 0.5: 0.25, 0.33: 0.25, 0.25: 0.25}

#: Retries per env: sparse_rail_generator fails to place all cities for roughly 10-15 % of seeds on small
#: grids (it only warns), so a bounded number of re-draws is needed to get the env that was asked for.
MAX_TRIES = 20

_TEST_RE = re.compile(r"^Test_(\d+)$")
_LEVEL_RE = re.compile(r"^Level_(\d+)\.pkl$")


def _env(
    test: int, level: int, n_agents: int, dim: int, n_cities: int = 2, malfunction_interval: int = 300, **overrides: Any
) -> dict[str, Any]:
    """One preset entry: where the env goes (test, level) and the env_generator parameters for it."""
    params: dict[str, Any] = {
        "test": test,
        "level": level,
        "n_agents": n_agents,
        "x_dim": dim,
        "y_dim": dim,
        "n_cities": n_cities,
        "max_rail_pairs_in_city": 2,
        "grid_mode": False,
        "max_rails_between_cities": 2,
        "malfunction_duration_min": 20,
        "malfunction_duration_max": 50,
        "malfunction_interval": malfunction_interval,
        "speed_ratios": dict(DEFAULT_SPEED_RATIOS),
    }
    params.update(overrides)
    return params


PRESETS: dict[str, list[dict[str, Any]]] = {
    # Small and quick, but with malfunctions and mixed speeds so every code path of an episode is exercised.
    "debug": [
        _env(0, 0, 2, 25, malfunction_interval=250),
        _env(0, 1, 3, 25, malfunction_interval=250),
        _env(0, 2, 4, 30, malfunction_interval=250),
        _env(0, 3, 5, 30, malfunction_interval=250),
        _env(1, 0, 5, 30),
        _env(1, 1, 6, 30),
        _env(1, 2, 7, 35),
        _env(1, 3, 8, 35),
    ],
    # For unit tests: as small as flatland allows while still having two cities.
    "tiny": [_env(0, level, 2, 25, malfunction_interval=250) for level in range(3)],
}

#: What a level given to ``generate_test_set(levels=...)`` must name, and what else it may set: the
#: env_generator parameters metadata.csv records, so that every generated level can be reproduced.
LEVEL_REQUIRED_KEYS = ("test", "level", "n_agents", "dim")
LEVEL_OPTIONAL_KEYS = tuple(
    c for c in METADATA_COLUMNS if c not in ("test_id", "env_id", "n_agents", "n_envs_run", "seed")
)


def _given_levels(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The levels a caller gave, completed as the presets' levels are; a clear error for a bad one."""
    if not levels:
        raise ValueError("levels is empty: give at least one level")
    entries, seen = [], set()
    for index, spec in enumerate(levels):
        missing = [key for key in LEVEL_REQUIRED_KEYS if key not in spec]
        unknown = sorted(set(spec) - set(LEVEL_REQUIRED_KEYS) - set(LEVEL_OPTIONAL_KEYS))
        if missing or unknown:
            raise ValueError(
                f"level {index} ({spec!r}): missing {missing}, unknown {unknown}; a level names "
                f"{list(LEVEL_REQUIRED_KEYS)} and may set {list(LEVEL_OPTIONAL_KEYS)}"
            )
        where = (spec["test"], spec["level"])
        if where in seen:
            raise ValueError(f"level {index}: Test_{where[0]}/Level_{where[1]} is given twice")
        seen.add(where)
        entries.append(_env(**spec))
    return entries


DEFAULT_PRESET = "debug"
DEFAULT_SEED = 42
GENERATE_OPTIONS = ("preset", "seed", "overwrite")  # the `arbiter generate` options this generator reads


def _derived_seed(seed: int, test: int, level: int, attempt: int) -> int:
    """Seed for one env attempt; independent of the order envs are generated in and of other presets."""
    base = int(np.random.SeedSequence([seed, test, level]).generate_state(1)[0])
    return (base + attempt) % 2**31


def _generate_env(params: dict[str, Any], seed: int) -> tuple[Any, int]:
    """Generate one env, re-drawing the seed until flatland produces what was asked for.

    Returns the env and the seed actually used (recorded in metadata.csv so the env can be reproduced).
    """
    # flatland's generator pulls in matplotlib: imported only when a test set is generated, so that
    # the command line starts fast for every format (it imports this module for its presets).
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.env_generation.env_generator import env_generator

    gen_kwargs = {k: v for k, v in params.items() if k not in ("test", "level")}
    problems: list[str] = []
    for attempt in range(MAX_TRIES):
        env_seed = _derived_seed(seed, params["test"], params["level"], attempt)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                env, _, _ = env_generator(**gen_kwargs, seed=env_seed, obs_builder_object=DummyObservationBuilder())
            except Exception as exc:  # flatland raises assorted errors on unlucky seeds
                problems.append(f"seed {env_seed}: {type(exc).__name__}: {exc}")
                continue
        messages = [str(w.message) for w in caught]
        city_failures = [m for m in messages if "Could not set all required cities" in m]
        if city_failures:
            problems.append(f"seed {env_seed}: {city_failures[0]}")
        elif len(env.agents) != params["n_agents"]:
            problems.append(f"seed {env_seed}: got {len(env.agents)} agents, wanted {params['n_agents']}")
        else:
            if attempt:
                logger.debug(
                    "Test_%s/Level_%s needed %d retries: %s", params["test"], params["level"], attempt, problems
                )
            return env, env_seed
    raise RuntimeError(
        f"could not generate Test_{params['test']}/Level_{params['level']} in {MAX_TRIES} tries: {problems[-3:]}"
    )


def _metadata_row(params: dict[str, Any], env_seed: int) -> dict[str, Any]:
    row = {k: params[k] for k in METADATA_COLUMNS if k in params}
    row.update(
        test_id=f"Test_{params['test']}",
        env_id=f"Level_{params['level']}",
        n_envs_run=1,
        seed=env_seed,
        speed_ratios=str(params["speed_ratios"]),
    )
    return row


def generate_test_set(
    out_dir: str | os.PathLike[str],
    preset: str = "debug",
    seed: int = 42,
    overwrite: bool = False,
    *,
    levels: list[dict[str, Any]] | None = None,
) -> list[str]:
    """Write ``preset`` as a flatland test folder at ``out_dir``; return the env paths in (test, level) order.

    ``levels`` replaces the preset with levels of the caller's own: each a dict naming
    ``LEVEL_REQUIRED_KEYS`` (``dim`` is the side of a square grid) and setting any of
    ``LEVEL_OPTIONAL_KEYS``; what it leaves out is as in the presets. The same levels and seed always
    give the same envs. Refuses a non-empty ``out_dir`` unless ``overwrite`` so a typo cannot clobber
    a real test set.
    """
    if levels is None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    chosen = PRESETS[preset] if levels is None else _given_levels(levels)
    out = Path(out_dir)
    entries = sorted(chosen, key=lambda p: (p["test"], p["level"]))

    from flatland.envs.persistence import RailEnvPersister

    rows, rel_paths = [], []
    with folder_written_whole(out, overwrite=overwrite) as tmp:
        for params in entries:
            env, env_seed = _generate_env(params, seed)
            rel = f"Test_{params['test']}/Level_{params['level']}.pkl"
            (tmp / f"Test_{params['test']}").mkdir(exist_ok=True)
            RailEnvPersister.save(env, str(tmp / rel))
            rows.append(_metadata_row(params, env_seed))
            rel_paths.append(rel)
        with open(tmp / "metadata.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=METADATA_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    source = f"preset {preset!r}" if levels is None else "the levels given"
    logger.info("generated %d envs of %s (seed %d) in %s", len(rel_paths), source, seed, out)
    return rel_paths


def cached_test_set(
    preset: str = "debug",
    seed: int = 42,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    levels: list[dict[str, Any]] | None = None,
) -> Path:
    """Return a folder holding ``preset`` (or ``levels``, as ``generate_test_set`` takes them),
    generating it on first use.

    The folder name includes the flatland version because pickles (and generator output) change between
    flatland releases, and for ``levels`` a digest of them. Concurrent callers each generate into their
    own temp folder; the first rename wins and the others discard their copy, so no lock is needed.
    """
    root = Path(cache_dir or os.environ.get("ARBITER_CACHE_DIR") or Path.home() / ".cache" / "arbiter")
    if levels is not None:
        digest = hashlib.sha256(json.dumps(levels, sort_keys=True).encode()).hexdigest()[:12]
        preset = f"levels{len(levels)}-{digest}"
    target = root / f"tests-{preset}-seed{seed}-flatland{version('flatland-rl')}"
    if (target / "metadata.csv").is_file():  # only ever appears via the final rename, so it is complete
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}.gen-"))
    try:
        if levels is not None:
            generate_test_set(tmp / "set", seed=seed, levels=levels)
        else:
            generate_test_set(tmp / "set", preset=preset, seed=seed)
        try:
            os.rename(tmp / "set", target)
        except OSError:
            if not (target / "metadata.csv").is_file():
                raise
            logger.debug("another process cached %s first; discarding ours", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def list_env_paths(tests_dir: str | os.PathLike[str]) -> list[str]:
    """Relative ``Test_<t>/Level_<l>.pkl`` paths under ``tests_dir``, sorted numerically by (t, l).

    Numeric order matters: flatland's evaluator orders envs by ``test * 1000 + level``, so ``Level_10``
    comes after ``Level_9``, not after ``Level_1`` as a plain string sort would have it.
    """
    root = Path(tests_dir)
    found: list[tuple[int, int, str]] = []
    if root.is_dir():
        for test_dir in root.iterdir():
            test_match = _TEST_RE.match(test_dir.name)
            if not test_match or not test_dir.is_dir():
                continue
            for env_file in test_dir.iterdir():
                level_match = _LEVEL_RE.match(env_file.name)
                if level_match and env_file.is_file():
                    found.append((int(test_match[1]), int(level_match[1]), f"{test_dir.name}/{env_file.name}"))
    if not found:
        raise ValueError(f"no Test_<t>/Level_<l>.pkl envs found under {root}")
    return [rel for _, _, rel in sorted(found)]


def write_test_folder(out_dir: str, options: dict[str, Any]) -> str:
    """The ``generate`` hook: a test folder from ``arbiter generate``'s options (preset, seed,
    overwrite; None where not given); the line saying what was written."""

    given = [name for name, value in options.items() if value is not None and value is not False]
    foreign = sorted(name for name in given if name not in GENERATE_OPTIONS)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ConfigError(f"the flatland generator takes --preset, --seed and --overwrite, not {flags}")
    preset = options.get("preset") or DEFAULT_PRESET
    seed = DEFAULT_SEED if options.get("seed") is None else options["seed"]
    paths = generate_test_set(out_dir, preset=preset, seed=seed, overwrite=bool(options.get("overwrite")))
    return f"wrote {plural(len(paths), 'env')} and metadata.csv to {out_dir}"


def debug_test_set() -> str:
    """The ``default_tests`` hook: the debug preset with the default seed, generated once into the cache."""
    return str(cached_test_set(DEFAULT_PRESET, DEFAULT_SEED))
