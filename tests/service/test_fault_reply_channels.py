"""A reply list the agent made unusable (it SET its own reply key to a string, so Redis answers
the evaluator's RPUSH with WRONGTYPE) costs that reply only: the evaluation goes on, the refusal
is counted, and anything else Redis refuses still stops the evaluator."""

from __future__ import annotations

import pytest
import redis
from harness import finish, play_episode, running_service, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import codec, keys
from arbiter.server.service.transport import RedisTransport


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


def test_any_other_refusal_of_a_reply_still_stops_the_evaluator(redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id)
    try:
        transport.reply(keys.response_key(service_id, "cd" * 16), b"x" * 10)
        redis_conn.config_set("maxmemory", "1")  # Redis now refuses every write: not the agent's doing
        try:
            transport.reply(keys.response_key(service_id, "ef" * 16), b"x" * 10)
            with pytest.raises(redis.ResponseError, match="maxmemory"):
                transport.flush()
        finally:
            redis_conn.config_set("maxmemory", "0")
        assert transport.refused_replies == 0
    finally:
        transport.close()
