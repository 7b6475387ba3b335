"""Redis failures are survived or reported, never silent (F10).

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from harness import finish, read_episodes, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol.errors import ServerUnavailable
from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port
from arbiter.server.service import transport as transport_module


def patient_agent(client: RemoteClient, step_delay_s: float) -> dict:
    """Deterministic (actions from the evaluator's episode index, step and handle), and it
    carries on after a TimeoutException as agents should (an episode lost in an outage)."""
    while client.env_create()[0]:
        step = 0
        try:
            while not client.env_step(seeded_actions(client.episode_index, step, client.env.get_num_agents()))[2][
                "__all__"
            ]:
                step += 1
                time.sleep(step_delay_s)
        except TimeoutException:
            continue
    return client.submit()


def run_in_thread(target, *args) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = target(*args)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def kill(server: EmbeddedRedis) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server.stop()  # reaps the process and removes its folder


def test_redis_killed_and_restarted_mid_evaluation(redis_url, service_id, tiny_tests, tmp_path, record_property):
    with running_service(
        spec(step_s=1.5), tests=tiny_tests, results=str(tmp_path / "ref"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        patient_agent(RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10), 0)
        reference = finish(outcome)

    port = free_port()
    redis = EmbeddedRedis(port=port).start()
    results = str(tmp_path / "r")
    try:
        with running_service(
            spec(step_s=1.5), tests=tiny_tests, results=results, redis_url=redis.url, service_id=service_id
        ) as (service, outcome):
            client = RemoteClient(redis_url=redis.url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.5)
            agent, agent_outcome = run_in_thread(patient_agent, client, 0.003)
            wait_for(lambda: service.evaluation.current is not None and service.evaluation.current.steps > 5,
                     what="the first episode to be under way")  # fmt: skip
            kill(redis)
            time.sleep(2.0)  # Redis is down for 2 s: longer than the 1.5 s step budget
            redis = EmbeddedRedis(port=port).start()
            agent.join(timeout=60)
            assert "error" not in agent_outcome, agent_outcome.get("error")
            summary = finish(outcome)
    finally:
        redis.stop()
    record_property("downtime_ms", summary["counters"]["downtime_ms"])
    record_property("episodes_replayed", summary["counters"].get("episodes_replayed", 0))
    record_property("resent_requests", summary["counters"].get("resent_requests", 0))
    assert summary["state"] == "SUCCESS"
    assert summary["episodes"]["timed_out"] == 0  # the downtime was not charged to the agent
    assert summary["counters"]["downtime_ms"] >= 2000
    assert service.transport.outages >= 1
    assert summary["score"] == reference["score"]
    assert [r["index"] for r in read_episodes(results)] == [0, 1, 2]


def test_redis_gone_for_good_ends_cleanly_on_both_sides(service_id, tiny_tests, tmp_path):
    redis = EmbeddedRedis(port=free_port()).start()
    results = str(tmp_path / "r")
    from arbiter.server.service.build import build_service

    service = build_service(spec(), tests=tiny_tests, results_dir=results, redis_url=redis.url,
                            service_id=service_id, redis_outage_s=1.0)  # fmt: skip
    server, server_outcome = run_in_thread(service.run)
    try:
        client = RemoteClient(redis_url=redis.url, service_id=service_id, reply_timeout_s=2)
        client.env_create()
        while not client.env_step(seeded_actions(0, 0, 2))[2]["__all__"]:
            pass
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        client.env_create()
        kill(redis)
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="cannot reach Redis"):
            client.env_step(seeded_actions(1, 0, 2))
        assert time.monotonic() - started < 5
        server.join(timeout=10)
        summary = server_outcome["value"]
    finally:
        service.request_stop("test over")
        server.join(timeout=10)
        redis.stop()
    assert summary["state"] == "INTERRUPTED"
    assert "unreachable for more than 1 s" in summary["termination_cause"]
    assert [r["index"] for r in read_episodes(results)] == [0]  # the finished episode is intact


def test_a_hung_redis_is_downtime_from_when_the_evaluators_wait_should_have_ended(
    service_id, tiny_tests, tmp_path, monkeypatch
):
    """Redis stops answering (SIGSTOP) while the evaluator waits for a step: its blocking pop
    only fails when the socket times out, well after the step budget. That wait is Redis's,
    not the agent's: the step sent once Redis answers again is on time."""
    monkeypatch.setattr(transport_module, "HUNG_AFTER_S", 0.3)  # the socket timeout: MAX_BLOCK_S + this
    redis = EmbeddedRedis(port=free_port()).start()
    results = str(tmp_path / "r")
    try:
        with running_service(
            spec(step_s=0.5, planning_s=5),
            tests=tiny_tests,
            results=results,
            redis_url=redis.url,
            service_id=service_id,
        ) as (service, outcome):
            client = RemoteClient(redis_url=redis.url, service_id=service_id, reply_timeout_s=30, step_replies=True)
            client.env_create()
            num_agents = client.env.get_num_agents()
            client.env_step(seeded_actions(0, 0, num_agents))  # the evaluator now waits for step 1
            os.kill(redis.pid, signal.SIGSTOP)
            hung_at = time.monotonic()
            try:
                wait_for(lambda: service.transport.outages == 1, what="the evaluator to find Redis hung")
                found_after_s = time.monotonic() - hung_at
            finally:
                os.kill(redis.pid, signal.SIGCONT)
            assert found_after_s > 0.5  # the step budget ran out while Redis was hung
            step, done = 1, {"__all__": False}
            while not done["__all__"]:
                _, _, done, _ = client.env_step(seeded_actions(0, step, num_agents))  # no TimeoutException
                step += 1
            for episode in (1, 2):
                client.env_create()
                while not client.env_step(seeded_actions(episode, 0, client.env.get_num_agents()))[2]["__all__"]:
                    pass
            client.submit()
            summary = finish(outcome)
    finally:
        redis.stop()
    assert summary["state"] == "SUCCESS"
    first = read_episodes(results)[0]
    assert not first["timed_out"] and first["steps"] == step
    assert first["step_think_s"]["max"] < 0.5  # the hang was not charged to the agent's step
    # the time the pop waited past its own block (socket timeout 1.3 s, block under 0.5 s) is downtime
    assert summary["counters"]["downtime_ms"] >= 1000 * (found_after_s - 0.5)
