"""Tests for arbiter.server.formats.flatland.generate (deterministic Flatland test-folder generation)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
from flatland.envs.persistence import RailEnvPersister

from arbiter.server.formats.flatland import generate as testsets
from arbiter.server.formats.flatland.generate import (
    METADATA_COLUMNS,
    PRESETS,
    cached_test_set,
    generate_test_set,
    list_env_paths,
)


def _fingerprint(env_file: Path) -> tuple[bytes, list[tuple]]:
    """Grid bytes plus each agent's initial configuration and targets: what makes two envs 'the same'."""
    env, _ = RailEnvPersister.load_new(str(env_file))
    agents = [
        (a.initial_configuration, tuple(sorted(a.targets)), a.earliest_departure, a.latest_arrival) for a in env.agents
    ]
    return np.asarray(env.rail.grid).tobytes(), agents


def _read_metadata(folder: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(folder / "metadata.csv", newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("gen") / "tiny"
    return out, generate_test_set(out, preset="tiny", seed=42)


def test_presets_shape() -> None:
    debug = PRESETS["debug"]
    assert len(debug) == 8
    assert sorted({p["test"] for p in debug}) == [0, 1]
    assert all(2 <= p["n_agents"] <= 8 and 25 <= p["x_dim"] <= 35 and p["n_cities"] == 2 for p in debug)
    assert all(p["malfunction_interval"] > 0 for p in debug)
    assert [p["n_agents"] for p in PRESETS["tiny"]] == [2, 2, 2]


def test_layout_and_metadata(tiny_set: tuple[Path, list[str]]) -> None:
    out, rel_paths = tiny_set
    assert rel_paths == ["Test_0/Level_0.pkl", "Test_0/Level_1.pkl", "Test_0/Level_2.pkl"]
    assert list_env_paths(out) == rel_paths
    assert sorted(p.name for p in out.iterdir()) == ["Test_0", "metadata.csv"]
    # no temp leftovers next to the output folder
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]

    columns, rows = _read_metadata(out)
    assert columns == METADATA_COLUMNS
    assert [r["test_id"] + "/" + r["env_id"] + ".pkl" for r in rows] == rel_paths
    for row, rel in zip(rows, rel_paths, strict=True):
        env, _ = RailEnvPersister.load_new(str(out / rel))
        assert int(row["n_agents"]) == len(env.agents) == 2
        assert (int(row["x_dim"]), int(row["y_dim"])) == (env.width, env.height) == (25, 25)
        assert row["n_envs_run"] == "1"
        assert int(row["seed"]) >= 0
        assert row["speed_ratios"] == "{1.0: 0.25, 0.5: 0.25, 0.33: 0.25, 0.25: 0.25}"


def test_envs_load_and_reset(tiny_set: tuple[Path, list[str]]) -> None:
    out, rel_paths = tiny_set
    for rel in rel_paths:
        env, _ = RailEnvPersister.load_new(str(out / rel))
        env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=1001)
        assert len(env.agents) == 2
        env.step({h: 2 for h in env.get_agent_handles()})


def test_determinism(tiny_set: tuple[Path, list[str]], tmp_path: Path) -> None:
    out, rel_paths = tiny_set
    again = tmp_path / "again"
    assert generate_test_set(again, preset="tiny", seed=42) == rel_paths
    assert _read_metadata(again) == _read_metadata(out)
    for rel in rel_paths:
        assert _fingerprint(again / rel) == _fingerprint(out / rel)

    other = tmp_path / "other"
    generate_test_set(other, preset="tiny", seed=7)
    assert [_fingerprint(other / rel) for rel in rel_paths] != [_fingerprint(out / rel) for rel in rel_paths]


def test_envs_within_a_set_differ(tiny_set: tuple[Path, list[str]]) -> None:
    out, rel_paths = tiny_set
    grids = {_fingerprint(out / rel)[0] for rel in rel_paths}
    assert len(grids) == len(rel_paths)


