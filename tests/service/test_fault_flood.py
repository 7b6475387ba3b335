"""Floods are detected and ended, results intact (F15); a killed agent is found quickly (F1).

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import paths
from harness import finish, play_episode, read_episodes, read_summary, running_service, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import keys

REPO = str(paths.REPO)


def test_an_endless_push_is_detected_and_ended(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, record_property
):
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        service.flood_queue_limit = 2000
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, 0)
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        # 20,000 junk messages in one command: the queue holds them all at once, however fast the
        # evaluator reads (pushed a thousand at a time, a quick evaluator could keep it under the limit).
        redis_conn.lpush(keys.commands_key(service_id), *([b"\xc1junk"] * 20_000))
        summary = finish(outcome)
    record_property("queued_when_detected", read_summary(results)["counters"]["flood_queue_length"])
    assert summary["state"] == "FAILED" and summary["termination_cause"].startswith("flood:")
    assert summary["score"]["primary"] is None
    assert [r["index"] for r in read_episodes(results)] == [0]  # finished work intact
    assert read_summary(results)["counters"]["flood_queue_length"] > 2000


AGENT = textwrap.dedent(
    """
    import time
    from arbiter.client import RemoteClient
    client = RemoteClient()
    while client.env_create()[0]:
        while not client.env_step({0: 2, 1: 2})[2]["__all__"]:
            time.sleep(0.02)
            print("step", flush=True)
    client.submit()
    """
)


def test_a_killed_agent_costs_one_step_budget_then_the_successive_limit(
    redis_url, service_id, tiny_tests, tmp_path, record_property
):
    results = tmp_path / "r"
    evaluator = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", str(results), "--step-timeout", "0.3",
         "--planning-timeout", "5", "--max-successive-timeouts", "3", "--quiet"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id},
    )
    try:
        while agent.stdout.readline().strip() != "step":  # it is mid-episode once it has stepped
            assert agent.poll() is None, "the agent ended before its first step"
        agent.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        agent.wait()
        records = wait_for(lambda: read_episodes(str(results), missing_ok=True), what="the timed-out episode")
        detected_after_s = time.monotonic() - killed_at
        assert evaluator.wait(timeout=20) == 0, evaluator.stderr.read()
        ended_after_s = time.monotonic() - killed_at
    finally:
        for process in (agent, evaluator):
            if process.poll() is None:
                process.kill()
                process.wait()
    record_property("detected_after_s", round(detected_after_s, 3))
    record_property("evaluation_ended_after_s", round(ended_after_s, 3))
    record_property("evaluator_exit", evaluator.returncode)
    assert records[0]["timed_out"] is True and records[0]["timeout"] == "step"
    assert records[0]["reward"] <= 0  # flatland recorded +max_steps x agents for a timeout
    assert detected_after_s < 0.3 + 0.5  # one step budget (+ file polling slack)
    # The successive-timeout limit, not an idle budget; serve then answers late requests for 1 s.
    assert ended_after_s < 3 * 0.3 + 1.0 + 2.0
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and "3 successive timeouts" in summary["termination_cause"]
    assert [r["index"] for r in read_episodes(str(results))] == [0, 1, 2]
