"""client/reinforcelab.py: ``python -m arbiter.client.reinforcelab SUBMISSION_DIR`` as a real process
against a real two-phase evaluator (a counting env, both phases). The submissions here note every
call the runner makes on them in a file, so the order of ``load``, ``train`` and ``act`` is what
is checked. The example agent's evaluation is in tests/formats/two_phase/test_two_phase_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import paths
from fake_envs import counting_competition
from harness import finish, read_episodes, running_service, spec

PHASE2 = {"num_runs": 2, "max_steps": 20, "goal_reward": 9.0, "stability_window": 1}

# A ReinforceLab agent: ``Agent(env)``, ``load()``, ``train()``, ``act(obs)``. Its training plays
# action 1 until the run ends (converging: a return of 10 >= 9, twice); the first run's training
# also fails after the run ends, which the runner notes and goes past.
AGENT = textwrap.dedent(
    """
    import os

    CALLS = os.environ["CALLS_FILE"]
    built = 0


    def note(text):
        with open(CALLS, "a") as handle:
            handle.write(text + "\\n")


    class Agent:
        def __init__(self, env):
            global built
            built += 1
            self.env, self.number = env, built
            note(f"init {self.number}")

        def load(self):
            note(f"load {self.number}")

        def train(self):
            note(f"train {self.number}")
            try:
                while True:
                    self.env.reset()
                    done = False
                    while not done:
                        _, _, terminated, truncated, _ = self.env.step(1)
                        done = terminated or truncated
            except StopIteration:
                if self.number == 2:
                    raise ValueError("a bug in the agent's own bookkeeping") from None
                raise

        def act(self, observation):
            note(f"act {self.number}")
            return 1
    """
)


def runner(submission: Path, redis_url: str, service_id: str, calls: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "ARBITER_REDIS_URL": redis_url,
        "AICROWD_SUBMISSION_ID": service_id,
        "CALLS_FILE": str(calls),
        "PYTHONPATH": os.pathsep.join([str(paths.SUPPORT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "arbiter.client.reinforcelab", str(submission)],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_the_runner_follows_the_stages_with_the_agent_each_needs(redis_url, service_id, tmp_path):
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "agent.py").write_text(AGENT)
    calls = tmp_path / "calls"
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=1, phase=None, phase2=PHASE2)
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        done = runner(submission, redis_url, service_id, calls)
        summary = finish(outcome)
    assert done.returncode == 0, done.stderr
    assert "submitted: score" in done.stderr
    assert "training run 0 raised ValueError: a bug in the agent's own bookkeeping" in done.stderr
    assert summary["state"] == "SUCCESS"
    # Phase 1: an agent loaded, then acting for its episode's five steps; each phase 2 run: a
    # fresh agent trained, then acting for its evaluation episode.
    expected = ["init 1", "load 1"] + ["act 1"] * 5
    for run in (2, 3):
        expected += [f"init {run}", f"train {run}"] + [f"act {run}"] * 5
    assert calls.read_text().split("\n")[:-1] == expected
    stages = [(record["phase"], record["stage"]) for record in read_episodes(results)]
    assert stages.count((1, "eval")) == 1 and stages.count((2, "eval")) == 2


def test_a_submission_without_agent_py_or_without_agent_is_refused_by_name(redis_url, service_id, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = runner(empty, redis_url, service_id, tmp_path / "calls")
    assert done.returncode != 0 and f"no agent.py in {empty}" in done.stderr
    nameless = tmp_path / "nameless"
    nameless.mkdir()
    (nameless / "agent.py").write_text("class Policy:\n    pass\n")
    done = runner(nameless, redis_url, service_id, tmp_path / "calls")
    assert done.returncode != 0 and "agent.py defines no class Agent" in done.stderr


def test_an_evaluator_of_another_format_is_refused_with_exit_status_1(redis_url, service_id, tmp_path, tiny_tests):
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "agent.py").write_text(AGENT)
    with running_service(
        spec(idle_s=10.0), tests=tiny_tests, results=str(tmp_path / "results"), redis_url=redis_url,
        service_id=service_id,
    ) as (_, outcome):  # fmt: skip
        done = runner(submission, redis_url, service_id, tmp_path / "calls")
        summary = finish(outcome)
    assert done.returncode == 1
    assert "WrongFormat" in done.stderr and "flatland" in done.stderr
    assert summary["state"] == "FAILED"
