"""A newcomer's first hour with the command line, as real processes: the example agents' output,
the lines a run prints for each format, runs that cannot start, Ctrl-C, --help, and following a
run from another terminal with the command it prints."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import paths
import pytest
from harness import read_summary, wait_for

from arbiter.server.cli.embedded_redis import port_is_free
from arbiter.server.core.competition import DEFAULT_COMPETITION, load_competition

REPO = paths.REPO
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
REINFORCELAB = [sys.executable, "-m", "arbiter.client.reinforcelab", str(REPO / "examples" / "reinforcelab_cartpole")]
# What a newcomer's shell holds: no Redis address or service id of arbiter's, wide help lines.
SHELL = {k: v for k, v in os.environ.items() if k not in ("ARBITER_REDIS_URL", "AICROWD_SUBMISSION_ID", "redis_ip")}
SHELL["COLUMNS"] = "400"


def arbiter(*args: str, env: dict | None = None, cwd: Path = REPO, timeout_s: float = 120):
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                          env={**SHELL, **(env or {})})  # fmt: skip


def collect_lines(stream) -> list[str]:
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True).start()
    return lines


def end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Port6379Busy:
    """Port 6379 taken while the block runs (by a listening socket of this test when it is free),
    so that an embedded Redis has to listen elsewhere. Its tests run ``alone``: another test's
    `arbiter run` could take the port, and let it go, meanwhile."""

    def __enter__(self) -> Port6379Busy:
        self.holder = None
        if port_is_free("127.0.0.1", 6379):
            self.holder = socket.socket()
            # as a server binds (port_is_free counts a port lingering in TIME_WAIT as free)
            self.holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.holder.bind(("127.0.0.1", 6379))
            self.holder.listen()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.holder is not None:
            self.holder.close()


# --- 2. the example agents say how they did in one line ----------------------------------------


def test_the_example_agent_prints_one_short_line_even_under_quiet(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "r"
    done = arbiter("run", "--quiet", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
                   "--results", str(results), "--", sys.executable, "examples/random_agent.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    score = read_summary(results)["score"]
    assert done.stdout == f"submitted: score {score['primary']:.6g}, secondary {score['secondary']:.6g}\n"
    assert done.stderr == ""  # --quiet: the evaluator says nothing when all goes well


@pytest.mark.alone  # port 6379, which any other test's `arbiter run` takes when it is free
def test_the_legacy_example_ends_with_one_short_line(tiny_tests, tmp_path):
    if not port_is_free("127.0.0.1", 6379):
        pytest.skip("port 6379 is taken on this machine; flatland's own client knows no other")
    results = tmp_path / "r"
    done = arbiter("run", "--quiet", "--tests", tiny_tests, "--results", str(results), "--",
                   sys.executable, "examples/legacy_starter_kit_agent.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    score = read_summary(results)["score"]
    last = done.stdout.splitlines()[-1]  # flatland's client prints its own timing table before it
    assert last == f"submitted: score {score['primary']:.6g}, secondary {score['secondary']:.6g}"


# --- 3 and 4. what a run says, in each format's words ---------------------------------------------


@pytest.mark.alone  # port 6379 (Port6379Busy)
def test_flatland_hints_and_unit_words_for_flatland(redis_url, service_id, tiny_tests, tmp_path):
    with Port6379Busy():
        done = arbiter("run", "--tests", tiny_tests, "--set", "max_episodes=1", "--results", str(tmp_path / "r"),
                       "--", sys.executable, "examples/random_agent.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "arbiter: evaluating 1 episode of " in done.stderr
    assert "(flatland's client: redis://127.0.0." in done.stderr


@pytest.mark.alone  # port 6379 (Port6379Busy)
def test_flatland_s_own_client_reaches_its_run_while_another_holds_127_0_0_1_6379(tiny_tests, tmp_path):
    """A second `arbiter run` on the machine (another evaluation holds 127.0.0.1:6379): its Redis
    listens on port 6379 of the next loopback address, which the agent gets as $redis_ip, so the
    unmodified starter kit reaches this evaluation, not the other one."""
    from arbiter.server.cli.loopback import free_loopback_address

    results = tmp_path / "r"
    with Port6379Busy():
        host = free_loopback_address(6379)
        if host is None:
            pytest.skip("port 6379 is held on every loopback address of this machine")
        done = arbiter("run", "--tests", tiny_tests, "--results", str(results), "--",
                       sys.executable, "examples/legacy_starter_kit_agent.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert host != "127.0.0.1" and f"(flatland's client: redis://{host}:6379/0)" in done.stderr
    assert read_summary(results)["state"] == "SUCCESS" and "is held on every loopback address" not in done.stderr


@pytest.mark.alone  # port 6379 (Port6379Busy)
def test_a_two_phase_run_says_nothing_of_flatland(tmp_path):
    with Port6379Busy():
        done = arbiter("run", "--competition", "two-phase-cartpole", "--phase", "1", "--set", "num_episodes=2",
                       "--results", str(tmp_path / "r"), "--", *REINFORCELAB)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "arbiter: evaluating 2 episodes of CartPole-v1" in done.stderr  # phase 1 alone: no training run
    assert "all 2 episodes evaluated" in read_summary(str(tmp_path / "r"))["termination_cause"]
    assert "flatland" not in done.stderr.lower() and "6379" not in done.stderr


def test_a_metalc_run_counts_datasets(tmp_path):
    meta = tmp_path / "meta"
    assert arbiter("generate", "--format", "metalc", "--out", str(meta), "--datasets", "6").returncode == 0
    done = arbiter("run", "--competition", "metalc-wcci2022", "--tests", str(meta), "--results", str(tmp_path / "r"),
                   "--", sys.executable, "-m", "arbiter.client.metalc", "examples/metalc_agent")  # fmt: skip
    assert done.returncode == 0, done.stderr
    start = done.stderr.splitlines()[0]
    assert start == f"arbiter: evaluating 6 datasets of {meta} (metalc-wcci2022)"
    assert "flatland" not in done.stderr.lower()


# --- 5. a run that cannot start leaves nothing behind ----------------------------------------------


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (["no-such-program-arbiter"], "'no-such-program-arbiter' is not a program on PATH"),
        (
            ["./agent.py"],
            "'./agent.py' names no interpreter in a #! first line (add one, or run it as: python ./agent.py)",
        ),
        (["./missing.py"], "'./missing.py' does not exist"),
    ],
)
def test_an_agent_command_that_cannot_run_is_a_clear_error_and_leaves_no_folder(
    command, error, redis_url, service_id, tiny_tests, tmp_path
):
    (tmp_path / "agent.py").write_text("print('no #! line')\n")
    (tmp_path / "agent.py").chmod(0o755)
    done = arbiter("run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id, "--",
                   *command, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"arbiter: error: cannot start the agent: {error}"
    assert "state:" not in done.stderr and "  #  " not in done.stderr  # no results table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.py"]  # no arbiter-results/run-...


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        (["--set", "budgets.step_s=-1"], "budget step_s must be a positive, finite number of seconds, got -1"),
        (["--step-timeout", "inf"], "budget step_s must be a positive, finite number of seconds, got inf"),
        (["--set", "budgets.idle_s=inf"], "budget idle_s must be a positive, finite number of seconds, got inf"),
        (["--redis-url", "localhost:6379"], "--redis-url 'localhost:6379' is not a Redis URL"),
    ],
)
def test_bad_settings_are_one_clear_line_and_leave_no_folder(setting, error, tiny_tests, tmp_path):
    done = arbiter("run", "--tests", tiny_tests, *setting, "--", sys.executable,
                   str(REPO / "examples" / "random_agent.py"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("arbiter: error: ") and len(done.stderr.splitlines()) == 1
    assert error in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_agent_that_dies_before_playing_gets_no_empty_table(redis_url, service_id, tiny_tests, tmp_path):
    done = arbiter("run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
                   "--results", str(tmp_path / "r"), "--", sys.executable, "-c", "raise SystemExit(3)")  # fmt: skip
    assert done.returncode == 1
    assert "  #  env" not in done.stderr
    assert "state: FAILED - the agent process exited with status 3" in done.stderr
    assert done.stderr.splitlines()[-1] == "arbiter: the agent exited with status 3"


# --- 6. Redis addresses and the defaults --help shows -------------------------------------------


def test_an_empty_or_schemeless_redis_url_is_an_error(service_id, tiny_tests, tmp_path):
    run = arbiter("run", "--redis-url", "", "--service-id", service_id, "--", sys.executable, "-c", "pass",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 2 and run.stderr.startswith("arbiter: error: --redis-url is empty: give a Redis URL")
    serve = arbiter("serve", "--tests", tiny_tests, "--redis-url", "", "--service-id", service_id, cwd=tmp_path)
    assert serve.returncode == 2 and serve.stderr.startswith("arbiter: error: --redis-url is empty")
    watch = arbiter("watch", "--redis-url", "", "--service-id", service_id, "--timeout", "1")
    assert watch.returncode == 2 and watch.stderr.startswith("arbiter: error: --redis-url is empty")
    bare = arbiter("watch", "--redis-url", "localhost:6379", "--service-id", service_id, "--timeout", "1")
    assert bare.returncode == 2
    assert "'localhost:6379' is not a Redis URL: it must start with redis://, rediss:// or unix://" in bare.stderr
    assert list(tmp_path.iterdir()) == []


def option_help(text: str, option: str) -> str:
    """One option's entry in ``--help`` output, its lines joined (a long option's help starts on
    the line after it)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(option + " ")]
    assert len(starts) == 1, f"{option} not in the help"
    entry = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if not line.startswith("   ") or line.lstrip().startswith("-"):
            break
        entry.append(line)
    return " ".join(part.strip() for part in entry)


