"""An `arbiter serve` stopped by a signal (SIGTERM) tells its agent: a request that comes after the
evaluator exited, or one already waiting for its reply as it stopped, raises the ending in the
client at once (when its reply is late), instead of waiting out the client's reply timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import paths
import pytest
from harness import play_episode, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.protocol.errors import EvaluationError

REPLY_TIMEOUT_S = 20.0  # what a request would wait without the notice: far over the budgets below
STOPPED = r"the evaluation has ended \(INTERRUPTED\): stopped by SIGTERM"


def serve(tests: str, redis_url: str, service_id: str, results: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", results, "--quiet"],
        cwd=str(paths.REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def played_to_the_end(redis_url: str, service_id: str) -> RemoteClient:
    client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=REPLY_TIMEOUT_S,
                          resend_after_s=0.2)  # fmt: skip
    while client.env_create()[0]:
        play_episode(client, client.episode_index)
    return client


def stopped(evaluator: subprocess.Popen) -> None:
    evaluator.send_signal(signal.SIGTERM)
    assert evaluator.wait(timeout=10) == 130


def test_a_submit_after_the_evaluator_stopped_is_told_at_once(redis_url, service_id, tiny_tests, tmp_path):
    evaluator = serve(tiny_tests, redis_url, service_id, str(tmp_path / "r"))
    try:
        client = played_to_the_end(redis_url, service_id)
        stopped(evaluator)
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    asked = time.monotonic()
    with pytest.raises(EvaluationError, match=STOPPED):
        client.submit()
    assert time.monotonic() - asked < 0.5


def test_a_submit_waiting_as_the_evaluator_stops_is_told_when_its_reply_is_late(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    """The submit is queued while the evaluator is held (SIGSTOP), then the evaluator is stopped:
    the client looked at the errors list before the notice was there, and learns it at its next
    look, when its reply is late."""
    evaluator = serve(tiny_tests, redis_url, service_id, str(tmp_path / "r"))
    outcome: dict = {}
    try:
        client = played_to_the_end(redis_url, service_id)
        evaluator.send_signal(signal.SIGSTOP)

        def submit() -> None:
            try:
                outcome["reply"] = client.submit()
            except Exception as exc:  # what the test looks at
                outcome["error"] = exc
            outcome["at"] = time.monotonic()

        asking = threading.Thread(target=submit)
        asking.start()
        commands = keys.commands_key(service_id)
        wait_for(lambda: redis_conn.llen(commands) > 0, what="the submit queued")
        evaluator.send_signal(signal.SIGTERM)
        evaluator.send_signal(signal.SIGCONT)
        assert evaluator.wait(timeout=10) == 130
        exited = time.monotonic()
        asking.join(timeout=REPLY_TIMEOUT_S + 5)
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    assert "reply" not in outcome, outcome  # the stop came first: the submit was not answered
    assert isinstance(outcome["error"], EvaluationError), outcome
    assert "stopped by SIGTERM" in str(outcome["error"])
    assert outcome["at"] - exited < 1.0  # its next look, a resend later (0.2 s)
    # Nothing is left for the next request to raise a second time.
    assert redis_conn.llen(keys.errors_key(service_id)) == 0
