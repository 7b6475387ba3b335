"""server/cli/local_runs.py: how ``arbiter run`` announces itself and ``arbiter watch`` finds it.

The announcements live in a real folder (``$ARBITER_RUNS_DIR`` pointed at the test's own); the
processes whose liveness is checked are real ones, started and reaped here. ``arbiter watch``
following such a run end to end is in tests/cli/test_watch.py.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys

import pytest

from arbiter.server.cli.local_runs import (
    RUNS_DIR_VARIABLE,
    announce_run,
    local_runs,
    runs_folder,
    watch_command,
    withdraw_run,
)


@pytest.fixture
def folder(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "runs")
    monkeypatch.setenv(RUNS_DIR_VARIABLE, path)
    return path


def exited_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_runs_folder_is_the_variables_then_the_runtime_folders_then_a_temporary_one(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_VARIABLE, str(tmp_path / "chosen"))
    assert runs_folder() == str(tmp_path / "chosen")
    monkeypatch.delenv(RUNS_DIR_VARIABLE)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runs_folder() == str(tmp_path / "arbiter-runs")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert runs_folder().endswith(f"arbiter-runs-{os.getuid()}")


def test_an_announcement_is_private_and_names_the_run(folder, tmp_path):
    path = announce_run("redis://127.0.0.1:7000/0", "svc-1", str(tmp_path / "results"))
    assert path == os.path.join(folder, f"{os.getpid()}.json")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path, encoding="utf-8") as handle:
        assert json.load(handle) == {
            "pid": os.getpid(),
            "redis_url": "redis://127.0.0.1:7000/0",
            "service_id": "svc-1",
            "results": str(tmp_path / "results"),
        }
    assert os.listdir(folder) == [f"{os.getpid()}.json"]  # no part file left behind


def test_a_live_run_is_found_and_a_withdrawn_one_is_not(folder, tmp_path):
    path = announce_run("redis://127.0.0.1:7000/0", "svc-1", str(tmp_path))
    [run] = local_runs()
    assert (run["pid"], run["service_id"]) == (os.getpid(), "svc-1") and run["started"] > 0
    withdraw_run(path)
    withdraw_run(path)  # twice is harmless (the run's exit and its cleanup may both do it)
    withdraw_run(None)
    assert local_runs() == []


def test_the_announcement_of_a_dead_run_is_removed_by_the_next_reader(folder):
    os.makedirs(folder, mode=0o700)
    dead = os.path.join(folder, "dead.json")
    with open(dead, "w", encoding="utf-8") as handle:
        json.dump({"pid": exited_pid(), "redis_url": "redis://127.0.0.1:7001/0", "service_id": "gone"}, handle)
    assert local_runs() == [] and not os.path.exists(dead)


def test_runs_are_listed_oldest_first(folder, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        own = announce_run("redis://127.0.0.1:7000/0", "newer", str(tmp_path))
        older = os.path.join(folder, f"{sleeper.pid}.json")
        with open(older, "w", encoding="utf-8") as handle:
            json.dump({"pid": sleeper.pid, "redis_url": "redis://127.0.0.1:7002/0", "service_id": "older"}, handle)
        os.utime(older, (os.path.getmtime(own) - 60,) * 2)
        assert [run["service_id"] for run in local_runs()] == ["older", "newer"]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    "text", ["not json", "[1, 2]", '{"pid": 1}', '{"pid": "me", "redis_url": "redis://x"}', '{"redis_url": 5}']
)
def test_an_announcement_that_is_not_one_is_skipped(folder, text):
    os.makedirs(folder, mode=0o700)
    with open(os.path.join(folder, "odd.json"), "w", encoding="utf-8") as handle:
        handle.write(text)
    assert local_runs() == []


def test_a_folder_others_can_open_is_neither_written_nor_read(folder, tmp_path):
    os.makedirs(folder, mode=0o700)
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w", encoding="utf-8") as handle:
        json.dump({"pid": os.getpid(), "redis_url": "redis://planted:6379/0", "service_id": "planted"}, handle)
    os.chmod(folder, 0o777)
    assert local_runs() == []
    assert announce_run("redis://127.0.0.1:7000/0", "svc", str(tmp_path)) is None


def test_the_watch_command_is_ready_to_paste_into_a_shell():
    command = watch_command("redis://:p@ss w0rd@127.0.0.1:7000/0", "svc;rm -rf ~")
    assert shlex.split(command) == [
        "arbiter",
        "watch",
        "--redis-url",
        "redis://:p@ss w0rd@127.0.0.1:7000/0",
        "--service-id",
        "svc;rm -rf ~",
    ]
