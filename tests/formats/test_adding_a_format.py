"""docs/adding-a-format.md stays true: its format, competition file and agent are taken from the
page as they are written there, the format is registered and checked, and an evaluation of it
runs end to end (a real redis-server, the evaluator serving in this process, the page's
``RemoteEnv`` agent) to the score this file computes on its own."""

from __future__ import annotations

import csv
import math
import re
import sys
import tomllib
import types
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


def test_a_format_registers_under_its_own_name_only(guess_module):
    with pytest.raises(ConfigError, match="its FORMAT is named 'guess'"):
        register_format("guessing", guess_module)
    with pytest.raises(ConfigError, match="one of arbiter's own"):
        register_format("flatland", get_format("flatland"))


def test_the_pages_competition_and_agent_play_it_end_to_end(guess_module, redis_url, service_id, tmp_path, monkeypatch):
    competition = tomllib.loads(block_with("toml", 'format = "guess"'))
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
    seeds = [reset_seed(competition["seed"], game) for game in range(options.games)]
    guesses = [binary_search_guesses(secret(seed, options.size), options.size) for seed in seeds]
    assert summary["state"] == "SUCCESS" and summary["items"]["ended"] == {"finished": options.games}
    assert [(r["game"], r["seed"], r["steps"], r["return"]) for r in records] == [
        (game, seeds[game], guesses[game], 1.0) for game in range(options.games)
    ]
    score = summary["score"]
    assert (score["primary"], score["secondary"]) == (1.0, pytest.approx(math.fsum(guesses) / len(guesses)))
    with open(Path(results) / "results.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["game", "seed", "steps", "return", "ended"]
    assert [int(row["steps"]) for row in rows] == guesses


def installed_package(site: Path) -> None:
    """The page's package as an install leaves it on the path: its module, and a dist-info whose
    entry points are the ones its pyproject.toml declares (what pip writes, without a build)."""
    project = tomllib.loads(block_with("toml", "[project.entry-points"))
    site.mkdir()
    (site / "guess_format.py").write_text(block_with("python", "FORMAT = Format("), encoding="utf-8")
    dist_info = site / f"{project['project']['name'].replace('-', '_')}-{project['project']['version']}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['project']['name']}\nVersion: {project['project']['version']}\n"
    )
    groups = project["project"]["entry-points"]
    (dist_info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) for group, entries in groups.items()
        )
    )


def test_an_installed_format_is_known_to_every_command(tmp_path):
    """The page's package installed: `arbiter run` with the page's competition file and agent,
    then `arbiter rescore` and `arbiter leaderboard` over the results, with no launcher."""
    import json
    import os
    import subprocess

    installed_package(tmp_path / "site")
    (tmp_path / "guess.toml").write_text(block_with("toml", 'format = "guess"'), encoding="utf-8")
    (tmp_path / "guess_agent.py").write_text(block_with("python", "RemoteEnv("), encoding="utf-8")
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    arbiter = [sys.executable, "-m", "arbiter.server.cli"]
    results = tmp_path / "root" / "guess" / "first"

    def command(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*arbiter, *argv], cwd=tmp_path, env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    ran = command("run", "--competition", "guess.toml", "--results", str(results), "--participant", "ada",
                  "--", sys.executable, "guess_agent.py")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "arbiter: evaluating 20 games (guess)" in ran.stderr  # its nouns; no source named, none said
    summary = json.loads((results / "summary.json").read_text())
    assert (summary["state"], summary["format"], summary["score"]["primary"]) == ("SUCCESS", "guess", 1.0)
    rescored = command("rescore", str(results))
    assert rescored.returncode == 0, rescored.stdout + rescored.stderr
    board = command("leaderboard", "--results-root", str(tmp_path / "root"), "--competition", "guess.toml", "--json")
    assert board.returncode == 0, board.stderr
    assert [row["participant"] for row in json.loads(board.stdout)["rows"]] == ["ada"]


def test_an_unknown_format_says_how_one_joins(tmp_path):
    with pytest.raises(ConfigError, match="joins by an 'arbiter.formats' entry point of its installed package"):
        get_format("no-such-format")
