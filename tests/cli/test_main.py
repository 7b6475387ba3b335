"""server/cli/main.py: ``arbiter``'s entry point, called in this process: what each setting resolves
to (flag, then environment, then competition), the exit codes, and the one-line errors a bad
setting gets before anything starts. Whole commands as real processes are in tests/cli/test_cli.py
and tests/cli/test_newcomer.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.local_runs import RUNS_DIR_VARIABLE, announce_run, resolve_watched
from arbiter.server.cli.main import EXIT_CODES, agent_ending, main
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import (
    FLATLAND_ENV_BUDGETS,
    FLATLAND_MIN_COMPLETION_VARIABLE,
    FLATLAND_SEED_VARIABLE,
    claim_results,
    resolve_redis_url,
    resolve_spec,
)
from arbiter.server.formats import register_format
from arbiter.server.formats.base import Format, Plan, Rule
from arbiter.server.service.acl import participant_acl


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """None of the variables arbiter reads, whatever the shell running the tests set."""
    for name in (*FLATLAND_ENV_BUDGETS.values(), FLATLAND_SEED_VARIABLE, FLATLAND_MIN_COMPLETION_VARIABLE,
                 "ARBITER_REDIS_URL", "redis_ip",
                 "AICROWD_SUBMISSION_ID", "AICROWD_DEBUG_SUBMISSION", "AICROWD_TESTS_FOLDER"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def args_of(*argv: str):
    return build_parser().parse_args(list(argv))


def error_of(capsys, *argv: str) -> str:
    """The one line ``arbiter`` prints for a bad setting; it must exit with status 2."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("arbiter: error: ") and err.count("\n") == 1, err
    return err


def test_exit_codes_tell_the_evaluations_state():
    assert EXIT_CODES == {"SUCCESS": 0, "FAILED": 1, "INTERRUPTED": 130}


def test_budgets_are_the_flag_then_flatlands_variable_then_the_competitions(monkeypatch):
    competition = resolve_spec(args_of("serve"))
    monkeypatch.setenv("FLATLAND_PER_STEP_TIMEOUT", "7.5")
    monkeypatch.setenv("FLATLAND_MAX_SUCCESSIVE_TIMEOUTS", "4")
    from_environment = resolve_spec(args_of("serve"))
    assert (from_environment.budgets.step_s, from_environment.budgets.max_successive_timeouts) == (7.5, 4)
    assert from_environment.budgets.planning_s == competition.budgets.planning_s
    flagged = resolve_spec(args_of("serve", "--step-timeout", "0.5"))
    assert flagged.budgets.step_s == 0.5 and flagged.budgets.max_successive_timeouts == 4


def test_a_debug_run_is_asked_for_by_flag_or_by_flatlands_variable(monkeypatch):
    assert not resolve_spec(args_of("serve")).debug
    assert resolve_spec(args_of("serve", "--debug")).debug
    monkeypatch.setenv("AICROWD_DEBUG_SUBMISSION", "true")
    assert resolve_spec(args_of("serve")).debug


def test_seed_scoring_record_and_pickle_flags_reach_the_competition():
    spec = resolve_spec(args_of("serve", "--seed", "99", "--scoring", "flatland3", "--record", "2", "--refuse-pickle"))
    assert (spec.seed, spec.scoring, spec.record_episodes, spec.accept_pickle) == (99, "flatland3", 2, False)


def test_the_seed_is_the_flag_then_flatlands_variable_then_the_competitions(monkeypatch, tmp_path):
    assert resolve_spec(args_of("serve")).seed == 1001
    monkeypatch.setenv("FLATLAND_EVALUATION_RANDOM_SEED", "7")
    from_environment = resolve_spec(args_of("serve", "--competition", "flatland3"))
    assert (from_environment.seed, from_environment.seed_fixed) == (7, True)
    own = tmp_path / "own.toml"
    own.write_text('format = "flatland"\nseed = 5\n')
    assert resolve_spec(args_of("serve", "--competition", str(own))).seed == 7
    assert resolve_spec(args_of("serve", "--seed", "3")).seed == 3
    monkeypatch.setenv("FLATLAND_EVALUATION_RANDOM_SEED", "NONE")  # flatland's word for no reset seed
    assert resolve_spec(args_of("serve")).seed is None
    # flatland's variable, for Flatland's envs: another format keeps its own seed
    assert resolve_spec(args_of("serve", "--competition", "two-phase-cartpole")).seed != 7
    monkeypatch.setenv("FLATLAND_EVALUATION_RANDOM_SEED", "seven")
    with pytest.raises(ConfigError, match="FLATLAND_EVALUATION_RANDOM_SEED='seven' is not a whole number or NONE"):
        resolve_spec(args_of("serve"))


