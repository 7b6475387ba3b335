"""Tenants are isolated (F13): the participant ACL rule of `arbiter acl` on a real redis-server.

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from flatland.core.env_observation_builder import DummyObservationBuilder
from flatland.evaluators.client import FlatlandRemoteClient
from harness import finish, play_episode, running_service, spec
from redis.backoff import NoBackoff
from redis.retry import Retry

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port
from arbiter.server.service.replies import REPLY_TTL_S

PASSWORD = "s3cret-pw"


def acl_tokens(service_id: str, *extra: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "acl", "--service-id", service_id, "--password", PASSWORD, *extra],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    line = done.stdout.strip()
    assert PASSWORD not in line  # only its hash is printed
    return line.split(" ")


def forbidden_attempts(service_id: str, other: str) -> list[tuple]:
    return [
        ("SCAN", 0),
        ("KEYS", "*"),
        ("RANDOMKEY",),
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "GET", "*"),
        ("EVAL", "return redis.call('keys', '*')", 0),
        ("MONITOR",),
        ("SUBSCRIBE", "anything"),
        ("DEBUG", "SLEEP", 0),
        ("SHUTDOWN",),
        ("ACL", "LIST"),
        ("GET", keys.commands_key(service_id)),
        ("DEL", keys.commands_key(service_id)),
        ("LRANGE", keys.commands_key(service_id), 0, -1),
        ("LPUSH", keys.commands_key(other), "x"),
        ("RPOP", keys.errors_key(other)),
        ("BLPOP", keys.response_key(other, "0" * 32), 0.01),
        ("LPUSH", "some-other-key", "x"),
    ]


def test_the_participant_user_is_refused_everything_but_its_own_keys(
    redis_server, redis_conn, service_id, tiny_tests, tmp_path
):  # noqa: E501
    other = service_id + "-other"
    redis_conn.lpush(keys.commands_key(other), b"another evaluation's data")
    redis_conn.execute_command(*acl_tokens(service_id))
    participant = redis.Redis(
        host="127.0.0.1", port=redis_server.port, username=f"participant-{service_id}", password=PASSWORD,
        socket_timeout=5,
    )  # fmt: skip
    allowed = []
    for attempt in forbidden_attempts(service_id, other):
        try:
            participant.execute_command(*attempt)
            allowed.append(attempt)
        except redis.exceptions.NoPermissionError:
            pass
    assert allowed == []
    assert redis_conn.llen(keys.commands_key(other)) == 1  # untouched
    # ... and an evaluation still completes with that user.
    evaluated_as_the_participant(redis_server, service_id, tiny_tests, tmp_path)
    redis_conn.execute_command("ACL", "DELUSER", f"participant-{service_id}")


def test_a_legacy_client_works_with_the_rule_on_the_default_user(service_id, tiny_tests, tmp_path):
    """flatland's client authenticates with a password only, i.e. as the default user."""
    with EmbeddedRedis(port=free_port()) as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", "evaluator", "on", ">evaluator-pw", "~*", "&*", "+@all")
        admin.execute_command(*acl_tokens(service_id, "--user", "default"))
        evaluator_url = f"redis://evaluator:evaluator-pw@127.0.0.1:{server.port}/0"
        # The refusal is the answer expected, not a reason to retry (redis-py retries it by default).
        anonymous = redis.Redis(host="127.0.0.1", port=server.port, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()  # no password: refused
        with running_service(
            spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=evaluator_url, service_id=service_id
        ) as (_, outcome):
            client = FlatlandRemoteClient(
                test_env_folder=tiny_tests, flatland_rl_service_id=service_id, remote_port=server.port,
                remote_password=PASSWORD,
            )  # fmt: skip
            while client.env_create(obs_builder_object=DummyObservationBuilder())[0]:
                while not client.env_step({0: 2, 1: 2})[2]["__all__"]:
                    pass
            client.submit()
            assert finish(outcome)["state"] == "SUCCESS"


def test_bad_acl_arguments_are_clear_errors():
    from arbiter.protocol.errors import ConfigError
    from arbiter.server.service.acl import participant_acl

    with pytest.raises(ValueError, match="invalid service id"):
        participant_acl("a b", "pw")
    with pytest.raises(ConfigError, match="invalid ACL user"):
        participant_acl("S1", "pw", user="x y")
    with pytest.raises(ConfigError, match="must not be empty"):
        participant_acl("S1", "")


def test_an_ended_evaluation_leaves_no_key_its_participant_made(
    redis_server, redis_conn, service_id, tiny_tests, tmp_path
):
    """A participant may push onto any name under its reply prefix; on a shared Redis what it made
    there must not outlive its evaluation (nothing else would ever delete it)."""
    other = service_id + "-other"
    redis_conn.lpush(keys.response_key(other, "1" * 32), b"another evaluation's reply")
    redis_conn.execute_command(*acl_tokens(service_id))
    participant = redis.Redis(
        host="127.0.0.1", port=redis_server.port, username=f"participant-{service_id}", password=PASSWORD,
        socket_timeout=5,
    )  # fmt: skip
    junk = [keys.response_prefix(service_id) + name for name in ("junk", "2" * 32, "x" * 200)]
    for key in junk:
        participant.lpush(key, b"kept for ever?" * 100)
    evaluated_as_the_participant(redis_server, service_id, tiny_tests, tmp_path)
    for key in junk:
        assert 0 < redis_conn.ttl(key) <= REPLY_TTL_S, key
    left = redis_conn.scan_iter(match=keys.response_prefix(service_id) + "*")
    assert [key for key in left if redis_conn.ttl(key) == -1] == []
    assert redis_conn.llen(keys.response_key(other, "1" * 32)) == 1
    redis_conn.execute_command("ACL", "DELUSER", f"participant-{service_id}")


def evaluated_as_the_participant(redis_server, service_id: str, tiny_tests: str, tmp_path) -> None:
    """A whole evaluation (three episodes and the submit) whose agent connects as the
    participant's Redis user: it ends SUCCESS."""
    url = f"redis://participant-{service_id}:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_server.url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=url, service_id=service_id, reply_timeout_s=10)
        for episode in range(3):
            client.env_create()
            play_episode(client, episode)
        assert client.env_create() == (False, False)
        client.submit()
        assert finish(outcome)["state"] == "SUCCESS"
