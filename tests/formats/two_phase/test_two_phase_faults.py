"""Process faults on the two-phase format (docs/design/reliability.md#f1, F11, F12): SIGKILL + --resume,
SIGTERM, a killed agent. A real redis-server; `arbiter serve` / `arbiter run` and the ReinforceLab
runner with the shipped example run as real processes. To kill a runner during training, it is
started through OBSERVER, which writes a marker once the agent has made a given number of
training steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import paths
import pytest
from harness import read_episodes, read_summary, remote_episode, train_until_the_run_ends, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.core.seeds import read_persisted_seed
from arbiter.server.formats.base import reset_seed
from arbiter.server.service.transport import MAX_BLOCK_S

REPO = str(paths.REPO)
TESTS_DIR = str(paths.SUPPORT)
EXAMPLE = os.path.join(REPO, "examples", "reinforcelab_cartpole")
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
# Small CartPole settings: 2 episodes per evaluation stage, 2 runs, a short streak, bounded runs.
SMALL = ["num_episodes=2", "phase2.num_runs=2", "phase2.stability_window=2", "phase2.max_steps=3000"]
CARTPOLE_SEED = 1001  # the preset's: public, so `arbiter serve` resets with a seed it draws
RUN_ITEMS = ("train", "eval/0", "eval/1")  # one phase-2 run's items with num_episodes = 2

OBSERVER = """
import os, sys
from arbiter.client import reinforcelab, remote_env
import paths

marker, after = sys.argv[1], int(sys.argv[2])
real_step = remote_env.RemoteEnv.step
seen = 0

def step(self, action):
    global seen
    result = real_step(self, action)
    if self.episode.get("stage") == "train":
        seen += 1
        if seen == after:
            with open(marker + ".part", "w") as out:
                out.write(str(os.getpid()))
            os.rename(marker + ".part", marker)
    return result

