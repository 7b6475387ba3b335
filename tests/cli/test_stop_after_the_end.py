"""A stop signal that reaches `arbiter serve` once its evaluation has ended (the summary written,
the submit answered) changes nothing: the exit status is still the evaluation's. While the
interpreter exits, a stop signal would otherwise act by default and end the process by it."""

from __future__ import annotations

import signal
import subprocess
import sys

import paths
from harness import play_episode, read_summary

from arbiter.client import RemoteClient


def test_stop_signals_as_serve_exits_leave_its_exit_status(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "results")
    evaluator = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", results, "--quiet"],
        cwd=str(paths.REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=20)
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        signals = 0
        while evaluator.poll() is None:  # a stop every 2 ms, until the evaluator has exited
            evaluator.send_signal((signal.SIGTERM, signal.SIGINT, signal.SIGHUP)[signals % 3])
            signals += 1
            try:
                evaluator.wait(timeout=0.002)
            except subprocess.TimeoutExpired:
                pass
        said = evaluator.stdout.read().decode()
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    assert signals > 0
    assert read_summary(results)["state"] == "SUCCESS"
    assert evaluator.returncode == 0, said
