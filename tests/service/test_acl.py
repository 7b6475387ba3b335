"""server/service/acl.py: the participant's Redis ACL rule, as tokens, as a redis-cli line and as a
redis.conf ``user`` line, each given to a real redis-server. That the rule keeps tenants apart
(every other command and key refused) is the fault test tests/service/test_fault_acl.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest
import redis
from harness import wait_for

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.service.acl import CLIENT_COMMANDS, acl_line, config_line, participant_acl

PASSWORD = "pärticipant pw"  # not ASCII, with a space: hashed, never written as it is


def test_the_rule_starts_from_nothing_and_allows_the_clients_commands_on_its_keys():
    tokens = participant_acl("svc-1", PASSWORD)
    assert tokens[:5] == ["ACL", "SETUSER", "participant-svc-1", "reset", "on"]
    assert tokens[5] == "#" + hashlib.sha256(PASSWORD.encode()).hexdigest()
    assert tokens[6:9] == [
        "~" + keys.commands_key("svc-1"),
        "~" + keys.errors_key("svc-1"),
        "~" + keys.response_prefix("svc-1") + "*",
    ]
    assert tokens[9:] == ["+lpush", "+rpop", "+blpop"] == [f"+{command}" for command in CLIENT_COMMANDS]
    assert not any(PASSWORD in token for token in tokens)


def test_a_chosen_user_name_replaces_the_default():
    assert participant_acl("svc-1", PASSWORD, user="default")[2] == "default"


@pytest.mark.parametrize(
    ("service_id", "user", "password", "error", "message"),
    [
        ("svc 1", None, "pw", ValueError, "invalid service id"),
        ("svc*", None, "pw", ValueError, "invalid service id"),
        ("svc", "bad user", "pw", ConfigError, "invalid ACL user name"),
        ("svc", "x" * 65, "pw", ConfigError, "invalid ACL user name"),
        ("svc", None, "", ConfigError, "must not be empty"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(service_id, user, password, error, message):
    with pytest.raises(error, match=message):
        participant_acl(service_id, password, user=user)


def test_the_command_line_and_the_config_line_hold_the_same_rule():
    tokens = participant_acl("svc-1", PASSWORD)
    assert acl_line(tokens).split(" ") == tokens
    assert config_line(tokens).split(" ") == ["user", *tokens[2:]]


def as_participant(port: int, service_id: str) -> redis.Redis:
    return redis.Redis(port=port, username=f"participant-{service_id}", password=PASSWORD, socket_timeout=5)


def test_the_rule_given_to_a_live_server_lets_the_participant_talk(redis_server, redis_conn, service_id):
    redis_conn.execute_command(*participant_acl(service_id, PASSWORD))
    try:
        participant = as_participant(redis_server.port, service_id)
        assert participant.lpush(keys.commands_key(service_id), b"request") == 1
        assert participant.rpop(keys.errors_key(service_id)) is None
        with pytest.raises(redis.exceptions.NoPermissionError):
            participant.lpush("elsewhere", b"x")
        participant.close()
    finally:
        redis_conn.execute_command("ACL", "DELUSER", f"participant-{service_id}")


def test_the_config_line_is_read_by_redis_server_at_its_start(tmp_path, service_id):
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is needed (the suite's fixtures run one)"
    port = free_port()
    conf = tmp_path / "redis.conf"
    rule = config_line(participant_acl(service_id, PASSWORD))
    conf.write_text(f'port {port}\nbind 127.0.0.1\nsave ""\ndir {tmp_path}\n{rule}\n')
    server = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        participant = as_participant(port, service_id)

        def answers() -> bool:
            try:
                return participant.lpush(keys.commands_key(service_id), b"request") == 1
            except redis.exceptions.ConnectionError:
                return False

        wait_for(answers, what="redis-server started with the participant's user")
        with pytest.raises(redis.exceptions.NoPermissionError):
            participant.execute_command("KEYS", "*")
        participant.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
