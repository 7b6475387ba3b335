"""Resume is exact in every format: the evaluator SIGKILLed at each kind of
point, then ``arbiter serve --resume``, with the agent (a) left alive and (b) killed and started
again; the evaluation ends SUCCESS and every scored figure equals an uninterrupted run's.

The agents are real clients (tests/matrix_agent.py: the ReinforceLab and MetaLC runners, a
DIAMBRA-style RemoteEnv loop, a RemoteClient agent), deterministic, paused once at the kill
point: the test waits for the pause (a file), kills the evaluator there, starts it again, then
lets the agent go on or replaces it. Nothing waits on a sleep.

Where an agent cannot live through a restart by the nature of its client (a RemoteEnv loop
inside an episode: the episode went with the evaluator), it stops at once with the message
``EvaluatorRestarted`` gives (restart the agent), and the restarted agent gives the exact score.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paths
import pytest
from harness import read_episodes, read_summary, wait_for

REPO = str(paths.REPO)
TESTS_DIR = str(paths.SUPPORT)
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
AGENT = [sys.executable, os.path.join(TESTS_DIR, "matrix_agent.py")]
# Figures that measure time, or who played: they differ between any two runs.
UNSCORED = {"wall_s", "planning_s", "step_think_s", "elapsed_s", "time_bank_used_s", "client", "episode_wall_s"}


@dataclass(frozen=True)
class Format:
    name: str
    # arbiter serve's arguments, but the Redis, service id and results; the seed is fixed, so that
    # the uninterrupted run (another evaluation) plays the same episodes
    serve: tuple[str, ...]
    agent: tuple[str, ...]  # matrix_agent.py's KIND and arguments
    points: dict[str, str]  # kill point → MATRIX_PAUSE
    # Kill points where an agent left alive must stop and be restarted (its client cannot go on).
    must_restart: frozenset[str] = frozenset()
    # (kill point, mode) → the items withdrawn and played again (a group begun by the lost agent)
    replays: dict[tuple[str, str], list[int]] = field(default_factory=dict)


TWO_PHASE = Format(
    "two-phase",
    (
        "--competition",
        "two-phase-cartpole",
        "--set",
        "seed=1001",
        "--set",
        "num_episodes=2",
        "--set",
        "phase2.num_runs=1",
        "--set",
        "phase2.stability_window=2",
        "--set",
        "phase2.max_steps=1500",
    ),  # fmt: skip
    ("two-phase", os.path.join(REPO, "examples", "reinforcelab_cartpole")),
    # items: 0, 1 phase 1; 2 run 0's training; 3, 4 its evaluation episodes
    {
        "before the first step": "step:0:0",
        "mid-episode": "step:1:40",
        "between items": "create:1",
        "mid training run": "step:2:700",
        "between a training run and its evaluation episodes": "create:3",
        "mid-episode after a training run": "step:4:40",
    },
    replays={
        ("between a training run and its evaluation episodes", "restarted"): [2],
        ("mid-episode after a training run", "alive"): [2, 3],
        ("mid-episode after a training run", "restarted"): [2, 3],
    },
)
DIAMBRA = Format(
    "diambra",
    ("--competition", "diambra", "--set", "seed=1001", "--set", "episodes=2", "--set", "frame_shape=[32, 32, 1]"),
    ("diambra",),
    {"before the first step": "step:0:0", "mid-episode": "step:1:20", "between items": "create:1"},
    must_restart=frozenset({"before the first step", "mid-episode"}),
)
FLATLAND = Format(
    "flatland",
    (),  # the test folder comes from the tiny_tests fixture
    ("flatland",),
    {"before the first step": "step:0:0", "mid-episode": "step:1:3", "between items": "create:1"},
)
METALC = Format(
    "metalc",
    ("--competition", "metalc-wcci2022", "--set", "phase=dev"),  # the data comes from the metalc_data fixture
    ("metalc", os.path.join(REPO, "examples", "metalc_agent")),
    # items: two datasets per fold, fold by fold (0, 1 fold 0; 2, 3 fold 1 ...). The runner asks
    # for each next dataset with the step that ends the last: the evaluator opens it in that turn,
    # so it is never between datasets, and a kill as one ends finds the next one open.
    {
        "before the first step": "step:0:0",
        "mid-dataset": "step:1:1",
        "as a dataset of a fold ends and the next opens": "created:1",
        "during a fold's meta-training": "created:2",
    },
    replays={
        ("mid-dataset", "alive"): [0],
        ("mid-dataset", "restarted"): [0],
        ("as a dataset of a fold ends and the next opens", "alive"): [0],
        ("as a dataset of a fold ends and the next opens", "restarted"): [0],
    },
)
FORMATS = {f.name: f for f in (TWO_PHASE, DIAMBRA, FLATLAND, METALC)}
CASES = [(f.name, point, mode) for f in FORMATS.values() for point in f.points for mode in ("alive", "restarted")]

_references: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}


@pytest.fixture(scope="module")
def metalc_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    folder = tmp_path_factory.mktemp("metalc") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(datasets=12, algorithms=3, seed=3))
    return str(folder)


def start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]), **env}
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=environment, stdout=out, stderr=subprocess.STDOUT)


def started_events(results: Path) -> int:
    path = results / "events.jsonl"
    return path.read_text(encoding="utf-8").count('{"event":"started"') if path.exists() else 0


def serve(fmt: Format, extra: list[str], redis_url: str, service_id: str, results: Path, *, resume: bool):
    """`arbiter serve`, returned once it has written its started event (it serves a moment later)."""
    before = started_events(results)
    command = [*ARBITER, "serve", *fmt.serve, *extra, "--redis-url", redis_url, "--service-id", service_id,
               "--results", str(results), "--quiet", *(["--resume"] if resume else [])]  # fmt: skip
    process = start(command, results.parent / "serve.log")
    wait_for(lambda: started_events(results) > before or process.poll() is not None, timeout_s=60, what="serving")
    assert process.poll() is None, (results.parent / "serve.log").read_text()
    return process


def agent(fmt: Format, control: Path, redis_url: str, service_id: str, pause: str = "") -> subprocess.Popen:
    control.mkdir(exist_ok=True)
    return start([*AGENT, str(control), *fmt.agent], control.parent / "agent.log", ARBITER_REDIS_URL=redis_url,
                 AICROWD_SUBMISSION_ID=service_id, MATRIX_PAUSE=pause)  # fmt: skip


def kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait()


def scored(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in UNSCORED} for r in records]


def reference(fmt: Format, extra: list[str], redis_url: str, service_id: str, tmp: Path) -> tuple[dict, list]:
    """The uninterrupted run of the same agent (once per format and session)."""
    if fmt.name not in _references:
        results = tmp / "reference"
        evaluator = serve(fmt, extra, redis_url, service_id + "-ref", results, resume=False)
        player = agent(fmt, tmp / "reference-control", redis_url, service_id + "-ref")
        try:
            assert evaluator.wait(timeout=120) == 0, (tmp / "serve.log").read_text()
            assert player.wait(timeout=30) == 0, (tmp / "agent.log").read_text()
        finally:
            kill(evaluator)
            kill(player)
        _references[fmt.name] = (read_summary(str(results)), read_episodes(str(results)))
    return _references[fmt.name]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("format_name, point, mode", CASES)
def test_resume_gives_the_uninterrupted_scores(format_name, point, mode, redis_url, service_id, tmp_path, request):
    fmt = FORMATS[format_name]
    data = {"flatland": "tiny_tests", "metalc": "metalc_data"}.get(fmt.name)
    extra = ["--tests", request.getfixturevalue(data)] if data else []
    ref_summary, ref_records = reference(fmt, extra, redis_url, service_id, tmp_path)

    results = tmp_path / "results"
    control = tmp_path / "control"
    evaluator = serve(fmt, extra, redis_url, service_id, results, resume=False)
    player = agent(fmt, control, redis_url, service_id, pause=fmt.points[point])
    replacement = None
    try:
        wait_for(lambda: (control / "paused").exists() or player.poll() is not None, timeout_s=120, what="the pause")
        assert player.poll() is None, (tmp_path / "agent.log").read_text()
        kill(evaluator)
        if mode == "restarted":
            kill(player)
        evaluator = serve(fmt, extra, redis_url, service_id, results, resume=True)
        if mode == "alive":
            (control / "go").touch()
            if point in fmt.must_restart:
                assert player.wait(timeout=60) != 0
                said = (tmp_path / "agent.log").read_text()
                assert "EvaluatorRestarted" in said and "must be restarted" in said, said
        if mode == "restarted" or point in fmt.must_restart:
            replacement = agent(fmt, tmp_path / "control-2", redis_url, service_id)
        assert evaluator.wait(timeout=150) == 0, (tmp_path / "serve.log").read_text()
        last = replacement or player
        assert last.wait(timeout=30) == 0, (tmp_path / "agent.log").read_text()
    finally:
        for process in (evaluator, player, replacement):
            if process is not None:
                kill(process)

    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["counters"]["resumed"] == 1
    assert summary["score"] == ref_summary["score"]
    records = read_episodes(str(results))
    assert scored(records) == scored(ref_records)
    # A group the lost agent had begun is played again from its start: its records are withdrawn
    # (kept in replayed.jsonl) and the summary names them.
    expected = fmt.replays.get((point, mode), [])
    assert [i for entry in summary["replayed"] for i in entry["items"]] == expected
    path = results / "replayed.jsonl"
    withdrawn = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert sorted({r["index"] for r in withdrawn}) == expected
