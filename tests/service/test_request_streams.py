"""A stream of requests, junk or not, never keeps a budget from running out: a deadline that
passed while requests kept coming expires before the next request is handled. And the warnings
such a stream causes are logged at most once a second per kind, each counted in the summary."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import redis
from harness import finish, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol import keys
from arbiter.server.service.throttled_log import ThrottledLog

UNDECODABLE = b"\xc1"  # a byte msgpack never uses


@contextlib.contextmanager
def junk_stream(redis_url: str, service_id: str) -> Iterator[None]:
    """Undecodable requests pushed without pause, a few at a time, so the evaluator never finds
    its list empty."""
    stop = threading.Event()
    conn = redis.Redis.from_url(redis_url)

    def push() -> None:
        while not stop.is_set():
            if conn.llen(keys.commands_key(service_id)) < 2000:  # far from the flood limit
                conn.lpush(keys.commands_key(service_id), *[UNDECODABLE] * 500)

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    try:
        yield
    finally:
        stop.set()
        pusher.join(timeout=10)
        conn.close()


@contextlib.contextmanager
def playing(competition, tests: str, results: str, redis_url: str, service_id: str) -> Iterator[tuple]:
    """An evaluation served in this process, its first episode begun by a client."""
    with running_service(competition, tests=tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        yield client, outcome


def test_a_step_budget_runs_out_while_junk_requests_keep_coming(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    competition = spec(step_s=0.3, planning_s=5, max_successive_timeouts=1)
    with playing(competition, tiny_tests, str(tmp_path / "r"), redis_url, service_id) as (client, outcome):
        client.env_step(seeded_actions(0, 0, client.env.get_num_agents()))
        with junk_stream(redis_url, service_id):
            wait_for(lambda: redis_conn.llen(keys.errors_key(service_id)) > 0, timeout_s=5, what="the step timeout")
        try:
            client.env_step(seeded_actions(0, 1, client.env.get_num_agents()))
            raise AssertionError("the step after the timeout did not raise TimeoutException")
        except TimeoutException:
            pass
        summary = finish(outcome)
    assert summary["episodes"]["timed_out"] == 1 and "successive timeouts" in summary["termination_cause"]
    assert summary["counters"]["bad_messages"] > 0


def test_the_overall_budget_ends_an_evaluation_that_junk_requests_keep_busy(
    redis_url, service_id, tiny_tests, tmp_path
):
    competition = spec(overall_s=0.5, planning_s=5, step_s=5)
    with playing(competition, tiny_tests, str(tmp_path / "r"), redis_url, service_id) as (_, outcome):
        with junk_stream(redis_url, service_id):
            summary = finish(outcome)
    assert summary["state"] == "FAILED" and "overall budget" in summary["termination_cause"]
    assert summary["timing"]["evaluation_s"] < 5  # ended by its budget, not by the stream's end


def test_a_kind_of_warning_is_logged_at_most_once_a_second_with_the_count_held_back(caplog):
    now = [100.0]
    said = ThrottledLog(logging.getLogger("arbiter.test"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="arbiter.test"):
        for _ in range(1000):
            said.warning("undecodable", "rejected a message of %d bytes", 1)
        said.warning("refused", "request %s refused", "X")
        now[0] += 1.5
        said.warning("undecodable", "rejected a message of %d bytes", 1)
    assert [record.getMessage() for record in caplog.records] == [
        "rejected a message of 1 bytes",
        "request X refused",
        "rejected a message of 1 bytes (and 999 more like it in the last 1.5 s, not logged)",
    ]


FORGED = "\nstate: SUCCESS - all 3 episodes evaluated\x1b[31m"


def test_what_an_agent_names_reaches_causes_and_logs_escaped_and_cut(
    redis_url, service_id, tiny_tests, tmp_path, caplog
):
    """A client name, format names and a request type are the agent's text: none can forge a line
    of the evaluator's output (a newline, a terminal escape) or swell the summary."""
    from arbiter.client.wire import Wire
    from arbiter.protocol.errors import UnknownMessageType, WrongFormat
    from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL

    with caplog.at_level(logging.WARNING), running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):  # fmt: skip
        wire = Wire(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        try:
            wire.request(FLATLAND_RL.PING[:-4] + FORGED, {})
            raise AssertionError("an unknown request type was not refused")
        except UnknownMessageType as refused:
            assert "\n" not in str(refused) and "\x1b" not in str(refused)
        client = {"client": "c" + FORGED, "formats": ["x" * 3000 + FORGED] * 15}
        try:
            wire.request(FLATLAND_RL.PING, {"version": "x", EXTENSION_KEY: client})
            raise AssertionError("a client of other formats was not refused")
        except WrongFormat:
            pass
        summary = finish(outcome)
        wire.close()
    cause = summary["termination_cause"]
    assert cause.startswith("wrong client: c\\nstate: SUCCESS") and "\n" not in cause and "\x1b" not in cause
    assert len(cause) < 400
    logged = [record.getMessage() for record in caplog.records if record.name.startswith("arbiter")]
    assert logged and not any("\n" in line or "\x1b" in line for line in logged)
