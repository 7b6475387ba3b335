"""The seed an evaluation resets with, and the test folder it plays, kept in its results folder
for a resume.

The seed: ``arbiter run`` (the participant's own machine) resets with the competition's seed, so
a local run reproduces exactly. A hosted evaluation (``arbiter serve``) of a format whose env
lives on the server resets with a seed drawn at its start and known to the server only
(``persisted_seed``), unless the organiser fixes one: a ``seed`` key in their own competition
file, ``--set seed=`` or ``--seed``. A shipped preset's seed is public, so it fixes nothing.
Either way the seed goes into the results folder's ``seed.json`` before anything is played
(``record_seed`` for a local run, ``persisted_seed`` for a hosted one), so ``arbiter serve
--resume`` resets with the seeds the evaluation started with. With the seed goes the test folder
the evaluation plays (absolute, or null for a format that reads none), so that ``serve --resume``
given no ``--tests`` plays the folder it started on: for a local run on the format's default test
set, a cache folder the participant never typed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.core.folder_digest import short
from arbiter.server.formats import get_format
from arbiter.server.service.durable import atomic_write

SEED_FILE = "seed.json"  # in the results folder: the seed and test folder the evaluation started with
# Which formats keep their seed secret is theirs to say (Format.secret_seed): it is worth keeping
# where the env lives on the server, seeded by the competition seed. Flatland's protocol hands
# every reset's seed to the client, which rebuilds the env with it (a drawn seed would hide
# nothing, and flatland-rl's evaluator uses 1001); MetaLC's runs are seeded as the challenge
# seeded them, whatever the competition's seed.
# Bits of a drawn seed: every reset's seed is derived from it (numpy's SeedSequence), and the
# episodes reveal theirs once over; too many bits to find the drawn one from them by search.
DRAWN_SEED_BITS = 64


def seed_file(results_dir: str) -> str:
    return os.path.join(results_dir, SEED_FILE)


def read_persisted_seed(results_dir: str) -> dict[str, Any] | None:
    """What ``persisted_seed`` wrote in a results folder (``{"seed", "drawn"}``), or None."""
    path = seed_file(results_dir)
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}): it holds the seed this evaluation started with") from None
    seed = found.get("seed") if isinstance(found, dict) else None
    if not isinstance(found, dict) or "seed" not in found or not (seed is None or type(seed) is int):
        raise ConfigError(f"{path} holds no seed; it should name the seed this evaluation started with")
    return found


def recorded_tests(results_dir: str) -> str | None:
    """The test folder the evaluation in ``results_dir`` started on, as ``seed.json`` names it;
    None when there is no ``seed.json`` or it names none (a format that reads no tests)."""
    found = read_persisted_seed(results_dir)
    tests = found.get("tests") if found else None
    return tests if isinstance(tests, str) and tests else None


def record_seed(
    results_dir: str, spec: CompetitionSpec, tests: str | None = None, tests_digest: str | None = None
) -> None:
    """A fresh evaluation's seed and test folder, kept in its results folder so that ``serve
    --resume`` resets with the one and plays the other (``persisted_seed`` and ``recorded_tests``
    read them back): a local run's, whose seed is no secret, the way a hosted evaluation's were
    written before it started (left as they are when they are the same). ``tests_digest``: what
    the folder holds (folder_digest.py), which a resume checks (``refuse_changed_tests``)."""
    try:
        found = read_persisted_seed(results_dir)
    except ConfigError:  # unreadable: an earlier evaluation's, replaced with this one's
        found = None
    if (
        found is None
        or found["seed"] != spec.seed
        or found.get("tests") != _absolute(tests)
        or found.get("tests_digest") != tests_digest
    ):
        drawn = bool(found and found["seed"] == spec.seed and found["drawn"])
        _write_seed_file(results_dir, spec.seed, drawn=drawn, tests=tests, tests_digest=tests_digest)


def refuse_changed_tests(results_dir: str, tests_digest: str | None) -> None:
    """A resume plays the rest of the test set its evaluation started on: a folder whose
    contents changed since (regenerated, edited, another one at the same path) is refused, as
    its remaining episodes would not be that evaluation's. Folders from before the digest was
    recorded are not checked."""
    try:
        found = read_persisted_seed(results_dir)
    except ConfigError:
        return
    recorded = found.get("tests_digest") if found else None
    if isinstance(recorded, str) and tests_digest is not None and recorded != tests_digest:
        raise ConfigError(
            f"the test folder's contents changed since the evaluation in {results_dir} started (its files' digest "
            f"was {short(recorded)}, it is {short(tests_digest)} now): resume on the test set it started on, or "
            "start a new evaluation"
        )


def _absolute(tests: str | None) -> str | None:
    return os.path.abspath(tests) if tests else None


def _write_seed_file(
    results_dir: str, seed: int | None, *, drawn: bool, tests: str | None, tests_digest: str | None = None
) -> None:
    """Durably: a temporary file written and fsynced, renamed over the old one, the folder fsynced."""
    os.makedirs(results_dir, exist_ok=True)
    record: dict[str, Any] = {"seed": seed, "drawn": drawn, "tests": _absolute(tests)}
    if tests_digest is not None:
        record["tests_digest"] = tests_digest
    atomic_write(seed_file(results_dir), json.dumps(record) + "\n", sync_folder=True)


def persisted_seed(
    results_dir: str, spec: CompetitionSpec, *, resume: bool, hosted: bool, tests: str | None = None
) -> CompetitionSpec:
    """The spec with the seed the evaluation in ``results_dir`` resets with.

    Not hosted (``arbiter run``): the spec's seed, as it is. Hosted (``arbiter serve``): a fresh
    evaluation of a format whose seed is secret (``Format.secret_seed``) draws a seed unless the spec's is fixed,
    and every hosted evaluation writes its seed, with ``tests``, to the results folder before it
    starts (the participant never sees it; the summary records it at the end). A resumed one reads
    it back, so it resets with the seeds it started with."""
    if not hosted:
        return spec
    if resume:
        found = read_persisted_seed(results_dir)
        if found is not None:
            if spec.seed_fixed and spec.seed != found["seed"]:
                raise ConfigError(
                    "the seed given for this evaluation differs from the one it started with "
                    f"({seed_file(results_dir)}); resume it without a seed, or with that one"
                )
            return dataclasses.replace(spec, seed=found["seed"], seed_fixed=True)
        if not spec.seed_fixed and get_format(spec.format).secret_seed and _has_records(results_dir):
            raise ConfigError(
                f"{results_dir} holds episodes but not the seed they were played with ({SEED_FILE}); "
                "give it with --seed N to resume"
            )
    drawn = not spec.seed_fixed and get_format(spec.format).secret_seed
    seed = secrets.randbits(DRAWN_SEED_BITS) if drawn else spec.seed
    _write_seed_file(results_dir, seed, drawn=drawn, tests=tests)
    return dataclasses.replace(spec, seed=seed, seed_fixed=True)


def _has_records(results_dir: str) -> bool:
    episodes = os.path.join(results_dir, "episodes.jsonl")
    return os.path.exists(episodes) and os.path.getsize(episodes) > 0
