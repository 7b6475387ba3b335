"""A killed `arbiter run` continued by `arbiter serve --resume` given the results folder and the
same Redis, not its test folder: the folder the run played comes from `seed.json`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import paths
from harness import play_episode, read_episodes, read_summary, wait_for

from arbiter.client import RemoteClient

ARBITER = [sys.executable, "-m", "arbiter.server.cli"]

# Plays the first episode, asks for the second (its reply comes once the first is durable), then
# waits to be killed with the run.
FIRST_EPISODE_AGENT = """
import time
from arbiter.client import RemoteClient

client = RemoteClient()
client.env_create()
while not client.env_step({handle: 2 for handle in client.env.get_agent_handles()})[2]["__all__"]:
    pass
client.env_create()
time.sleep(120)
"""


def test_serve_resume_plays_the_test_folder_a_killed_local_run_started_on(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "r"
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    run = subprocess.Popen(
        [*ARBITER, "run", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
         "--results", str(results), "--quiet", "--", sys.executable, "-c", FIRST_EPISODE_AGENT],
        cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment,
    )  # fmt: skip
    try:
        wait_for(lambda: len(read_episodes(str(results), missing_ok=True)) == 1, what="the first episode's record")
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert json.loads((results / "seed.json").read_text())["tests"] == os.path.abspath(tiny_tests)

    serve = subprocess.Popen(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id, "--quiet"],
        cwd=str(paths.REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.3)
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        assert serve.wait(timeout=60) == 0
        stderr = serve.stderr.read()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert f"playing the test folder the evaluation started on, {os.path.abspath(tiny_tests)}" in stderr
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["episodes"]["recorded"] == 3
    assert [record["index"] for record in read_episodes(str(results))] == [0, 1, 2]


def test_serve_resume_without_tests_or_a_recorded_folder_asks_for_them(redis_url, service_id, tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    (results / "seed.json").write_text(json.dumps({"seed": 1001, "drawn": False}) + "\n")  # as written before
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    done = subprocess.run(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id],
        capture_output=True, text=True, timeout=60, env=environment,
    )  # fmt: skip
    assert done.returncode == 2
    assert "arbiter: error: arbiter serve needs --tests DIR (or AICROWD_TESTS_FOLDER)" in done.stderr


def test_serve_resume_on_another_test_folder_than_the_evaluation_started_on_is_refused(redis_url, service_id, tmp_path):
    """Item names match across test sets (Test_0/Level_0.pkl); the data behind them need not."""
    results = tmp_path / "r"
    results.mkdir()
    started_on = tmp_path / "tests-a"
    (results / "seed.json").write_text(json.dumps({"seed": 1001, "drawn": False, "tests": str(started_on)}) + "\n")
    (results / "events.jsonl").write_text("")
    done = subprocess.run(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id, "--tests", str(tmp_path / "tests-b")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        f"--resume: the evaluation started on the test folder {started_on}, not {tmp_path / 'tests-b'}" in done.stderr
    )
    assert sorted(p.name for p in results.iterdir()) == ["events.jsonl", "seed.json"]  # nothing touched
