"""server/cli/runner.py: ``arbiter run``'s pieces. The agent command is checked before anything
starts; the agent runs as a real process group that an interrupt stops whole; a real ``arbiter
run`` (its own process, the session's redis-server, a counting competition) turns the agent's exit
into its own exit code. Ctrl-C on a whole run is in tests/service/test_fault_shutdown.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap

import paths
import pytest
from harness import read_summary, wait_for
from processes import alive

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.progress import Progress
from arbiter.server.cli.runner import AgentProcess, agent_command_problem, agent_environment, run_local
from arbiter.server.core.competition import load_competition


def test_a_program_on_path_or_an_executable_script_can_be_started(tmp_path, monkeypatch):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "agent.py").write_text("print('hello')\n")
    monkeypatch.chdir(tmp_path)
    assert agent_command_problem([sys.executable, "agent.py"]) is None
    assert agent_command_problem(["python3", "-m", "agent"]) is None  # a module: python finds it
    assert agent_command_problem(["python3"]) is None
    assert agent_command_problem([str(script)]) is None


def test_what_cannot_be_started_is_said_before_anything_starts(tmp_path):
    folder = tmp_path / "agent"
    folder.mkdir()
    plain = tmp_path / "agent.py"
    plain.write_text("print('hello')\n")
    no_shebang = tmp_path / "run.py"
    no_shebang.write_text("print('hello')\n")
    no_shebang.chmod(0o755)
    assert agent_command_problem(["no-such-program-anywhere"]) == "'no-such-program-anywhere' is not a program on PATH"
    assert "does not exist" in agent_command_problem([str(tmp_path / "missing.py")])
    assert "is a folder, not a program" in agent_command_problem([str(folder)])
    not_executable = agent_command_problem([str(plain)])
    assert "is not executable" in not_executable and f"python {plain}" in not_executable
    assert "names no interpreter" in agent_command_problem([str(no_shebang)])
    # The documented form with a typo: python would start, then exit with status 2, an evaluation later.
    assert (
        agent_command_problem(["python3", str(tmp_path / "agnet.py")])
        == f"{str(tmp_path / 'agnet.py')!r} does not exist"
    )


def test_a_run_whose_agent_cannot_start_leaves_no_results_folder(tmp_path):
    results = tmp_path / "arbiter-results" / "run-1"
    with pytest.raises(ConfigError, match="cannot start the agent: 'no-such-agent' is not a program on PATH"):
        run_local(
            load_competition(), agent_command=["no-such-agent"], tests=None, results_dir=str(results),
            service_id="svc", redis_url=None, progress=Progress(enabled=False),
        )  # fmt: skip
    assert not (tmp_path / "arbiter-results").exists()


def test_the_agent_is_told_where_to_connect_in_arbiters_and_flatlands_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTS_OWN_SETTING", "kept")
    env = agent_environment("redis://cache.local:7000/0", "svc-1", str(tmp_path))
    assert env["ARBITER_REDIS_URL"] == "redis://cache.local:7000/0" and env["AICROWD_SUBMISSION_ID"] == "svc-1"
    assert env["redis_ip"] == "cache.local" and env["AICROWD_TESTS_FOLDER"] == str(tmp_path)
    assert env["AGENTS_OWN_SETTING"] == "kept"
    over_socket = agent_environment("unix:///tmp/redis.sock", "svc-1", None, legacy_host="127.0.0.1")
    assert over_socket["redis_ip"] == "127.0.0.1" and over_socket.get("AICROWD_TESTS_FOLDER") == os.environ.get(
        "AICROWD_TESTS_FOLDER"
    )


# An agent that starts a worker of its own, then waits; both write their pids first.
FAMILY = textwrap.dedent(
    """
    import os, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(sys.argv[1], "w") as handle:
        handle.write(f"{os.getpid()} {worker.pid}")
    time.sleep(60)
    """
)


def test_an_interrupt_stops_the_agents_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    agent = AgentProcess([sys.executable, "-c", FAMILY, str(pids)], dict(os.environ))
    agent.start()
    try:
        wait_for(lambda: pids.exists() and pids.read_text().count(" ") == 1, what="the agent and its worker")
        parent, worker = (int(pid) for pid in pids.read_text().split())
        assert os.getpgid(parent) == parent != os.getpgid(0)  # a group of its own: a Ctrl-C reaches arbiter only
        agent.interrupt(signal.SIGINT)
        agent.stop(evaluation_ended_at=0.0)
        assert agent.process.returncode == -signal.SIGTERM
        wait_for(lambda: not alive(worker), what="the agent's worker to be stopped with it")
    finally:
        agent.kill()


def test_stop_waits_for_an_agent_that_exits_by_itself(tmp_path):
    agent = AgentProcess([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
    agent.start()
    agent.stop(evaluation_ended_at=float("inf"))
    assert agent.process.returncode == 3 and agent.interrupted_at is None


AGENT = textwrap.dedent(
    """
    import sys
    from arbiter.client.remote_env import RemoteEnv
    env = RemoteEnv(reply_timeout_s=10)
    while True:
        observation, info = env.reset()
        if info["env_done"]:
            break
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(1)
            done = terminated or truncated
    env.submit()
    env.close()
    sys.exit(int(sys.argv[1]))
    """
)

COMPETITION = """
format = "two-phase"
seed = 3
env_id = "fake_envs:CountingEnv"
worst_return = 0.0
num_episodes = 2
phase = 1

[env_kwargs]
length = 3

[budgets]
step_s = 5.0
planning_s = 5.0
idle_s = 10.0
overall_s = 120.0
"""


@pytest.mark.parametrize(("agent_status", "exit_code"), [(0, 0), (3, 1)])
def test_arbiter_run_exits_with_the_evaluations_code_and_the_agents_failure(
    redis_url, service_id, tmp_path, agent_status, exit_code
):
    competition = tmp_path / "counting.toml"
    competition.write_text(COMPETITION)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(paths.SUPPORT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", str(competition), "--redis-url", redis_url,
         "--service-id", service_id, "--results", str(results), "--quiet", "--",
         sys.executable, "-c", AGENT, str(agent_status)],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == exit_code, done.stderr
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["score"]["primary"] == 3.0  # three steps of reward 1
    assert json.loads((results / "summary.json").read_text()) == summary