def test_flatlands_test_completion_threshold_is_its_variable_then_the_competitions(monkeypatch, tmp_path):
    assert resolve_spec(args_of("serve", "--competition", "flatland3")).options.min_test_completion == 0.25
    own = tmp_path / "own.toml"
    own.write_text('format = "flatland"\nscoring = "flatland3"\nmin_test_completion = 0.5\n')
    assert resolve_spec(args_of("serve", "--competition", str(own))).options.min_test_completion == 0.5
    monkeypatch.setenv("TEST_MIN_PERCENTAGE_COMPLETE_MEAN", "0.1")
    assert resolve_spec(args_of("serve", "--competition", str(own))).options.min_test_completion == 0.1
    assert resolve_spec(args_of("serve", "--competition", "two-phase-cartpole")).format == "two-phase"
    monkeypatch.setenv("TEST_MIN_PERCENTAGE_COMPLETE_MEAN", "most")
    with pytest.raises(ConfigError, match="TEST_MIN_PERCENTAGE_COMPLETE_MEAN='most' is not a float"):
        resolve_spec(args_of("serve"))


def test_the_redis_url_is_the_flag_then_arbiters_variable_then_flatlands_default(monkeypatch):
    assert resolve_redis_url(args_of("serve"), embedded_ok=False) == "redis://127.0.0.1:6379/0"
    assert resolve_redis_url(args_of("run"), embedded_ok=True) is None  # arbiter run starts its own
    monkeypatch.setenv("redis_ip", "10.1.2.3")
    assert resolve_redis_url(args_of("serve"), embedded_ok=False) == "redis://10.1.2.3:6379/0"
    monkeypatch.setenv("ARBITER_REDIS_URL", "unix:///run/redis.sock")
    assert resolve_redis_url(args_of("serve"), embedded_ok=False) == "unix:///run/redis.sock"
    flagged = args_of("serve", "--redis-url", "rediss://cache:6380/1")
    assert resolve_redis_url(flagged, embedded_ok=False) == "rediss://cache:6380/1"


# A serve with no test folder is refused once its other settings pass: one is named (never read).
SOME_TESTS = ("--tests", "a-test-folder")