def test_help_shows_the_defaults_that_apply():
    run, serve = arbiter("run", "--help").stdout, arbiter("serve", "--help").stdout
    budgets = load_competition(DEFAULT_COMPETITION).budgets
    for option, figure in [
        ("--planning-timeout", budgets.planning_s),
        ("--step-timeout", budgets.step_s),
        ("--overall-timeout", budgets.overall_s),
        ("--idle-timeout", budgets.idle_s),
        ("--max-successive-timeouts", budgets.max_successive_timeouts),
        ("--time-bank", budgets.time_bank_s),
    ]:
        for text in (run, serve):
            assert f"the competition's; {figure:g} in {DEFAULT_COMPETITION})" in option_help(text, option)
    for text in (run, serve):
        assert f"(default: {DEFAULT_COMPETITION})" in option_help(text, "--competition")
        assert "(default: $AICROWD_SUBMISSION_ID, else T12345)" in option_help(text, "--service-id")
        assert "(default: arbiter-results/run-<date>-<time> in the current folder" in option_help(text, "--results")
        seed = load_competition(DEFAULT_COMPETITION).seed
        seed_help = option_help(text, "--seed")
        assert (
            f"(default: for Flatland $FLATLAND_EVALUATION_RANDOM_SEED, else the competition's; {seed} in "
            f"{DEFAULT_COMPETITION}" in seed_help
        )
    assert "else a redis-server of its own on port 6379 of 127.0.0.1 or the next" in option_help(run, "--redis-url")
    assert "else redis://$redis_ip:6379/0" in option_help(serve, "--redis-url")
    assert "debug set" in option_help(run, "--tests") and "need one" in option_help(serve, "--tests")


