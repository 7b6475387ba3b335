"""The two-phase format end to end: a real redis-server, the evaluator in this process, agents in
real subprocesses (the ReinforceLab runner with the shipped example) or on RemoteEnv here.

Scores are recomputed from episodes.jsonl with this file's own arithmetic (docs/formats/two-phase.md), not
the format's code; seeds are checked against the derivation the plan documents."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import paths
import pytest
from fake_envs import fake_spec
from harness import (
    finish,
    read_episodes,
    read_events,
    read_summary,
    running_service,
    train_until_the_run_ends,
    wait_for,
)

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ConfigError, InvalidAction, TimeoutException
from arbiter.server.core.competition import load_competition
from arbiter.server.formats import get_format
from arbiter.server.formats.base import reset_seed

REPO = str(paths.REPO)
EXAMPLE = os.path.join(REPO, "examples", "reinforcelab_cartpole")
TESTS_DIR = str(paths.SUPPORT)


def streak_step(train: list[dict[str, Any]], goal: float, window: int) -> int | None:
    """docs/formats/two-phase.md's streak: the first ended episode ≥ goal followed by ``window`` more ≥ goal;
    recorded at the total steps when the last of them ended. An episode ended by the env counts,
    and so does one the agent ended with a reset; one the run's end cut short does not."""
    ended = [r for r in train if r["complete"] or r.get("agent_reset")]
    run = 0
    for record in ended:
        run = run + 1 if record["return"] >= goal else 0
        if run == window + 1:
            return record["total_steps"]
    return None


def recompute(records: list[dict[str, Any]], goal: float, window: int, penalty: float) -> dict[str, Any]:
    phase1 = [r["return"] for r in records if r["phase"] == 1]
    runs = sorted({r["run"] for r in records if r["phase"] == 2})
    steps, evals = [], []
    for run in runs:
        train = [r for r in records if r["phase"] == 2 and r["run"] == run and r["stage"] == "train"]
        step = streak_step(train, goal, window)
        steps.append(step if step is not None else penalty)
        returns = [r["return"] for r in records if r["phase"] == 2 and r["run"] == run and r["stage"] == "eval"]
        if returns:  # none yet while the run's evaluation episodes are to come
            evals.append(sum(returns) / len(returns))
    return {
        "phase1": sum(phase1) / len(phase1) if phase1 else None,
        "convergence": sum(steps) / len(steps) if steps else None,
        "eval": sum(evals) / len(evals) if evals else None,
    }


def runner_env(redis_url: str, service_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ARBITER_REDIS_URL=redis_url, AICROWD_SUBMISSION_ID=service_id)
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, env.get("PYTHONPATH", "")])
    return env


def test_the_reinforcelab_runner_plays_the_example_agent_to_success(redis_url, service_id, tmp_path):
    competition = load_competition(
        "two-phase-cartpole", ["num_episodes=3", "phase2.num_runs=2", "phase2.max_steps=20000"]
    )
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        agent = subprocess.run(
            [sys.executable, "-m", "arbiter.client.reinforcelab", EXAMPLE],
            env=runner_env(redis_url, service_id),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert agent.returncode == 0, agent.stderr[-2000:]
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["format"] == "two-phase" and summary["tests"] == "CartPole-v1"
    records = read_episodes(results)
    for record in records:
        assert {"phase", "stage", "run", "seed", "steps", "return", "timed_out"} <= set(record)
    phase1 = [r for r in records if r["phase"] == 1]
    assert [r["seed"] for r in phase1] == [reset_seed(1001, 1, i) for i in range(3)]
    assert all(r["return"] == 500.0 and r["run"] is None for r in phase1)  # the shipped weights
    for run in (0, 1):
        train = [r for r in records if r["stage"] == "train" and r["run"] == run]
        assert [r["seed"] for r in train] == [reset_seed(1001, 2, run, k) for k in range(len(train))]
        assert [r["total_steps"] for r in train] == sorted(r["total_steps"] for r in train)
        evals = [r for r in records if r["phase"] == 2 and r["stage"] == "eval" and r["run"] == run]
        assert [r["seed"] for r in evals] == [reset_seed(1001, 3, run, i) for i in range(3)]
    want = recompute(records, goal=475.0, window=10, penalty=1.5 * 20000)
    score = summary["score"]
    assert (score["phase1"], score["convergence"], score["eval"]) == (want["phase1"], want["convergence"], want["eval"])
    assert score["primary"] == want["phase1"] and score["secondary"] == want["convergence"]
    assert [r["converged"] for r in score["runs"]] == [True, True]  # the example converges on CartPole
    rescored = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "rescore", results],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert rescored.returncode == 0 and "matches summary.json" in rescored.stdout, rescored.stdout


