"""Seeds the agent cannot know. A running episode's seed is never in a reply (only the step that
ends the episode names it), and a hosted evaluation (`arbiter serve`) resets with a seed it
draws at its start, keeps in its results folder and reads back on --resume, unless the organiser
fixes one. `arbiter run` keeps the competition's seed (the participant's own run).

The hosted case runs `arbiter serve` as a real process against the session's redis-server, with
an agent on RemoteEnv that records every reply it gets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import paths
import pytest
from harness import read_episodes, read_summary, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import resolve_spec
from arbiter.server.core.competition import load_competition, preset_paths
from arbiter.server.core.seeds import SEED_FILE, persisted_seed, read_persisted_seed
from arbiter.server.formats.base import reset_seed

REPO = str(paths.REPO)
PRESET_SEED = 1001  # every shipped preset's: public

# FrozenLake with slips: where a known seed is worth most (it fixes every slip of the episode).
FROZEN_LAKE = """
format = "two-phase"
env_id = "FrozenLake-v1"
env_kwargs = { is_slippery = true }
reward_per_step = [0.0, 1.0]
worst_return = 0.0
num_episodes = 2

[phase2]
max_steps = 60
goal_reward = 1.0
stability_window = 1
num_runs = 1
step_s = 5.0
planning_s = 5.0
run_budget_s = 60.0

