"""docs/adding-a-format.md stays true: its format, competition file and agent are taken from the
page as they are written there, the format is registered and checked, and an evaluation of it
runs end to end (a real redis-server, the evaluator serving in this process, the page's
``RemoteEnv`` agent) to the score this file computes on its own. Its package is built from the
page's pyproject.toml as pip builds it, in a folder that holds the page's other files too, and
installed, every ``arbiter`` command then knows the format."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tomllib
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paths
import pytest
from gymnasium.utils import seeding
from harness import finish, read_episodes, running_service

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.formats import check_format, get_format, register_format
from arbiter.server.formats.base import reset_seed

PAGE = Path(paths.REPO) / "docs" / "adding-a-format.md"
FIGURES = [("solved", "higher"), ("guesses", "lower")]  # the page's rule: fewer guesses are better


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)


def block_with(language: str, marker: str) -> str:
    found = [b for b in blocks(language) if marker in b]
    assert len(found) == 1, f"the page has {len(found)} {language} blocks with {marker!r}"
    return found[0]


@pytest.fixture(scope="module")
def guess_module() -> Iterator[types.ModuleType]:
    """The page's format, as a module of its own."""
    module = types.ModuleType("guess_format")
    sys.modules[module.__name__] = module  # dataclasses resolve the module's annotations through it
    try:
        exec(compile(block_with("python", "FORMAT = Format("), str(PAGE), "exec"), module.__dict__)
        register_format("guess", module)
        yield module
    finally:
        del sys.modules[module.__name__]


def secret(seed: int | None, size: int) -> int:
    """The number a game hides: what Gymnasium's generator for the game's seed draws first."""
    return int(seeding.np_random(seed)[0].integers(size))


def binary_search_guesses(hidden: int, size: int) -> int:
    low, high, guesses = 0, size - 1, 0
    while True:
        guesses += 1
        guess = (low + high) // 2
        if guess == hidden:
            return guesses
        low, high = (guess + 1, high) if hidden > guess else (low, guess - 1)


def test_the_pages_format_registers_and_keeps_the_contract(guess_module):
    assert get_format("guess") is guess_module.FORMAT
    report = check_format("guess", spec_from_dict("guess", {"format": "guess", "games": 3}))
    assert report.items == 3 and [r["game"] for r in report.records] == [0, 1, 2]
    # a game ends solved, or after the default 8 wrong guesses
    assert all(r["ended"] == "finished" and (r["return"] == 1.0 or r["steps"] == 8) for r in report.records)
    assert report.score["primary_name"] == "fraction of games solved"
    figures = guess_module.SolveRate(None).figures(report.records, report.score)
    assert [(f["name"], f["direction"]) for f in figures] == FIGURES
    assert guess_module.FORMAT.secret_seed  # its secrets derive from the seed: a hosted one is drawn


def test_a_format_registers_under_its_own_name_only(guess_module):
    with pytest.raises(ConfigError, match="its FORMAT is named 'guess'"):
        register_format("guessing", guess_module)
    with pytest.raises(ConfigError, match="one of arbiter's own"):
        register_format("flatland", get_format("flatland"))