def test_remote_env_is_a_gymnasium_env_with_the_servers_spaces_seeds_and_replies(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        fake_spec(phase=1), tests=None, results=results, redis_url=redis_url, service_id=service_id
    ) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert isinstance(env, gymnasium.Env)
        assert env.action_space == gymnasium.spaces.Discrete(2)
        assert env.observation_space == gymnasium.spaces.Box(0.0, 1e6, shape=(2,), dtype=np.float64)
        returns = []
        for episode in range(2):
            observation, info = env.reset(seed=123)  # ignored: the evaluator picks every seed
            seed = reset_seed(7, 1, episode)
            assert info["seed_seen"] == seed and info["env_done"] is False  # the env's own info: reset with it
            assert "seed" not in info["arbiter"]  # the evaluator keeps it while the episode runs
            assert env.observation_space.contains(np.asarray(observation))
            total, done = 0.0, False
            while not done:
                observation, reward, terminated, truncated, info = env.step(1)
                total += reward
                done = terminated or truncated
                assert ("seed" in info["arbiter"]) is done
            assert observation[0] == 5 and info["steps"] == 5 and info["arbiter"]["seed"] == seed  # named at its end
            returns.append(total)
        observation, info = env.reset()
        assert info["env_done"] is True and env.finished
        scores = env.submit()
        env.close()
        summary = finish(outcome)
    assert returns == [10.0, 10.0]
    assert summary["state"] == "SUCCESS" and summary["score"]["phase1"] == 10.0
    assert scores["score"] == 10.0 and service.evaluation.counters["invalid_actions"] == 0


def test_an_action_outside_the_space_is_refused_and_nothing_is_applied(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        fake_spec(phase=1), tests=None, results=results, redis_url=redis_url, service_id=service_id
    ) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.reset()
        env.step(0)
        for bad in (7, -1, "left", [0, 1], {"a": 1}, None, 1.5):
            with pytest.raises(InvalidAction):
                env.step(bad)
            assert service.evaluation.current.steps == 1  # the env never saw it
        observation, *_ = env.step(np.int64(1))  # numpy scalars are fine
        assert observation[0] == 2
        env.close()
        service.request_stop("done")
        finish(outcome)


def test_a_slow_step_times_out_and_the_episode_scores_the_worst_return(redis_url, service_id, tmp_path):
    competition = fake_spec(phase=1, budgets={"step_s": 0.3}, worst_return=-100.0)
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.reset()
        env.step(1)
        wait_for(lambda: service.evaluation.counters["step_timeouts"] == 1, timeout_s=5, what="the step timeout")
        with pytest.raises(TimeoutException):
            env.step(1)
        env.reset()
        for _ in range(5):
            env.step(0)
        env.submit()
        env.close()
        summary = finish(outcome)
    records = read_episodes(results)
    assert [r["timed_out"] for r in records] == [True, False]
    assert records[0]["return"] == -100.0 and records[0]["partial_return"] == 2.0 and records[0]["timeout"] == "step"
    assert records[1]["return"] == 5.0
    assert summary["score"]["phase1"] == (-100.0 + 5.0) / 2


def test_a_training_run_over_its_stage_budget_ends_unconverged_and_is_penalized(redis_url, service_id, tmp_path):
    competition = fake_spec(phase=2, phase2={"run_budget_s": 0.5, "num_runs": 1, "max_steps": 10**9})
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        with pytest.raises(TimeoutException):
            while True:  # an agent that never reaches the goal (action 0 earns 5 < 9)
                env.reset()
                for _ in range(5):
                    env.step(0)
        assert service.evaluation.counters["stage_timeouts"] == 1
        env.begin_stage(env.stages[1])
        for _ in range(2):
            env.reset()
            for _ in range(5):
                env.step(1)
        env.submit()
        env.close()
        summary = finish(outcome)
    train = [r for r in read_episodes(results) if r["stage"] == "train"]
    assert train and all(r["ended"] == "stage_timeout" for r in train)
    assert train[-1]["timed_out"] == (not train[-1]["complete"])
    run = summary["score"]["runs"][0]
    assert run["converged"] is False and run["penalized"] is True and run["score"] == 1.5 * 10**9
    assert summary["score"]["convergence"] == 1.5 * 10**9 and summary["score"]["eval"] == 10.0