@pytest.mark.parametrize(
    ("argv", "environment", "message"),
    [
        (["serve", *SOME_TESTS, "--redis-url", "localhost:6379"], {}, "is not a Redis URL"),
        (["serve", *SOME_TESTS, "--redis-url", " "], {}, "--redis-url is empty"),
        (["serve", *SOME_TESTS], {"ARBITER_REDIS_URL": "http://cache"}, "'http://cache' is not a Redis URL"),
        (["serve"], {"FLATLAND_PER_STEP_TIMEOUT": "fast"}, "FLATLAND_PER_STEP_TIMEOUT='fast' is not a float"),
        (["serve"], {"FLATLAND_OVERALL_TIMEOUT": "-5"}, "FLATLAND_OVERALL_TIMEOUT='-5' must be positive"),
        (["serve", *SOME_TESTS, "--service-id", "a b"], {}, "invalid service id"),
        (["serve", "--competition", "no-such-competition"], {}, "unknown competition"),
        (["serve", "--set", "scoring=best"], {}, "unknown scoring rule"),
        (["serve", "--phase", "1"], {}, "--phase: competition 'flatland-neurips2020' (flatland) has no phases"),
        (
            ["run", "--competition", "two-phase-cartpole", "--tests", "t", "--", "a"],
            {},
            "--tests: format 'two-phase' reads no test folder",
        ),
        (
            ["serve", "--competition", "diambra", "--set", "tests=t"],
            {},
            "key 'tests': format 'diambra' reads no test folder",
        ),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_status_2(capsys, monkeypatch, argv, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert message in error_of(capsys, *argv)


class Unscored(Rule):
    name = "any"

    def aggregate(self, records: list[dict]) -> dict:
        return {}  # nothing is scored here: serve stops before any item


def test_a_format_that_plays_a_test_folder_is_told_where_its_own_folder_is_set(capsys, monkeypatch, tmp_path):
    """Flatland's variable names no test folder of another format: serve does not offer it."""
    register_format(
        "folder-only", Format(name="folder-only", rules={"any": Unscored}, make_plan=Plan, requires_tests=True)
    )
    competition = tmp_path / "folder-only.toml"
    competition.write_text('format = "folder-only"\n', encoding="utf-8")
    monkeypatch.setenv("AICROWD_TESTS_FOLDER", str(tmp_path))
    error = error_of(capsys, "serve", "--competition", str(competition), "--redis-url", "redis://127.0.0.1:1/0")
    assert "needs --tests DIR or the competition's tests key: format 'folder-only' plays a test folder" in error
    monkeypatch.delenv("AICROWD_TESTS_FOLDER")
    flatland = error_of(capsys, "serve", "--redis-url", "redis://127.0.0.1:1/0")
    assert "or the competition's tests key (or AICROWD_TESTS_FOLDER): format 'flatland'" in flatland


def test_serve_needs_a_test_folder_for_flatland_and_its_results_folder_to_resume(capsys, tmp_path):
    assert "arbiter serve needs --tests DIR" in error_of(capsys, "serve", "--redis-url", "redis://127.0.0.1:1/0")
    tests = str(tmp_path)
    error = error_of(capsys, "serve", "--tests", tests, "--redis-url", "redis://127.0.0.1:1/0", "--resume")
    assert "--resume needs the --results folder" in error
    # A folder with no evaluation yet (its evaluator killed before its first write, or a wrong
    # path): said before the new evaluation starts (here it cannot: no Redis at that address).
    empty = tmp_path / "nothing-here"
    assert main(["serve", "--tests", tests, "--redis-url", "redis://127.0.0.1:1/0", "--resume",
                 "--results", str(empty)]) == 2  # fmt: skip
    said = capsys.readouterr().err.splitlines()
    assert said[0] == (f"arbiter: --resume: {empty} holds no evaluation yet (no events.jsonl or episodes.jsonl); "
                       "a new one starts there")  # fmt: skip
    assert said[1].startswith("arbiter: error: ")


def test_acl_prints_the_rule_in_the_format_asked_for(capsys):
    assert main(["acl", "--service-id", "svc", "--password", "pw"]) == 0
    assert capsys.readouterr().out.split() == participant_acl("svc", "pw")
    assert main(["acl", "--service-id", "svc", "--password", "pw", "--format", "config"]) == 0
    assert capsys.readouterr().out.split() == ["user", *participant_acl("svc", "pw")[2:]]


def test_report_of_a_folder_that_is_not_one_is_an_error(capsys, tmp_path):
    assert "no such directory" in error_of(capsys, "report", str(tmp_path / "missing"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert f"{a_file} is not a results folder (a file)" in error_of(capsys, "report", str(a_file))
    assert f"results folder '{a_file}' is a file, not a folder" in error_of(capsys, "rescore", str(a_file))
    out = tmp_path / "out"
    (out / "something").mkdir(parents=True)
    assert f"{out} exists and is not empty; give --overwrite" in error_of(capsys, "generate", "--out", str(out))


def test_report_says_where_it_wrote_the_page(capsys, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"state": "FAILED", "termination_cause": "test"}))
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "page.html")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'page.html'}\n"
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("status", "interrupted", "said"),
    [
        (0, False, None),
        (None, False, None),
        (3, False, "the agent exited with status 3"),
        (-signal.SIGKILL, False, f"the agent exited with status {-signal.SIGKILL} (killed by SIGKILL)"),
        (0, True, "interrupted: the agent was stopped"),
        (None, True, "interrupted before the agent started"),
    ],
)
def test_how_the_agent_ended_in_words(status, interrupted, said):
    assert agent_ending(status, interrupted=interrupted) == said


