"""A reply list the agent made unusable (it SET its own reply key to a string, so Redis answers
the evaluator's RPUSH with WRONGTYPE) costs that reply only: the evaluation goes on, the refusal
is counted. A write Redis refuses for want of memory (its maxmemory, filled by whoever shares it)
is downtime, ridden out like an outage; anything else Redis refuses still stops the evaluator."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import redis
from harness import finish, play_episode, running_service, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import codec, keys
from arbiter.server.service.transport import RedisTransport, RedisUnavailable


def test_a_reply_key_the_agent_spoiled_costs_that_reply_only(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    spoiled = keys.response_key(service_id, "ab" * 16)
    redis_conn.set(spoiled, b"not a list")
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        # answered with an ERROR (unknown type) that Redis refuses to push onto a string
        redis_conn.lpush(keys.commands_key(service_id), codec.encode({"type": "NOPE", "response_channel": spoiled}))
        wait_for(lambda: service.evaluation.counters["unknown_types"] == 1, what="the spoiled request handled")
        steps: list = []
        play_episode(client, 0, steps)
        while client.env_create()[0] is not False:
            play_episode(client, 1, steps)
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["counters"]["refused_replies"] == 1
    assert redis_conn.get(spoiled) == b"not a list"  # the agent's key, left as it made it


def test_a_refusal_other_than_for_memory_still_stops_the_evaluator(redis_url, redis_conn, service_id):
    user = f"no-rpush-{service_id}"
    redis_conn.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-rpush")
    address = redis_conn.connection_pool.connection_kwargs
    host, port = address["host"], address["port"]
    transport = RedisTransport(f"redis://{user}:pw@{host}:{port}/0", service_id)
    try:
        transport.reply(keys.response_key(service_id, "ef" * 16), b"x" * 10)
        with pytest.raises(redis.ResponseError, match="rpush"):
            transport.flush()
        assert transport.refused_replies == 0 and transport.outages == 0
    finally:
        transport.close()
        redis_conn.execute_command("ACL", "DELUSER", user)


@contextlib.contextmanager
def refusing_writes(redis_conn, for_s: float | None):
    """Redis at its maxmemory (every write refused) for ``for_s`` seconds (None: to the end)."""
    redis_conn.config_set("maxmemory", "1")
    lift = threading.Timer(for_s, lambda: redis_conn.config_set("maxmemory", "0")) if for_s else None
    if lift:
        lift.start()
    try:
        yield
    finally:
        if lift:
            lift.join()
        redis_conn.config_set("maxmemory", "0")


def test_a_reply_refused_for_memory_is_downtime_and_goes_out_once_redis_takes_writes(redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id)
    channel = keys.response_key(service_id, "cd" * 16)
    try:
        with refusing_writes(redis_conn, for_s=0.3):
            transport.reply(channel, b"kept")
            transport.flush()
        assert redis_conn.lrange(channel, 0, -1) == [b"kept"]
        assert transport.outages == 1 and 0.25 <= transport.downtime_s < 5
        assert transport.refused_replies == 0
    finally:
        transport.close()


def test_a_wait_refused_for_memory_is_downtime_not_a_busy_loop(redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id)
    try:
        takes_before = redis_conn.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        with refusing_writes(redis_conn, for_s=0.4):
            assert transport.pop(time.monotonic() + 5.0) is None  # the outage was ridden out: deadlines move
        takes = redis_conn.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) - takes_before
        assert transport.outages == 1 and 0.35 <= transport.downtime_s < 5
        assert takes < 40  # paused between attempts, never spinning
        redis_conn.lpush(keys.commands_key(service_id), b"next")
        assert transport.pop(time.monotonic() + 5.0) == b"next"
    finally:
        transport.close()


def test_writes_refused_past_the_outage_limit_end_the_evaluation_as_redis_unavailable(
    redis_url, redis_conn, service_id
):
    transport = RedisTransport(redis_url, service_id, outage_limit_s=0.3)
    try:
        with refusing_writes(redis_conn, for_s=None):
            transport.reply(keys.response_key(service_id, "ab" * 16), b"x")
            with pytest.raises(RedisUnavailable, match="refused writes"):
                transport.flush()
        assert 0.3 <= transport.downtime_s < 5
    finally:
        transport.close()