# --- 7. Ctrl-C: one line, not the agent's traceback -----------------------------------------------

PLAIN_AGENT = """
import os, sys, time
from arbiter.client import RemoteClient

def deeper(n):
    if n:
        return deeper(n - 1)
    while True:
        time.sleep(0.05)

client = RemoteClient()
client.env_create()
open(sys.argv[1], "w").close()
deeper(40)  # a KeyboardInterrupt here would print a traceback of some 80 lines
"""


def test_ctrl_c_says_in_one_line_that_the_agent_was_stopped(redis_url, service_id, tiny_tests, tmp_path):
    agent, playing = tmp_path / "agent.py", tmp_path / "playing"
    agent.write_text(PLAIN_AGENT)
    run = subprocess.Popen(
        [*ARBITER, "run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
         "--results", str(tmp_path / "r"), "--", sys.executable, str(agent), str(playing)],
        cwd=REPO, env=SHELL, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        process_group=0,  # a shell's foreground job: Ctrl-C goes to its whole group
    )  # fmt: skip
    try:
        wait_for(playing.exists, timeout_s=60, what="the agent to play")
        os.killpg(run.pid, signal.SIGINT)
        out, err = run.communicate(timeout=30)
    finally:
        end(run)
    assert run.returncode == 130
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out
    assert err.count("interrupted") == 1
    assert err.splitlines()[-2] == "arbiter: interrupted: the agent was stopped"
    assert "state: INTERRUPTED - stopped by SIGINT" in err
    # and how to go on with it: nothing finished is lost
    resume = f"arbiter run --resume --results {tmp_path / 'r'} [the same options] -- {sys.executable} {agent} {playing}"
    assert err.splitlines()[-1] == f"arbiter: to go on from where it stopped: {resume}"