def test_watch_follows_the_one_local_run_and_lists_several_without_their_passwords(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RUNS_DIR_VARIABLE, str(tmp_path / "runs"))
    assert resolve_watched(args_of("watch")) == ("redis://127.0.0.1:6379/0", "T12345")  # none: flatland's default
    announce_run("redis://:s3cret@127.0.0.1:7000/0", "mine", str(tmp_path))
    assert resolve_watched(args_of("watch")) == ("redis://:s3cret@127.0.0.1:7000/0", "mine")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(tmp_path, "runs", f"{other.pid}.json"), "w", encoding="utf-8") as handle:
            json.dump({"pid": other.pid, "redis_url": "redis://:other-pw@127.0.0.1:7001/0", "service_id": "theirs"},
                      handle)  # fmt: skip
        capsys.readouterr()
        assert main(["watch"]) == 2
        error = capsys.readouterr().err
        assert error.startswith("arbiter: error: 2 local runs are going on")
        assert "--service-id mine" in error and "--service-id theirs" in error
        assert "s3cret" not in error and "other-pw" not in error
        # Naming the service id picks one of them.
        picked = resolve_watched(args_of("watch", "--service-id", "theirs"))
        assert picked == ("redis://:other-pw@127.0.0.1:7001/0", "theirs")
    finally:
        other.kill()
        other.wait()


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`arbiter ... | head`: once the reader has closed the pipe, the command ends as a writer
    killed by SIGPIPE would (128 + 13), with no traceback."""
    command = [sys.executable, "-m", "arbiter.server.cli", "acl", "--service-id", "s", "--password", "p"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before anything is written
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGPIPE
    assert errors == b""


def test_a_folder_that_cannot_be_written_is_one_line_and_exit_status_2(capsys, tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    (results / "summary.json").write_text(json.dumps({"state": "SUCCESS", "format": "two-phase"}))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert main(["report", str(results), "--out", str(blocked / "report.html")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("arbiter: error: ") and str(blocked) in error and "Traceback" not in error


def test_redis_refusing_is_one_line_and_exit_status_2(capsys, redis_server):
    """A database index the server does not have: Redis refuses it at the first command."""
    assert main(["submissions", "--redis-url", f"redis://127.0.0.1:{redis_server.port}/999"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("arbiter: error: Redis refused: ") and "DB index" in error


def test_run_into_a_folder_holding_an_evaluation_is_refused_and_loses_nothing(capsys, tmp_path):
    results = tmp_path / "r"
    (results / "replays").mkdir(parents=True)
    (results / "episodes.jsonl").write_text('{"index": 0}\n')
    (results / "replays" / "0.json").write_text("{}")
    argv = ["run", "--competition", "two-phase-cartpole", "--results", str(results), "--", sys.executable, "-c", ""]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"arbiter: error: {results} already holds an evaluation's results (episodes.jsonl)")
    assert (
        f"go on with the evaluation it holds (arbiter run --resume --results {results}, with the same options)" in error
    )
    assert (results / "episodes.jsonl").read_text() == '{"index": 0}\n' and (results / "replays" / "0.json").exists()


def test_a_local_run_keeps_its_seed_for_a_resume_with_the_same_options(tmp_path):
    """`arbiter run` writes its (public) seed beside its results, so `arbiter serve --resume` with
    the same options resets with it; a two-phase seed is secret to a hosted evaluation, which
    without it would refuse to resume episodes played with an unknown seed."""
    from arbiter.server.core.competition import load_competition
    from arbiter.server.core.seeds import persisted_seed, read_persisted_seed

    results = tmp_path / "r"
    agent = [sys.executable, "-c", "from arbiter.client import RemoteEnv; RemoteEnv().reset()"]
    argv = ["run", "--competition", "two-phase-cartpole", "--phase", "1", "--results", str(results), "--quiet", "--"]
    main([*argv, *agent])  # the agent plays nothing and exits: the evaluation ends, its seed stays
    spec = load_competition("two-phase-cartpole")
    assert read_persisted_seed(str(results)) == {"seed": spec.seed, "drawn": False, "tests": None}
    assert persisted_seed(str(results), spec, resume=True, hosted=True).seed == spec.seed


def test_the_default_results_folder_is_new_even_for_runs_started_in_the_same_second(tmp_path, monkeypatch):
    """Claimed by making it: the first claim makes arbiter-results/ too (removed with the run's
    folder if the run fails before it starts), the next ones only their own folder."""
    monkeypatch.chdir(tmp_path)
    first, first_made = claim_results(args_of("run", "--", "agent"))
    second, second_made = claim_results(args_of("run", "--", "agent"))
    assert first.startswith(os.path.join("arbiter-results", "run-")) and second != first
    assert second == first + "-2" or second[len("arbiter-results/run-") :] > first[len("arbiter-results/run-") :]
    assert os.path.isdir(first) and os.path.isdir(second)
    assert (first_made, second_made) == ("arbiter-results", second)
    # A folder given is made by the evaluation, not before; it is named as the one to remove on a failure.
    assert claim_results(args_of("run", "--results", "mine", "--", "agent")) == ("mine", str(tmp_path / "mine"))
    assert not os.path.exists("mine")
    assert claim_results(args_of("run", "--results", ".", "--", "agent")) == (".", None)  # there already


def test_runs_started_together_each_get_their_own_folder_and_redis(tmp_path):
    """Three `arbiter run`s at once from one folder: each claims a results folder and a port of
    its own (not two on one folder, none failing on a port another took first)."""
    command = [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "two-phase-cartpole", "--phase",
               "1", "--set", "num_episodes=2", "--quiet", "--", sys.executable, "-c", PHASE_ONE_AGENT]  # fmt: skip
    runs = [
        subprocess.Popen(command, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)
    ]
    try:
        ended = [(run.wait(timeout=120), run.stderr.read().decode()) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert [status for status, _ in ended] == [0, 0, 0], ended
    folders = sorted((tmp_path / "arbiter-results").iterdir())
    assert len(folders) == 3
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["state"] == "SUCCESS" and summary["episodes"]["recorded"] == 2


def test_a_wrong_redis_password_is_one_line_and_exit_status_2_at_once(capsys, tmp_path):
    from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port

    with EmbeddedRedis(port=free_port(), password="right") as server:
        argv = ["serve", "--competition", "two-phase-cartpole", "--results", str(tmp_path / "r"), "--quiet",
                "--redis-url", f"redis://:wrong@127.0.0.1:{server.port}/0"]  # fmt: skip
        assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("arbiter: error: Redis refused the user or password") and "wrong" not in error


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_exit_status_130():
    """The `arbiter` command loads its modules when called; an interrupt meanwhile is said the way
    one during a command is, not with a traceback of the import. In a process of its own: the
    entry point is the package's ``main``, which importing the module of the same name hides."""
    program = """
import sys, types

class LoadingInterrupted(types.ModuleType):
    def __getattr__(self, name):
        if name == "main":  # what the command imports
            raise KeyboardInterrupt
        raise AttributeError(name)

sys.modules["arbiter.server.cli.main"] = LoadingInterrupted("arbiter.server.cli.main")
from arbiter.server.cli import main
sys.exit(main(["acl", "--help"]))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "arbiter: interrupted\n")


PHASE_ONE_AGENT = """
from arbiter.client import RemoteEnv