def test_refuses_non_empty_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="overwrite"):
        generate_test_set(out, preset="tiny")
    assert (out / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]

    generate_test_set(out, preset="tiny", overwrite=True)
    assert not (out / "keep.txt").exists()
    assert len(list_env_paths(out)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_empty_out_dir_is_accepted(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert len(generate_test_set(out, preset="tiny")) == 3


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        generate_test_set(tmp_path / "x", preset="nope")


def test_levels_given_explicitly(tiny_set: tuple[Path, list[str]], tmp_path: Path) -> None:
    out, rel_paths = tiny_set
    # the tiny preset's last level, given by hand: the same env, as the seed depends on (test, level) only
    given = tmp_path / "given"
    level = {"test": 0, "level": 2, "n_agents": 2, "dim": 25, "malfunction_interval": 250}
    assert generate_test_set(given, seed=42, levels=[level]) == [rel_paths[2]]
    assert _fingerprint(given / rel_paths[2]) == _fingerprint(out / rel_paths[2])
    assert _read_metadata(given)[1] == _read_metadata(out)[1][2:]

    bad_levels = {
        "levels is empty": [],
        r"missing \['n_agents'\]": [{"test": 0, "level": 0, "dim": 25}],
        r"unknown \['citys'\]": [{**level, "citys": 3}],
        "given twice": [level, level],
    }
    for message, bad in bad_levels.items():
        with pytest.raises(ValueError, match=message):
            generate_test_set(tmp_path / "bad", levels=bad)
        assert not (tmp_path / "bad").exists()


def test_failed_attempts_are_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flatland.env_generation.env_generator as flatland_generator  # where testsets imports it from, when used

    real = flatland_generator.env_generator
    calls: list[int] = []

    def flaky(**kwargs):
        calls.append(kwargs["seed"])
        if len(calls) == 1:
            raise ValueError("unlucky seed")
        return real(**kwargs)

    monkeypatch.setattr(flatland_generator, "env_generator", flaky)
    monkeypatch.setitem(PRESETS, "one", PRESETS["tiny"][:1])
    generate_test_set(tmp_path / "one", preset="one", seed=42)
    _, rows = _read_metadata(tmp_path / "one")
    assert int(rows[0]["seed"]) == calls[-1] != calls[0]


def test_list_env_paths_numeric_order(tmp_path: Path) -> None:
    for rel in [
        "Test_10/Level_0.pkl",
        "Test_2/Level_10.pkl",
        "Test_2/Level_2.pkl",
        "Test_2/Level_9.pkl",
        "Test_2/notes.txt",
        "Test_2/Level_x.pkl",
        "Other/Level_1.pkl",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    assert list_env_paths(tmp_path) == [
        "Test_2/Level_2.pkl",
        "Test_2/Level_9.pkl",
        "Test_2/Level_10.pkl",
        "Test_10/Level_0.pkl",
    ]


def test_list_env_paths_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Test_"):
        list_env_paths(tmp_path)
    with pytest.raises(ValueError, match="no Test_"):
        list_env_paths(tmp_path / "missing")


def test_cached_test_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = cached_test_set("tiny", seed=3, cache_dir=tmp_path)
    assert first.parent == tmp_path
    assert first.name.startswith("tests-tiny-seed3-flatland")
    assert len(list_env_paths(first)) == 3
    mtimes = {p: p.stat().st_mtime_ns for p in first.rglob("*")}

    def boom(*args, **kwargs):
        raise AssertionError("cached set must not be regenerated")

    monkeypatch.setattr(testsets, "generate_test_set", boom)
    assert cached_test_set("tiny", seed=3, cache_dir=tmp_path) == first
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == mtimes
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_cached_test_set_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBITER_CACHE_DIR", str(tmp_path / "cache"))
    path = cached_test_set("tiny", seed=5)
    assert path.parent == tmp_path / "cache"


def test_cached_test_set_lost_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If another process renames its copy into place first, ours is discarded and theirs is used."""
    winner = cached_test_set("tiny", seed=3, cache_dir=tmp_path / "a")
    target = tmp_path / "b" / winner.name
    real_generate = testsets.generate_test_set

    def generate_then_lose(out_dir, **kwargs):
        result = real_generate(out_dir, **kwargs)
        os.makedirs(target.parent, exist_ok=True)
        real_generate(target, **kwargs)  # the "other process" finishes first
        return result

    monkeypatch.setattr(testsets, "generate_test_set", generate_then_lose)
    assert cached_test_set("tiny", seed=3, cache_dir=tmp_path / "b") == target
    assert [p.name for p in target.parent.iterdir()] == [target.name]
