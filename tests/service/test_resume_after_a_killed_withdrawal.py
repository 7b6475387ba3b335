"""A resume SIGKILLed as it took a group's records out of episodes.jsonl (appended to
replayed.jsonl, then episodes.jsonl rewritten without them), before its ``replayed`` event
reached events.jsonl (F11): the next resume names those items, once, in summary.json →
``replayed`` and in a ``replayed`` event, so that summary.json, events.jsonl and replayed.jsonl
agree, and the score is the uninterrupted run's.

The kill points are chosen, not raced: the folder is left as the killed resume leaves it, after
the rewrite by the results store's own withdrawal (what the resume runs at the new agent's
handshake), before it by the records appended to replayed.jsonl alone; no event follows either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import paths
import pytest
from harness import read_episodes, read_summary, wait_for

from arbiter.server.service.events import replays_recorded
from arbiter.server.service.records_file import read_items
from arbiter.server.service.results import ResultsStore

ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
AGENT = [sys.executable, os.path.join(str(paths.SUPPORT), "matrix_agent.py")]
# Two-phase: items 0, 1 phase 1; 2 run 0's training; 3, 4 its evaluation episodes (one group).
SERVE = ["--competition", "two-phase-cartpole", "--set", "seed=1001", "--set", "num_episodes=2", "--set",
         "phase2.num_runs=1", "--set", "phase2.stability_window=2", "--set", "phase2.max_steps=1500"]  # fmt: skip
RUNNER = ["two-phase", os.path.join(str(paths.REPO), "examples", "reinforcelab_cartpole")]
UNSCORED = {"wall_s", "planning_s", "step_think_s", "elapsed_s", "time_bank_used_s", "client", "episode_wall_s"}


def start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    path = os.pathsep.join([str(paths.SUPPORT), os.environ.get("PYTHONPATH", "")])
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=str(paths.REPO), env={**os.environ, "PYTHONPATH": path, **env},
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def started_events(results: Path) -> int:
    path = results / "events.jsonl"
    return path.read_text(encoding="utf-8").count('{"event":"started"') if path.exists() else 0


def serve(redis_url: str, service_id: str, results: Path, *, resume: bool) -> subprocess.Popen:
    before = started_events(results)
    process = start([*ARBITER, "serve", *SERVE, "--redis-url", redis_url, "--service-id", service_id,
                     "--results", str(results), "--quiet", *(["--resume"] if resume else [])],
                    results.parent / "serve.log")  # fmt: skip
    wait_for(lambda: started_events(results) > before or process.poll() is not None, timeout_s=60, what="serving")
    assert process.poll() is None, (results.parent / "serve.log").read_text()
    return process


def agent(redis_url: str, service_id: str, control: Path, pause: str = "") -> subprocess.Popen:
    control.mkdir()
    return start([*AGENT, str(control), *RUNNER], control.parent / "agent.log", ARBITER_REDIS_URL=redis_url,
                 AICROWD_SUBMISSION_ID=service_id, MATRIX_PAUSE=pause)  # fmt: skip


def finished(evaluator: subprocess.Popen, player: subprocess.Popen, tmp: Path) -> None:
    try:
        assert evaluator.wait(timeout=120) == 0, (tmp / "serve.log").read_text()
        assert player.wait(timeout=30) == 0, (tmp / "agent.log").read_text()
    finally:
        for process in (evaluator, player):
            if process.poll() is None:
                process.kill()
                process.wait()


def scored(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in UNSCORED} for r in records]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("killed", ["after its rewrite of episodes.jsonl", "before its rewrite of episodes.jsonl"])
def test_a_withdrawal_whose_resume_was_killed_before_its_event_is_named_once(killed, redis_url, service_id, tmp_path):
    whole = tmp_path / "whole"
    finished(serve(redis_url, service_id + "-w", whole, resume=False),
             agent(redis_url, service_id + "-w", tmp_path / "c0"), tmp_path)  # fmt: skip

    results = tmp_path / "results"
    evaluator = serve(redis_url, service_id, results, resume=False)
    player = agent(redis_url, service_id, tmp_path / "c1", pause="step:4:40")  # items 0-3 recorded
    try:
        wait_for(lambda: (tmp_path / "c1" / "paused").exists() or player.poll() is not None, 120, "the pause")
        assert player.poll() is None, (tmp_path / "agent.log").read_text()
    finally:
        for process in (evaluator, player):
            process.send_signal(signal.SIGKILL)
            process.wait()
    # The resume that followed took the group begun (items 2 and 3) out, and was killed there:
    # once they were in replayed.jsonl alone, or in both files (its next resume takes them out).
    group = b"".join(item.data for item in read_items(str(results / "episodes.jsonl")).items if item.index >= 2)
    if killed.startswith("after"):
        withdrawn = ResultsStore(str(results), [], lambda record: {}).withdraw_from(2)
    else:
        withdrawn = [json.loads(line) for line in group.splitlines()]
        (results / "replayed.jsonl").write_bytes(group)
    assert sorted({r["index"] for r in withdrawn}) == [2, 3] and (results / "replayed.jsonl").read_bytes() == group
    assert replays_recorded(str(results / "events.jsonl")) == []

    resumed = serve(redis_url, service_id, results, resume=True)
    finished(resumed, agent(redis_url, service_id, tmp_path / "c2"), tmp_path)

    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["score"] == read_summary(str(whole))["score"]
    assert scored(read_episodes(str(results))) == scored(read_episodes(str(whole)))
    assert (results / "replayed.jsonl").read_bytes() == group  # each withdrawn record kept once
    assert [(entry["items"], entry["records"]) for entry in summary["replayed"]] == [([2, 3], len(withdrawn))]
    assert replays_recorded(str(results / "events.jsonl")) == summary["replayed"]  # a later resume reads it back
