"""client/metalc_process.py: the MetaLC runner's side of a fold. Each fold's agent runs in a real
process of its own, in a fresh copy of the submission folder with a home and temporary folder of
its own and none of arbiter's connection variables (the runner hands it the session over its
pipe); what it leaves is removed with it, and what it says is checked before it is used. The whole runner against a real
evaluator is in tests/formats/metalc (test_metalc_runner.py, test_metalc_e2e.py,
test_metalc_isolation.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest
from harness import wait_for

from arbiter.client import metalc_process as fold_side
from arbiter.client.metalc_play import TIMED
from arbiter.client.metalc_process import FOLD_FOLDER_PREFIX, FoldProcess, Submission, remove_abandoned_folds
from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError, OutOfOrder

# An agent that reports, from inside its fold's process, what it finds there: it is told to fail
# in Agent(), and its error's text is what the runner hears.
AGENT = textwrap.dedent(
    """
    import json, os, random, signal, sys, tempfile

    LEFT_BEHIND = os.path.exists("written-by-an-earlier-fold")
    with open("written-by-an-earlier-fold", "w") as handle:
        handle.write("a fold's memory")


    class Agent:
        def __init__(self, number_of_algorithms):
            raise RuntimeError(json.dumps({
                "cwd": os.getcwd(),
                "home": os.environ.get("HOME"),
                "tmp": tempfile.gettempdir(),
                "left_behind": LEFT_BEHIND,
                "own_group": os.getpgid(0) == os.getpid() == os.getsid(0),
                "default_stop": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                "stdin": sys.stdin.read(),
                "draw": random.random(),
                "redis": [name for name in ("ARBITER_REDIS_URL", "AICROWD_SUBMISSION_ID", "redis_ip")
                          if name in os.environ],
            }))
    """
)

START = {
    "module": "agent",
    "seeding": {"seed": 1},
    "seed_before_import": False,
    "algorithms": ["0"],
    "algorithms_meta_features": {"0": {}},
}


@pytest.fixture
def submission(tmp_path, monkeypatch) -> Submission:
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "agent.py").write_text(AGENT)
    for name in ("ARBITER_REDIS_URL", "AICROWD_SUBMISSION_ID", "redis_ip"):
        monkeypatch.setenv(name, "the evaluator's address")
    return Submission.checked(str(folder))


def what_the_fold_saw(fold: FoldProcess) -> dict:
    fold.request(["start", START], "imported")
    failure = r"the agent failed: RuntimeError in Agent\(\) or meta_train\(\)"
    # the session is never used: the agent fails before its first step
    session = Wire("redis://127.0.0.1:9/0", "T1").hand_over()
    with pytest.raises(ArbiterError, match=failure) as failed:
        fold.request(["play", {"session": session, "body": {"arbiter": {"meta_train": {}}}}], "played")
    return json.loads(str(failed.value).split("meta_train(): ", 1)[1])


def test_a_submission_folder_must_hold_its_agent_module(tmp_path):
    with pytest.raises(ArbiterError, match="no submission folder"):
        Submission.checked(str(tmp_path / "missing"))
    with pytest.raises(ArbiterError, match=f"no agent.py in {tmp_path}"):
        Submission.checked(str(tmp_path))
    (tmp_path / "policy.py").write_text("")
    assert Submission.checked(str(tmp_path), "policy") == Submission(str(tmp_path), "policy")


@pytest.mark.parametrize("forks", [True, False], ids=["forked", "interpreter"])
def test_a_fold_runs_in_folders_of_its_own_without_the_evaluators_address(submission, forks, monkeypatch):
    # the runner's own state, which a forked fold's process must not keep
    monkeypatch.setattr(tempfile, "tempdir", tempfile.gettempdir())
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        fold = FoldProcess(submission, "run 0, fold 0", forks=forks)
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        seen = what_the_fold_saw(fold)
    finally:
        fold.close()
    assert seen["cwd"] == os.path.join(fold.root, "submission") != submission.folder
    assert seen["home"] == os.path.join(fold.root, "home") and seen["tmp"] == os.path.join(fold.root, "tmp")
    assert seen["redis"] == [] and seen["left_behind"] is False
    assert seen["own_group"] and seen["default_stop"] and seen["stdin"] == ""
    assert not os.path.exists(fold.root)  # removed with the fold
    assert not os.path.exists(os.path.join(submission.folder, "written-by-an-earlier-fold"))


def test_forked_folds_draw_unseeded_numbers_of_their_own(submission):
    """Each fold's generators start from the system, as a fresh interpreter's, not from one state
    forked again and again."""
    draws = set()
    for label in ("run 0, fold 0", "run 0, fold 1"):
        fold = FoldProcess(submission, label, forks=True)
        try:
            draws.add(what_the_fold_saw(fold)["draw"])
        finally:
            fold.close()
    assert len(draws) == 2


def test_the_next_fold_finds_nothing_the_last_one_left(submission):
    for label in ("run 0, fold 0", "run 0, fold 1"):
        fold = FoldProcess(submission, label)
        try:
            assert what_the_fold_saw(fold)["left_behind"] is False, label
        finally:
            fold.close()


def test_a_fold_that_ends_without_answering_is_said_so(tmp_path):
    (tmp_path / "agent.py").write_text("import os\nos._exit(7)\n")
    fold = FoldProcess(Submission.checked(str(tmp_path)), "run 1, fold 2")
    try:
        with pytest.raises(ArbiterError, match=r"run 1, fold 2: the agent's process ended without answering"):
            fold.request(["start", START], "imported")
    finally:
        fold.close()


def test_the_folders_of_runners_that_died_are_removed_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f"{FOLD_FOLDER_PREFIX}{dead.pid}-x1"
    running = tmp_path / f"{FOLD_FOLDER_PREFIX}{os.getpid()}-x2"
    unrelated = tmp_path / f"{FOLD_FOLDER_PREFIX}notapid-x3"
    for folder in (abandoned, running, unrelated):
        folder.mkdir()
    remove_abandoned_folds()
    assert not abandoned.exists() and running.exists() and unrelated.exists()


@pytest.mark.parametrize(
    "answer",
    [
        ["played", {"seq": 3}],  # nothing of how it went
        ["played", {"seq": "3", "datasets": 1, "timeouts": [], "round_trips": {}}],
        ["played", {"seq": 3, "datasets": 1, "timeouts": [7], "round_trips": {}}],
        ["played", {"seq": 3, "datasets": 1, "timeouts": [], "round_trips": {"step": {"count": 1}}}],
        ["refused", {"seq": 3, "message": "no kind"}],
        ["restarted", {"seq": 3}],
        ["imported", "and more"],
    ],
)
def test_what_a_folds_process_says_is_checked_before_it_is_used(answer):
    assert not fold_side._well_formed(answer)


def test_a_well_formed_play_answer_passes():
    trips = {kind: {"count": 1, "total_s": 0.5, "samples": [0.5]} for kind in TIMED}
    assert fold_side._well_formed(["played", {"seq": 3, "datasets": 1, "timeouts": ["t"], "round_trips": trips}])
    assert fold_side._well_formed(["refused", {"seq": 3, "kind": "OutOfOrder", "message": "m"}])


def test_a_refusal_told_by_a_fold_is_raised_as_its_class_and_anything_else_as_an_arbiter_error():
    assert type(fold_side.refusal("OutOfOrder", "late")) is OutOfOrder
    assert str(fold_side.refusal("ServerUnavailable", "gone")) == "gone"
    for kind in ("KeyError", "os", "no such name", "Limits"):
        error = fold_side.refusal(kind, "m")
        assert type(error) is ArbiterError and str(error) == "m"


@pytest.mark.parametrize(("variable", "forked"), [(None, True), ("1", True), ("0", False)])
def test_folds_are_forked_on_linux_unless_the_environment_says_otherwise(submission, monkeypatch, variable, forked):
    if variable is None:
        monkeypatch.delenv(fold_side.FORK_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(fold_side.FORK_VARIABLE, variable)
    fold = FoldProcess(submission, "run 0, fold 0")

    def command_line() -> list[bytes]:
        with open(f"/proc/{fold.pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")

    try:
        wait_for(lambda: command_line() != [b""], what="the process's command line (empty while it execs)")
        started_as = command_line()
    finally:
        fold.close()
    if forked:  # a fork runs as this process, whatever started it (a pytest-xdist worker runs with -c)
        with open("/proc/self/cmdline", "rb") as handle:
            assert started_as == handle.read().split(b"\0")
    else:  # a fresh interpreter runs BOOT
        assert started_as[1:3] == [b"-c", fold_side.BOOT.encode()]