env = RemoteEnv()
while True:
    observation, info = env.reset()
    if env.finished:
        break
    done = False
    while not done:
        observation, reward, terminated, truncated, info = env.step(int(observation[2] > 0))
        done = terminated or truncated
env.submit()
"""


def test_progress_lines_nobody_reads_any_more_never_fail_the_evaluation(tmp_path):
    """`arbiter run ... 2>&1 | head -1`: the reader goes away after the first line; the evaluation
    goes on to its end, its results whole."""
    results = tmp_path / "r"
    run = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "two-phase-cartpole", "--phase", "1",
         "--set", "num_episodes=4", "--results", str(results), "--", sys.executable, "-c", PHASE_ONE_AGENT],
        cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert run.stderr.readline().startswith(b"arbiter: evaluating")
        run.stderr.close()  # the reader is gone: every progress line from now on meets a closed pipe
        assert run.wait(timeout=120) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    summary = json.loads((results / "summary.json").read_text())
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 4


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_results_folder_that_is_or_lies_under_a_file_is_refused_before_anything_starts(capsys, tmp_path, command):
    """The system's own error ("File exists", "Not a directory") named neither --results nor what to do."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept\n")
    agent = ["--", sys.executable, "-c", "pass"] if command == "run" else []
    start = [command, "--competition", "two-phase-cartpole", "--redis-url", "redis://127.0.0.1:1/0"]
    if command == "run":
        start = start[:-2]  # its own Redis: nothing is started before the folder is checked
    error = error_of(capsys, *start, "--results", str(a_file), *agent)
    assert f"--results {a_file} is a file, not a folder" in error
    error = error_of(capsys, *start, "--results", str(a_file / "sub"), *agent)
    assert f"--results {a_file / 'sub'}: {a_file} is a file, so no folder can be made under it" in error
    assert a_file.read_text() == "kept\n" and os.listdir(tmp_path) == ["notes.txt"]