[budgets]
step_s = 5.0
planning_s = 5.0
idle_s = 20.0
overall_s = 120.0
"""


def own_competition(tmp_path: Path, text: str = FROZEN_LAKE, name: str = "lake.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- who chose the seed ------------------------------------------------------------------------


def test_a_shipped_presets_seed_is_public_and_the_organisers_own_is_fixed(tmp_path):
    preset = load_competition("two-phase-cartpole")
    assert preset.seed == PRESET_SEED and preset.seed_fixed is False
    assert load_competition(preset_paths()["two-phase-cartpole"]).seed_fixed is False  # the same file by its path
    set_here = load_competition("two-phase-cartpole", ["seed=5"])
    assert set_here.seed == 5 and set_here.seed_fixed is True
    assert load_competition(own_competition(tmp_path)).seed_fixed is False  # no seed key: the default, public
    other_key = load_competition(own_competition(tmp_path), ["phase2.max_steps=80"])
    assert other_key.seed_fixed is False  # a --set of another key fixes no seed
    with_seed = own_competition(tmp_path, "seed = 12\n" + FROZEN_LAKE, "b.toml")
    assert (load_competition(with_seed).seed, load_competition(with_seed).seed_fixed) == (12, True)
    flag = resolve_spec(build_parser().parse_args(["serve", "--competition", "two-phase-cartpole", "--seed", "9"]))
    assert (flag.seed, flag.seed_fixed) == (9, True)


def test_a_seed_that_cannot_be_one_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="seed must be a whole number >= 0"):
        load_competition("two-phase-cartpole", ["seed=-3"])
    with pytest.raises(ConfigError, match="unknown keys"):  # where the seed came from is not a key
        load_competition(own_competition(tmp_path, "seed_fixed = true\n" + FROZEN_LAKE))


# -- persisted_seed: drawn, kept, read back ------------------------------------------------------


def test_a_hosted_evaluation_draws_its_seed_and_a_resumed_one_reads_it_back(tmp_path):
    spec = load_competition("two-phase-cartpole")
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    drawn = persisted_seed(first, spec, resume=False, hosted=True)
    assert drawn.seed != PRESET_SEED and drawn.seed >= 0
    assert read_persisted_seed(first) == {"seed": drawn.seed, "drawn": True, "tests": None}
    assert os.listdir(first) == [SEED_FILE]  # written through a temporary file, renamed: nothing else left
    assert persisted_seed(second, spec, resume=False, hosted=True).seed != drawn.seed
    resumed = persisted_seed(first, spec, resume=True, hosted=True)
    assert resumed.seed == drawn.seed
    same = persisted_seed(
        first, load_competition("two-phase-cartpole", [f"seed={drawn.seed}"]), resume=True, hosted=True
    )
    assert same.seed == drawn.seed
    with pytest.raises(ConfigError, match="differs from the one it started with"):
        persisted_seed(first, load_competition("two-phase-cartpole", ["seed=5"]), resume=True, hosted=True)
    assert read_persisted_seed(first)["seed"] == drawn.seed  # the refused resume changed nothing


def test_a_fixed_seed_a_local_run_and_flatland_keep_the_competitions_seed(tmp_path):
    fixed = load_competition("two-phase-cartpole", ["seed=5"])
    assert persisted_seed(str(tmp_path / "fixed"), fixed, resume=False, hosted=True).seed == 5
    assert read_persisted_seed(str(tmp_path / "fixed")) == {"seed": 5, "drawn": False, "tests": None}
    local = load_competition("two-phase-cartpole")
    assert persisted_seed(str(tmp_path / "local"), local, resume=False, hosted=False) is local
    assert not (tmp_path / "local").exists()  # arbiter run: the participant's own run, nothing to keep
    # Flatland's client rebuilds the env with every reset's seed: a drawn one would hide nothing.
    flatland = load_competition("flatland-debug")
    assert persisted_seed(str(tmp_path / "flatland"), flatland, resume=False, hosted=True).seed == PRESET_SEED


def test_a_resume_that_cannot_know_its_seed_is_refused_and_a_damaged_seed_file_is_reported(tmp_path):
    spec = load_competition("two-phase-cartpole")
    older = tmp_path / "older"  # played before its seed was kept: episodes, no seed file
    older.mkdir()
    (older / "episodes.jsonl").write_text('{"index": 0}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="not the seed they were played with.*--seed N"):
        persisted_seed(str(older), spec, resume=True, hosted=True)
    given = load_competition("two-phase-cartpole", ["seed=3"])
    assert (
        persisted_seed(str(older), given, resume=True, hosted=True).seed == 3 == read_persisted_seed(str(older))["seed"]
    )
    empty = tmp_path / "empty"  # nothing played yet: a seed is drawn as for a fresh start
    assert persisted_seed(str(empty), spec, resume=True, hosted=True).seed == read_persisted_seed(str(empty))["seed"]
    for damaged in ("{not json", '{"seed": "1001"}', "[1001]"):
        (empty / SEED_FILE).write_text(damaged, encoding="utf-8")
        with pytest.raises(ConfigError, match=SEED_FILE):
            persisted_seed(str(empty), spec, resume=True, hosted=True)


# -- a hosted evaluation end to end: nothing reveals a running episode's seed --------------------


def serve(competition: str, redis_url: str, service_id: str, results: Path, *, resume: bool) -> subprocess.Popen:
    """`arbiter serve`, returned once it has announced its start in events.jsonl (its stderr, the
    progress lines an operator sees, goes to serve.log)."""
    events = results / "events.jsonl"
    starts = events.read_text(encoding="utf-8").count('"event":"started"') if events.exists() else 0
    command = [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", competition,
               "--redis-url", redis_url, "--service-id", service_id, "--results", str(results)]  # fmt: skip
    with open(results.parent / "serve.log", "ab") as log:
        process = subprocess.Popen(command + (["--resume"] if resume else []), cwd=REPO, stdout=log, stderr=log)

    def started() -> bool:
        return events.exists() and events.read_text(encoding="utf-8").count('"event":"started"') > starts

    wait_for(lambda: started() or process.poll() is not None, timeout_s=60, what="arbiter serve to start")
    assert process.poll() is None, (results.parent / "serve.log").read_text()[-2000:]
    return process


def values_in(value: Any) -> list[Any]:
    """Every scalar of a reply, however nested (arrays element by element)."""
    if isinstance(value, dict):
        return [v for key, item in value.items() for v in [key, *values_in(item)]]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in values_in(item)]
    if isinstance(value, np.ndarray):
        return value.ravel().tolist()
    return [value]


class RecordingAgent:
    """Goes right, else down (FrozenLake's slips decide the rest), and keeps what every reply said."""

    def __init__(self, redis_url: str, service_id: str):
        self.env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=20)
        self.handshake = self.env.server_info
        self.resets: list[Any] = []  # (observation, info) of every reset
        self.episode_ends: list[dict[str, Any]] = []  # the extension of each step that ended an episode
        self.running_steps: list[dict[str, Any]] = []  # the extension of every other step

    def episode(self) -> None:
        observation, info = self.env.reset()
        self.resets.append((observation, info))
        done, step = False, 0
        while not done:
            observation, _, terminated, truncated, info = self.env.step(2 if step % 2 == 0 else 1)
            done, step = terminated or truncated, step + 1
            (self.episode_ends if done else self.running_steps).append(info["arbiter"])

    def train(self) -> None:
        try:
            while True:
                self.episode()
        except StopIteration:
            return