def test_a_run_converges_at_the_step_the_streak_completes(redis_url, service_id, tmp_path):
    competition = fake_spec(phase=2, phase2={"num_runs": 1})
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        actions = [0, 1, 0, 1, 1, 1, 1]  # returns 5, 10, 5, 10, 10, 10: the streak ends with episode 5
        with pytest.raises(StopIteration):
            for action in actions:
                env.reset()
                for _ in range(5):
                    env.step(action)
        env.begin_stage(env.stages[1])
        for _ in range(2):
            env.reset()
            for _ in range(5):
                env.step(1)
        env.submit()
        env.close()
        summary = finish(outcome)
    train = [r for r in read_episodes(results) if r["stage"] == "train"]
    assert [r["return"] for r in train] == [5.0, 10.0, 5.0, 10.0, 10.0, 10.0]
    assert summary["score"]["runs"][0]["convergence_step"] == 30 == streak_step(train, 9.0, 2)
    assert train[-1]["converged_at"] == 30 and train[-1]["ended"] == "finished"


def test_an_infeasible_goal_is_refused_at_load_with_the_reason():
    with pytest.raises(ConfigError, match=r"infeasible phase 2: converging needs 11 episodes .* = 5225 env steps"):
        load_competition("two-phase-cartpole", ["phase2.max_steps=1000"])  # what serve, run and submit read first
    # an episode cut later than the registration says (env_kwargs) makes a longer goal reachable
    longer = load_competition("two-phase-cartpole", ["phase2.goal_reward=600", "env_kwargs={max_episode_steps=1000}"])
    get_format("two-phase").make_plan(longer, None).close()
    with pytest.raises(ConfigError, match="it needs 600 steps at 1 per step, and episodes end after 500"):
        load_competition("two-phase-cartpole", ["phase2.goal_reward=600"])
    with pytest.raises(ConfigError, match="unknown keys"):
        load_competition("two-phase-cartpole", ["phase2.max_stepz=1000"])


def test_a_deterministic_agent_reproduces_its_results_exactly(redis_url, service_id, tmp_path):
    def play(results: str) -> list[tuple[Any, ...]]:
        sid = f"{service_id}{len(results) % 7}"
        with running_service(fake_spec(phase=1), tests=None, results=results, redis_url=redis_url, service_id=sid) as (
            _,
            outcome,
        ):
            env = RemoteEnv(redis_url=redis_url, service_id=sid, reply_timeout_s=10)
            observation, info = env.reset()
            while not info.get("env_done"):
                done = False
                while not done:
                    observation, _, terminated, truncated, info = env.step(int(observation[1]) % 2)
                    done = terminated or truncated
                observation, info = env.reset()
            env.submit()
            env.close()
            finish(outcome)
        return [(r["seed"], r["steps"], r["return"]) for r in read_episodes(results)]

    assert play(str(tmp_path / "a")) == play(str(tmp_path / "bb"))


def test_run_and_serve_take_set_and_phase(tmp_path):
    results = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "two-phase-cartpole", "--phase", "1",
         "--set", "num_episodes=2", "--results", str(results), "--quiet", "--",
         sys.executable, "-m", "arbiter.client.reinforcelab", EXAMPLE],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["options"]["phase"] == 1
    assert summary["score"]["phase1"] == 500.0 and summary["score"]["convergence"] is None
    # arbiter run is the participant's own run: the preset's public seed, nothing drawn; kept for a
    # resume, as it is
    assert [r["seed"] for r in read_episodes(str(results))] == [reset_seed(1001, 1, i) for i in range(2)]
    assert summary["seed"] == 1001
    assert json.loads((results / "seed.json").read_text()) == {"seed": 1001, "drawn": False, "tests": None}
    bad = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", "two-phase-cartpole",
         "--set", "phase2.goal_reward=much"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "phase2.goal_reward must be float" in bad.stderr