def test_the_pages_competition_and_agent_play_it_end_to_end(guess_module, redis_url, service_id, tmp_path, monkeypatch):
    competition = tomllib.loads(block_with("toml", 'format = "guess"'))
    assert "seed" not in competition  # published as it is, a seed would give every secret away
    spec = spec_from_dict("guess", competition)
    options = spec.options
    agent = block_with("python", "RemoteEnv(")
    monkeypatch.setenv("ARBITER_REDIS_URL", redis_url)  # as `arbiter run` gives them to its agent
    monkeypatch.setenv("AICROWD_SUBMISSION_ID", service_id)
    results = str(tmp_path / "results")
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (_, outcome):
        scope: dict[str, Any] = {}
        exec(compile(agent, str(PAGE), "exec"), scope)
        scope["env"].close()
        summary = finish(outcome)
    records = read_episodes(results)
    seeds = [reset_seed(spec.seed, game) for game in range(options.games)]
    guesses = [binary_search_guesses(secret(seed, options.size), options.size) for seed in seeds]
    assert summary["state"] == "SUCCESS" and summary["items"]["ended"] == {"finished": options.games}
    assert [(r["game"], r["seed"], r["steps"], r["return"]) for r in records] == [
        (game, seeds[game], guesses[game], 1.0) for game in range(options.games)
    ]
    score = summary["score"]
    assert (score["primary"], score["secondary"]) == (1.0, pytest.approx(math.fsum(guesses) / len(guesses)))
    assert [(f["name"], f["direction"]) for f in summary["leaderboard"]["figures"]] == FIGURES
    with open(Path(results) / "results.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["game", "seed", "steps", "return", "ended"]
    assert [int(row["steps"]) for row in rows] == guesses


# An agent that solves every game too, with a guess more than binary search takes (its first is
# the largest number): on a board that ranks fewer guesses first, below the page's agent.
WASTEFUL_AGENT = """
from arbiter.client import RemoteEnv

env = RemoteEnv()
while True:
    hint, info = env.reset()
    if env.finished:
        break
    low, high, done, first = 0, env.action_space.n - 1, False, True
    while not done:
        guess = high if first else (low + high) // 2
        first = False
        hint, reward, terminated, truncated, info = env.step(guess)
        low, high = (guess + 1, high) if hint == 2 else (low, guess - 1)
        done = terminated or truncated
env.submit()
"""


def can_build_wheels() -> bool:
    """Whether setuptools can build a wheel here without fetching anything: it builds them itself
    from 70.1 on, with the ``wheel`` package before."""
    return importlib.util.find_spec("setuptools") is not None and (
        importlib.util.find_spec("wheel") is not None
        or importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
    )


def installed_package(folder: Path, site: Path) -> None:
    """The page's package built as pip builds it, from a folder holding the page's files (its
    pyproject.toml beside the format, the agent and the competition file), and installed in
    ``site`` as pip installs a wheel: unpacked."""
    if not can_build_wheels():
        pytest.skip("setuptools cannot build a wheel here (the dev extra has setuptools and wheel)")
    folder.mkdir()
    (folder / "pyproject.toml").write_text(block_with("toml", "[project.entry-points"), encoding="utf-8")
    (folder / "guess_format.py").write_text(block_with("python", "FORMAT = Format("), encoding="utf-8")
    (folder / "guess_agent.py").write_text(block_with("python", "RemoteEnv("), encoding="utf-8")
    (folder / "serve_guess.py").write_text(block_with("python", "raise SystemExit(main())"), encoding="utf-8")
    (folder / "guess.toml").write_text(block_with("toml", 'format = "guess"'), encoding="utf-8")
    wheels = folder / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", str(wheels), str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(entry_points).decode()
        archive.extractall(site)
    assert sorted(name for name in names if ".dist-info/" not in name) == ["guess_format.py"], names
    assert "[arbiter.formats]\nguess = guess_format\n" in declared, declared


def test_an_installed_format_is_known_to_every_command(tmp_path):
    """The page's package installed: `arbiter run` with the page's competition file and agent,
    then `arbiter rescore` and `arbiter leaderboard` over the results, with no launcher. The
    board ranks the page's agent above one that solves every game with more guesses."""
    installed_package(tmp_path / "guess", tmp_path / "site")
    (tmp_path / "guess.toml").write_text(block_with("toml", 'format = "guess"'), encoding="utf-8")
    (tmp_path / "guess_agent.py").write_text(block_with("python", "RemoteEnv("), encoding="utf-8")
    (tmp_path / "wasteful_agent.py").write_text(WASTEFUL_AGENT, encoding="utf-8")
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    arbiter = [sys.executable, "-m", "arbiter.server.cli"]
    root = tmp_path / "root" / "guess"

    def command(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*arbiter, *argv], cwd=tmp_path, env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    summaries = {}
    for participant, agent in (("ada", "guess_agent.py"), ("bob", "wasteful_agent.py")):
        results = root / participant
        ran = command("run", "--competition", "guess.toml", "--results", str(results), "--participant", participant,
                      "--", sys.executable, agent)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert "arbiter: evaluating 20 games (guess)" in ran.stderr  # its nouns; no source named, none said
        summaries[participant] = summary = json.loads((results / "summary.json").read_text())
        assert (summary["state"], summary["format"], summary["score"]["primary"]) == ("SUCCESS", "guess", 1.0)
        assert [(f["name"], f["direction"]) for f in summary["leaderboard"]["figures"]] == FIGURES
        rescored = command("rescore", str(results))
        assert rescored.returncode == 0, rescored.stdout + rescored.stderr
    assert summaries["ada"]["score"]["secondary"] < summaries["bob"]["score"]["secondary"]
    board = command("leaderboard", "--results-root", str(tmp_path / "root"), "--competition", "guess.toml", "--json")
    assert board.returncode == 0, board.stderr
    built = json.loads(board.stdout)
    assert [(c["name"], c["direction"]) for c in built["columns"]] == FIGURES
    assert [row["participant"] for row in built["rows"]] == ["ada", "bob"]  # fewer guesses first


def test_an_unknown_format_says_how_one_joins(tmp_path):
    with pytest.raises(ConfigError, match="joins by an 'arbiter.formats' entry point of its installed package"):
        get_format("no-such-format")