def test_a_hosted_evaluation_never_shows_a_running_episodes_seed_and_resumes_with_its_own(
    redis_url, service_id, tmp_path
):
    competition = own_competition(tmp_path)
    results = tmp_path / "results"
    evaluator = serve(competition, redis_url, service_id, results, resume=False)
    agents = []
    try:
        agents.append(RecordingAgent(redis_url, service_id))
        agents[0].env.begin_stage(agents[0].env.stages[0])
        for _ in range(2):
            agents[0].episode()  # phase 1
        wait_for(lambda: len(read_episodes(str(results), missing_ok=True)) == 2, what="phase 1's records")
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait(timeout=10)
        agents[0].env.close()
        evaluator = serve(competition, redis_url, service_id, results, resume=True)
        agents.append(RecordingAgent(redis_url, service_id))
        env = agents[1].env
        assert env.next_item == 2  # phase 2's training run
        env.begin_stage(env.stages[1])
        agents[1].train()
        env.begin_stage(env.stages[2])
        for _ in range(2):
            agents[1].episode()
        env.submit()
        env.close()
        assert evaluator.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()[-2000:]
    finally:
        if evaluator.poll() is None:
            evaluator.send_signal(signal.SIGKILL)
            evaluator.wait()
    kept = read_persisted_seed(str(results))
    seed = kept["seed"]
    assert kept["drawn"] is True and seed != PRESET_SEED  # no seed key in the file: drawn at the first start
    records = read_episodes(str(results))
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["counters"]["resumed"] == 1 and summary["seed"] == seed
    train = [r for r in records if r["stage"] == "train"]
    # Before the kill and after the resume: every reset's seed derives from the one drawn seed.
    assert [r["seed"] for r in records if r["phase"] == 1] == [reset_seed(seed, 1, i) for i in range(2)]
    assert [r["seed"] for r in train] == [reset_seed(seed, 2, 0, k) for k in range(len(train))]
    assert [r["seed"] for r in records if r["stage"] == "eval" and r["phase"] == 2] == [
        reset_seed(seed, 3, 0, i) for i in range(2)
    ]
    episode_seeds = {r["seed"] for r in records}
    secret = episode_seeds | {seed}
    for agent in agents:
        assert not secret & set(values_in(agent.handshake)), "the handshake names a seed"
        for observation, info in agent.resets:
            assert not secret & set(values_in([observation, info])), f"a reset reply names its seed: {info}"
        assert all("seed" not in ext for ext in agent.running_steps)
    ended = [ext["seed"] for agent in agents for ext in agent.episode_ends]
    played = [r["seed"] for r in records if r["steps"]]  # the step that ended each one named its seed
    assert ended == played
    # What an operator or a watcher reads while it runs never names the drawn seed.
    assert str(seed) not in (results / "events.jsonl").read_text(encoding="utf-8")
    assert str(seed) not in (tmp_path / "serve.log").read_text(encoding="utf-8")
    assert json.loads((results / SEED_FILE).read_text(encoding="utf-8"))["seed"] == seed


# -- DIAMBRA's in-process evaluation behaves as the server does ----------------------------------


def test_diambras_local_evaluation_names_a_seed_once_its_episode_is_over():
    pytest.importorskip("diambra.arena")
    from arbiter.server.formats.diambra.env import episode_seed
    from arbiter.server.formats.diambra.local import LocalEvaluation
    from arbiter.server.formats.diambra.settings import DiambraSettings

    settings = DiambraSettings(game="doapp", difficulty="easy", episodes=1, frame_shape=[64, 64, 1])
    env = LocalEvaluation(settings, seed=77, fps=1_000_000)
    try:
        _, info = env.reset()
        assert "seed" not in info["arbiter"]
        done, step = False, 0
        while not done:
            _, _, terminated, truncated, info = env.step([step % 9, step % 8])
            done, step = terminated or truncated, step + 1
            assert ("seed" in info["arbiter"]) is done
        assert info["arbiter"]["seed"] == episode_seed(77, 0) == env.records[0]["seed"]
    finally:
        env.close()