remote_env.RemoteEnv.step = step
sys.exit(reinforcelab.main(sys.argv[3:]))
"""


def start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]), **env}
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, stderr=out)


def serve(redis_url: str, service_id: str, results: Path, *sets: str, resume: bool = False) -> subprocess.Popen:
    """`arbiter serve` on the CartPole preset with ``sets``, returned once its started event is written
    (it serves a moment later), so a client started then rarely waits out a PING resend."""
    starts = started_events(results)
    command = [*ARBITER, "serve", "--competition", "two-phase-cartpole", *[f"--set={s}" for s in sets],
               "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet"]  # fmt: skip
    process = start(command + (["--resume"] if resume else []), results.parent / "serve.log")
    wait_for(lambda: started_events(results) > starts or process.poll() is not None, timeout_s=60, what="serving")
    return process


def started_events(results: Path) -> int:
    path = results / "events.jsonl"
    return path.read_text(encoding="utf-8").count('{"event":"started"') if path.exists() else 0


def runner(tmp_path: Path, redis_url: str, service_id: str, *, observe_after: int | None = None) -> subprocess.Popen:
    """The ReinforceLab runner with the example; with ``observe_after``, through OBSERVER."""
    command = [sys.executable, "-m", "arbiter.client.reinforcelab", EXAMPLE]
    if observe_after is not None:
        observer = tmp_path / "observer.py"
        observer.write_text(OBSERVER, encoding="utf-8")
        command = [sys.executable, str(observer), str(tmp_path / "training"), str(observe_after), EXAMPLE]
    return start(command, tmp_path / "runner.log", ARBITER_REDIS_URL=redis_url, AICROWD_SUBMISSION_ID=service_id)


def kill(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()


def rescore(results: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "arbiter.server.cli", "rescore", str(results)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def streak_step(train: list[dict[str, Any]], goal: float, window: int) -> int | None:
    """docs/formats/two-phase.md's streak over ended episodes (by the env, or by the agent's reset), recorded
    at the total steps of its last."""
    streak = 0
    for record in (r for r in train if r["complete"] or r.get("agent_reset")):
        streak = streak + 1 if record["return"] >= goal else 0
        if streak == window + 1:
            return record["total_steps"]
    return None


@pytest.mark.timeout(180)
def test_sigkill_during_training_then_resume_replays_the_run_from_scratch(redis_url, service_id, tmp_path):
    results = tmp_path / "results"
    evaluator = serve(redis_url, service_id, results, *SMALL)
    agent = runner(tmp_path, redis_url, service_id, observe_after=300)
    try:
        wait_for((tmp_path / "training").exists, timeout_s=90, what="300 training steps")
        kill(evaluator, agent)
        before = (results / "episodes.jsonl").read_bytes()
        assert [r["unit"] for r in read_episodes(str(results))] == ["phase1/eval/0", "phase1/eval/1"]
        assert not (results / "summary.json").exists()  # killed in run 0, before any of its records
        evaluator = serve(redis_url, service_id, results, *SMALL, resume=True)
        agent = runner(tmp_path, redis_url, service_id)
        assert agent.wait(timeout=150) == 0, (tmp_path / "runner.log").read_text()[-3000:]
        assert evaluator.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        kill(evaluator, agent)
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["counters"]["resumed"] == 1
    assert (results / "episodes.jsonl").read_bytes().startswith(before)  # phase 1's records, byte for byte
    records = read_episodes(str(results))
    drawn = read_persisted_seed(str(results))  # drawn by the first `arbiter serve`, read back by the second
    assert drawn["drawn"] and drawn["seed"] != CARTPOLE_SEED and summary["seed"] == drawn["seed"]
    seed = drawn["seed"]
    assert [r["seed"] for r in records if r["phase"] == 1] == [reset_seed(seed, 1, i) for i in range(2)]
    units = [r["unit"] for r in records]
    plan = ["phase1/eval/0", "phase1/eval/1"] + [f"phase2/run{run}/{s}" for run in (0, 1) for s in RUN_ITEMS]
    assert list(dict.fromkeys(units)) == plan and sorted(units, key=plan.index) == units  # each item once, in order
    for run in (0, 1):
        train = [r for r in records if r["stage"] == "train" and r["run"] == run]
        assert [r["episode"] for r in train] == list(range(len(train)))  # from scratch, each episode once
        assert [r["seed"] for r in train] == [reset_seed(seed, 2, run, k) for k in range(len(train))]
        assert [r["total_steps"] for r in train] == list(np.cumsum([r["steps"] for r in train]))
        scored = summary["score"]["runs"][run]
        assert scored["convergence_step"] == streak_step(train, 475.0, 2)
    assert summary["score"]["phase1"] == 500.0
    assert "matches summary.json" in rescore(results)


def test_sigterm_during_a_training_run_interrupts_at_once_and_resume_starts_the_run_over(
    redis_url, service_id, tmp_path, record_property
):
    results = tmp_path / "results"
    fake = ["env_id=fake_envs:CountingEnv", "env_kwargs={length = 5, bonus = 1.0}", "reward_per_step=[1.0, 2.0]",
            "worst_return=0.0", "num_episodes=2", "phase2.num_runs=1", "phase2.goal_reward=9.0",
            "phase2.stability_window=2", "phase2.max_steps=200"]  # fmt: skip
    evaluator = serve(redis_url, service_id, results, *fake)
    try:
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        env.begin_stage(env.stages[0])
        assert [remote_episode(env, lambda _: 1, {})[0] for _ in range(2)] == [10.0, 10.0]
        env.begin_stage(env.stages[1])
        env.reset()
        for _ in range(3):
            env.step(0)  # training run 0 is under way
        env.close()
        sent = time.monotonic()
        evaluator.send_signal(signal.SIGTERM)
        summary = wait_for(lambda: (results / "summary.json").exists() and read_summary(str(results)), timeout_s=10)
        summary_s = time.monotonic() - sent
        status = evaluator.wait(timeout=10)
        exit_s = time.monotonic() - sent
        record_property("summary_s", round(summary_s, 3))
        record_property("exit_s", round(exit_s, 3))
        assert status == 130 and summary_s < 1.0, (status, summary_s)
        assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == "stopped by SIGTERM"
        assert summary["score"]["primary"] is None
        assert [r["unit"] for r in read_episodes(str(results))] == ["phase1/eval/0", "phase1/eval/1"]

        evaluator = serve(redis_url, service_id, results, *fake, resume=True)
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        assert env.next_item == 2  # the interrupted run
        env.begin_stage(env.stages[1])
        _, info = env.reset()
        assert info["arbiter"]["episode"] == 0 and "seed" not in info["arbiter"]  # the run starts over
        for _ in range(5):
            env.step(1)
        train_until_the_run_ends(env, 1)
        env.begin_stage(env.stages[2])
        assert [remote_episode(env, lambda _: 1, {})[0] for _ in range(2)] == [10.0, 10.0]
        env.submit()
        env.close()
        assert evaluator.wait(timeout=30) == 0
    finally:
        kill(evaluator)
    summary = read_summary(str(results))
    records = read_episodes(str(results))
    train = [r for r in records if r["stage"] == "train"]
    assert summary["state"] == "SUCCESS" and [r["total_steps"] for r in train] == [5, 10, 15]
    seed = read_persisted_seed(str(results))["seed"]  # phase 1 before the SIGTERM, the run after: one seed
    assert seed != CARTPOLE_SEED and summary["seed"] == seed
    assert [r["seed"] for r in records if r["phase"] == 1] == [reset_seed(seed, 1, i) for i in range(2)]
    assert [r["seed"] for r in train] == [reset_seed(seed, 2, 0, k) for k in range(3)]
    assert summary["score"]["runs"][0]["convergence_step"] == 15


KILLED_AGENT = [*SMALL, "worst_return=-7.0"]
UNPLAYED = ["phase2/run0/eval/0", "phase2/run0/eval/1"] + [f"phase2/run1/{s}" for s in RUN_ITEMS]


def assert_scored_with_the_unplayed_items(results: Path, ended: str, timeout: str | None) -> None:
    """Phase 1 kept; run 0 ended as ``ended`` (only an episode the timeout cut short timed out);
    the five items after it recorded as not played, at the worst return or the penalty."""
    records = read_episodes(str(results))
    assert [r["return"] for r in records if r["phase"] == 1] == [500.0, 500.0]  # finished items kept
    run0 = [r for r in records if r["unit"] == "phase2/run0/train"]
    assert run0 and all(r["ended"] == ended and r["timeout"] == timeout for r in run0)
    assert all(r["abandoned"] == (timeout is None) and not r["skipped"] for r in run0)
    cut_short = timeout is not None and not run0[-1]["complete"]
    assert [r["timed_out"] for r in run0] == [False] * (len(run0) - 1) + [cut_short]
    unplayed = [r for r in records if r["skipped"]]
    assert [r["unit"] for r in unplayed] == UNPLAYED
    assert [r["return"] for r in unplayed if r["stage"] == "eval"] == [-7.0] * 4  # the worst return
    score = read_summary(str(results))["score"]
    assert [(r["penalized"], r["score"], r["eval_return"]) for r in score["runs"]] == [(True, 4500.0, -7.0)] * 2
    assert (score["phase1"], score["convergence"], score["eval"]) == (500.0, 4500.0, -7.0)
    assert "matches summary.json" in rescore(results)


def test_a_killed_agent_in_arbiter_run_ends_the_evaluation_with_the_unplayed_items_scored(
    redis_url, service_id, tmp_path, record_property
):
    results = tmp_path / "results"
    observer = tmp_path / "observer.py"
    observer.write_text(OBSERVER, encoding="utf-8")
    command = [*ARBITER, "run", "--competition", "two-phase-cartpole", *[f"--set={s}" for s in KILLED_AGENT],
               "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet", "--",
               sys.executable, str(observer), str(tmp_path / "training"), "200", EXAMPLE]  # fmt: skip
    arbiter = start(command, tmp_path / "run.log")
    try:
        pid = int(wait_for(lambda: (tmp_path / "training").exists() and (tmp_path / "training").read_text(),
                           timeout_s=90, what="200 training steps"))  # fmt: skip
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # the agent arbiter started; arbiter itself goes on
        summary = wait_for(lambda: (results / "summary.json").exists() and read_summary(str(results)), timeout_s=10)
        summary_s = time.monotonic() - killed
        status = arbiter.wait(timeout=30)
    finally:
        kill(arbiter)
    record_property("summary_after_kill_s", round(summary_s, 3))
    assert summary_s < MAX_BLOCK_S + 1.0  # noticed at the end of the evaluator's current wait for Redis
    assert status == 1 and "the agent exited with status -9" in (tmp_path / "run.log").read_text()
    assert summary["state"] == "SUCCESS"
    assert summary["termination_cause"] == (
        "the agent process exited with status -9 before submitting; 5 episodes and training runs not played count as "
        "unfinished"
    )
    assert_scored_with_the_unplayed_items(results, "abandoned", None)


def test_a_killed_agent_under_arbiter_serve_times_out_and_the_successive_timeouts_end_it(
    redis_url, service_id, tmp_path, record_property
):
    results = tmp_path / "results"
    sets = [*KILLED_AGENT, "phase2.step_s=0.5", "budgets.max_successive_timeouts=2"]
    evaluator = serve(redis_url, service_id, results, *sets)
    agent = runner(tmp_path, redis_url, service_id, observe_after=200)
    try:
        wait_for((tmp_path / "training").exists, timeout_s=90, what="200 training steps")
        killed = time.monotonic()
        kill(agent)
        wait_for((results / "summary.json").exists, what="the evaluation to end")
        ended_s = time.monotonic() - killed
        assert evaluator.wait(timeout=10) == 0  # after answering late requests for a second
    finally:
        kill(evaluator, agent)
    record_property("ended_after_kill_s", round(ended_s, 3))
    assert ended_s < 2 * 0.5 + 1.0  # one step budget to time out the run, one more for the next request
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["counters"]["step_timeouts"] == 1
    assert summary["termination_cause"] == (
        "2 successive timeouts; 5 episodes and training runs not played count as unfinished"
    )
    assert_scored_with_the_unplayed_items(results, "step_timeout", "step")