def test_generate_overwrite_replaces_a_folder_of_data_never_a_file_nor_the_folder_one_is_in(
    capsys, tmp_path, monkeypatch
):
    """--overwrite removed a file at --out to put a folder in its place; given the current folder,
    it failed half way ("Device or resource busy") and left a stray folder in it."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept\n")
    generate = ["generate", "--format", "metalc", "--datasets", "6", "--algorithms", "1", "--overwrite", "--out"]
    assert f"{a_file} is a file, not a folder: give another --out" in error_of(capsys, *generate, str(a_file))
    assert a_file.read_text() == "kept\n"
    inner = tmp_path / "work" / "inner"
    inner.mkdir(parents=True)
    (inner / "kept.txt").write_text("kept\n")
    monkeypatch.chdir(inner)
    for out in (".", ".."):
        assert f"{out} holds the current folder, which --overwrite would remove" in error_of(capsys, *generate, out)
    assert sorted(os.listdir(inner)) == ["kept.txt"] and os.listdir(inner.parent) == ["inner"]
    data = tmp_path / "work" / "data"
    data.mkdir()
    (data / "old.txt").write_text("")
    assert main([*generate, str(data)]) == 0
    assert "old.txt" not in os.listdir(data)  # a folder of data beside it is replaced whole, as ever


def test_several_local_runs_are_listed_with_their_results_folders(tmp_path, monkeypatch, capsys):
    """Two runs under the default service id gave two lines that differed only in a socket path."""
    monkeypatch.setenv(RUNS_DIR_VARIABLE, str(tmp_path / "runs"))
    announce_run("unix:///tmp/a/redis.sock?db=0", "T12345", str(tmp_path / "first"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(tmp_path, "runs", f"{other.pid}.json"), "w", encoding="utf-8") as handle:
            run = {"pid": other.pid, "redis_url": "unix:///tmp/b/redis.sock?db=0", "service_id": "T12345"}
            json.dump({**run, "results": str(tmp_path / "second")}, handle)
        assert main(["watch"]) == 2
        lines = capsys.readouterr().err.splitlines()[1:]
        said = sorted(line.rpartition("  # results in ")[2] for line in lines)
        assert said == [str(tmp_path / "first"), str(tmp_path / "second")]
        assert all(line.startswith("  arbiter watch --redis-url ") for line in lines)
    finally:
        other.kill()
        other.wait()


def test_watch_with_no_run_going_on_and_nothing_at_flatlands_redis_says_so(tmp_path, monkeypatch, capsys):
    """What a watcher sees after their run ended: not only "cannot reach Redis at 127.0.0.1:6379"."""
    monkeypatch.setenv(RUNS_DIR_VARIABLE, str(tmp_path / "runs"))
    monkeypatch.delenv("ARBITER_REDIS_URL", raising=False)
    monkeypatch.setenv("redis_ip", "127.0.0.254")  # nothing listens there
    error = error_of(capsys, "watch", "--service-id", "mine", "--timeout", "1")
    assert "no arbiter run of yours with service id 'mine' is going on" in error
    assert "no Redis answers at redis://127.0.0.254:6379/0, flatland's default" in error
    assert "give the evaluation's --redis-url and --service-id" in error


def test_a_server_that_is_not_redis_is_said_as_such(capsys):
    """A web server on the port given answered "Redis refused: Protocol error, got "H" ...", as if
    Redis had refused a command."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer_as_a_web_server() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(1024)
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    answering = threading.Thread(target=answer_as_a_web_server, daemon=True)
    answering.start()
    try:
        assert main(["submissions", "--redis-url", f"redis://127.0.0.1:{server.getsockname()[1]}/0"]) == 2
    finally:
        answering.join(timeout=10)
        server.close()
    error = capsys.readouterr().err
    assert error.startswith("arbiter: error: what answers at the Redis URL's address is not Redis (")