def test_run_connects_the_agent_over_the_embedded_redis_unix_socket_and_flatland_clients_over_tcp(tmp_path):
    seen = tmp_path / "seen"
    agent = (
        f'printf "%s\\n%s\\n" "$ARBITER_REDIS_URL" "$redis_ip" > {shlex.quote(str(seen))}; '
        f"exec {shlex.quote(sys.executable)} -m arbiter.client.reinforcelab {shlex.quote(EXAMPLE)}"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ARBITER_REDIS_URL", "redis_ip")}
    results = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "two-phase-cartpole", "--phase", "1",
         "--set", "num_episodes=1", "--results", str(results), "--", "sh", "-c", agent],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    url, legacy_host = seen.read_text().split()
    assert url.startswith("unix:///") and url.endswith("/redis.sock?db=0"), url
    # flatland's client knows TCP only: a loopback address (127.0.0.1 unless another program holds
    # its port 6379 there, a local run beside this one say)
    assert ipaddress.ip_address(legacy_host).is_loopback, legacy_host
    # the start line names where arbiter's clients connect; no Flatland client plays this format
    assert f"on {url}; waiting for the agent" in done.stderr and "flatland" not in done.stderr.lower()
    assert read_summary(str(results))["state"] == "SUCCESS"
    socket_path = Path(url[len("unix://") : -len("?db=0")])
    assert not socket_path.parent.exists()  # the embedded Redis and its folder are gone


def test_a_training_runs_episodes_are_announced_with_one_running_score(redis_url, service_id, tmp_path):
    """A run's episodes are recorded together when it ends: each is announced (progress, events)
    with the score so far, which is computed once for them all, not once per episode."""
    competition = fake_spec(phase=2, phase2={"num_runs": 1, "max_steps": 100})  # action 0 returns 5 < 9: no goal
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        evaluation = service.evaluation
        computed: list[int] = []
        primary = evaluation.rule.primary
        evaluation.rule.primary = lambda records: (computed.append(len(records)), primary(records))[1]
        announced: list[float | None] = []
        on_episode = evaluation.on_episode
        evaluation.on_episode = lambda record, ev: (announced.append(ev.running_score()), on_episode(record, ev))
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        train_until_the_run_ends(env, 0)  # 20 five-step episodes, never converging
        env.begin_stage(env.stages[1])
        for _ in range(2):
            env.reset()
            for _ in range(5):
                env.step(1)
        env.submit()
        env.close()
        summary = finish(outcome)
    train = [r for r in read_episodes(results) if r["stage"] == "train"]
    assert len(train) == 20 and summary["state"] == "SUCCESS"
    assert len(announced) == 22 and len(set(announced[:20])) == 1  # the run's 20, then 2 eval episodes
    assert computed == [20, 21, 22]  # once for the run's records, then once per evaluation episode


def test_the_score_so_far_is_the_figure_of_the_phase_being_played(redis_url, service_id, tmp_path):
    """Phase 1's mean return while phase 1 runs; from phase 2's first record on, the mean
    convergence step of the runs trained so far (phase 1's figure is final by then). Checked on
    every episode event against this file's own arithmetic over the records announced so far."""
    competition = fake_spec(phase2={"max_steps": 60})
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for stage in env.stages:
            env.begin_stage(stage)
            if stage["stage"] == "train":  # run 0 converges, run 1 (action 0 returns 5 < 9) never does
                train_until_the_run_ends(env, 1 if stage["run"] == 0 else 0)
                continue
            for i in range(stage["items"][1] - stage["items"][0]):
                env.reset()
                for _ in range(5):
                    env.step(1 if stage["phase"] == 2 or i == 0 else 0)  # phase 1 returns 10, then 5
        env.submit()
        env.close()
        summary = finish(outcome)
    records = read_episodes(results)
    announced = [e for e in read_events(results) if e["event"] == "episode"]
    assert len(announced) == len(records)
    want = []
    for record in records:
        so_far = recompute([r for r in records if r["index"] <= record["index"]], goal=9.0, window=2, penalty=90.0)
        want.append(so_far["convergence"] if so_far["convergence"] is not None else so_far["phase1"])
    assert [e["score_so_far"] for e in announced] == want
    assert want[:2] == [10.0, 7.5] and want[-1] == (15.0 + 90.0) / 2
    score = summary["score"]
    assert (score["primary"], score["secondary"]) == (7.5, want[-1])  # phase 1, then convergence, as before