SUBMITTED_AGENT = """
import sys, time
from arbiter.client import RemoteClient

client = RemoteClient()
while client.env_create()[0]:
    while not client.env_step({h: 2 for h in range(client.env.get_num_agents())})[2]["__all__"]:
        pass
client.submit()
open(sys.argv[1], "w").close()
while True:  # slow to exit: Ctrl-C comes first
    time.sleep(0.05)
"""


def test_ctrl_c_after_the_evaluation_ended_suggests_no_resume(redis_url, service_id, tiny_tests, tmp_path):
    agent, submitted = tmp_path / "agent.py", tmp_path / "submitted"
    agent.write_text(SUBMITTED_AGENT)
    run = subprocess.Popen(
        [*ARBITER, "run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
         "--results", str(tmp_path / "r"), "--", sys.executable, str(agent), str(submitted)],
        cwd=REPO, env=SHELL, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        process_group=0,
    )  # fmt: skip
    try:
        wait_for(submitted.exists, timeout_s=60, what="the submit")
        os.killpg(run.pid, signal.SIGINT)
        out, err = run.communicate(timeout=30)
    finally:
        end(run)
    assert "state: SUCCESS" in err
    assert run.returncode == 130, err  # the agent was stopped, it did not crash
    assert err.splitlines()[-1] == "arbiter: interrupted: the agent was stopped"
    assert "--resume" not in err  # the evaluation ended: a resume would be refused


# --- 8. following a run from another terminal -----------------------------------------------------

WAITING_AGENT = """
import os, sys, time
from arbiter.client import RemoteClient

go = sys.argv[1]
while not os.path.exists(go):  # until the test's watchers follow
    time.sleep(0.01)
client = RemoteClient()
while client.env_create()[0]:
    while not client.env_step({h: 2 for h in range(client.env.get_num_agents())})[2]["__all__"]:
        pass
client.submit()
"""


def test_the_printed_watch_command_and_a_bare_watch_follow_the_run(tiny_tests, tmp_path):
    agent, go, runs = tmp_path / "agent.py", tmp_path / "go", tmp_path / "runs"
    agent.write_text(WAITING_AGENT)
    env = {**SHELL, "ARBITER_RUNS_DIR": str(runs)}  # announcements of other runs on this machine stay out
    run = subprocess.Popen(
        [*ARBITER, "run", "--tests", tiny_tests, "--results", str(tmp_path / "r"), "--", sys.executable, str(agent),
         str(go)],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        process_group=0,
    )  # fmt: skip
    watchers: list[subprocess.Popen] = []
    try:
        lines = collect_lines(run.stderr)
        hint = wait_for(lambda: [line for line in lines if "arbiter watch" in line], timeout_s=60, what="the hint")[0]
        command = hint.split("from another terminal: ", 1)[1].strip()
        assert re.fullmatch(r"arbiter watch --redis-url '?unix://\S+'? --service-id T12345", command), command
        for argv in (["bash", "-c", command], ["arbiter", "watch", "--timeout", "30"]):  # pasted; and bare
            watchers.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, process_group=0))  # fmt: skip
        outputs = [collect_lines(watcher.stdout) for watcher in watchers]
        for output in outputs:
            wait_for(lambda output=output: any("budgets:" in line for line in output), what="a watcher to follow")
        go.touch()
        assert run.wait(timeout=60) == 0, "".join(lines)
        for watcher in watchers:
            assert watcher.wait(timeout=30) == 0, watcher.stderr.read()
    finally:
        for process in (run, *watchers):
            end(process)
    for output in outputs:
        text = "".join(output)
        assert "[3/3] Test_0/Level_2.pkl" in text and "state: SUCCESS" in text and "3 of 3 episodes recorded" in text
    assert list(runs.iterdir()) == []  # the announcement went with the run
