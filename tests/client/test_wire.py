"""client/wire.py: the client's side of the wire, against the session's redis-server.

What the client puts on the commands list is read back raw (with no evaluator, nothing takes it
off); what it does with the evaluator's answers is checked against a real one (two-phase on a
counting env): errors raised as their classes, timeouts found on the errors list, a takeover
waited for when the evaluator says when it becomes possible.
"""

from __future__ import annotations

import time

import pytest
from fake_envs import counting_competition
from harness import finish, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.client.wire import Wire, connection_settings, reply_timeout
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import (
    ClientConflict,
    ConfigError,
    MessageTooLarge,
    OutOfOrder,
    ServerUnavailable,
    TimeoutException,
)
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL

HELLO = {"client": "a wire test", "formats": "server-side"}


def queued(redis_conn, service_id: str) -> list[dict]:
    """The requests waiting on the commands list, oldest first."""
    raw = redis_conn.lrange(keys.commands_key(service_id), 0, -1)
    return [codec.decode(data) for data in reversed(raw)]


def test_settings_come_from_the_keywords_then_the_environment_then_flatlands_defaults(monkeypatch):
    for variable in ("ARBITER_REDIS_URL", "redis_ip", "AICROWD_SUBMISSION_ID"):
        monkeypatch.delenv(variable, raising=False)
    assert connection_settings(None, None) == ("redis://127.0.0.1:6379/0", "T12345")
    monkeypatch.setenv("redis_ip", "10.0.0.5")
    monkeypatch.setenv("AICROWD_SUBMISSION_ID", "sub-9")
    assert connection_settings(None, None) == ("redis://10.0.0.5:6379/0", "sub-9")
    monkeypatch.setenv("ARBITER_REDIS_URL", "redis://cache:7000/2")
    assert connection_settings(None, None) == ("redis://cache:7000/2", "sub-9")
    assert connection_settings("redis://mine:1/0", "mine") == ("redis://mine:1/0", "mine")


def test_a_service_id_that_could_reach_other_keys_is_refused():
    with pytest.raises(ValueError, match="invalid service id"):
        connection_settings("redis://127.0.0.1:1/0", "a::b*")


def test_the_reply_timeout_must_be_positive_and_finite(monkeypatch):
    monkeypatch.setenv("ARBITER_REPLY_TIMEOUT", "2.5")
    assert reply_timeout(None) == 2.5 and reply_timeout(0.1) == 0.1
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="reply_timeout_s must be a finite number of seconds > 0"):
            reply_timeout(bad)
    # From the environment: the variable is named, whatever is wrong with its value.
    for raw, said in (
        ("abc", "must be a number of seconds, got 'abc'"),
        ("inf", "must be a finite number of seconds > 0"),
    ):
        monkeypatch.setenv("ARBITER_REPLY_TIMEOUT", raw)
        with pytest.raises(ConfigError, match=f"^ARBITER_REPLY_TIMEOUT {said}"):
            reply_timeout(None)
    monkeypatch.delenv("ARBITER_REPLY_TIMEOUT")
    assert reply_timeout(None) == 60.0


def test_with_no_evaluator_a_request_gives_up_naming_the_service_and_was_tagged(redis_url, redis_conn, service_id):
    wire = Wire(redis_url, service_id, reply_timeout_s=0.3, resend_after_s=0.05)
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match=f"no reply to FLATLAND_RL.PING .*{service_id}"):
        wire.ping("test", asks=HELLO)
    assert time.monotonic() - started < 2.0
    sent = queued(redis_conn, service_id)
    # The PING went out again and again while no one answered: the same request each time.
    assert len(sent) >= 2
    assert all(message == sent[0] for message in sent)
    ext = sent[0]["payload"][EXTENSION_KEY]
    assert ext["session"] == wire.session and ext["seq"] == 1 and ext["client"] == "a wire test"
    assert keys.is_valid_response_channel(sent[0]["response_channel"], service_id)
    wire.close()


def test_each_request_has_the_next_sequence_number_and_its_own_reply_list(redis_url, redis_conn, service_id):
    wire = Wire(redis_url, service_id, reply_timeout_s=0.05)
    for _ in range(3):
        with pytest.raises(ServerUnavailable):
            wire.request(FLATLAND_RL.ENV_CREATE, {})
    sent = queued(redis_conn, service_id)
    assert [message["payload"][EXTENSION_KEY]["seq"] for message in sent] == [1, 2, 3]
    assert len({message["response_channel"] for message in sent}) == 3
    wire.close()


def test_a_request_larger_than_the_evaluator_takes_is_refused_at_once_and_never_sent(redis_url, redis_conn, service_id):
    """The evaluator refuses a request over its limit without an answer: sent, it would cost the
    agent its whole reply timeout and end as 'is the evaluator running?'."""
    wire = Wire(redis_url, service_id, reply_timeout_s=30)
    with pytest.raises(
        MessageTooLarge, match=r"the FLATLAND_RL.ENV_STEP request is [\d,]+ bytes, more than the 65,536"
    ):
        wire.request(FLATLAND_RL.ENV_STEP, {"action": bytes(70_000)})
    assert queued(redis_conn, service_id) == []
    with pytest.raises(ServerUnavailable):  # the next request is the next in sequence
        wire.request(FLATLAND_RL.ENV_CREATE, {}, wait_s=0.05)
    assert [message["payload"][EXTENSION_KEY]["seq"] for message in queued(redis_conn, service_id)] == [1]
    wire.close()


def test_reply_lists_have_valid_names_of_their_own_and_tagging_leaves_the_payload_as_it_was(redis_url, service_id):
    wire, other = Wire(redis_url, service_id), Wire(redis_url, service_id)
    names = [wire._new_channel() for _ in range(500)] + [other._new_channel() for _ in range(500)]
    wire._channels = 2**32 - 2  # the counter's last value, then 0 (a counter starting at 1 gave none)
    names += [wire._new_channel() for _ in range(2)]
    assert names[-2].endswith("ffffffff") and names[-1].endswith("00000000")
    assert len(set(names)) == len(names)
    assert all(keys.is_valid_response_channel(name, service_id) for name in names)
    payload = {"action": 1, EXTENSION_KEY: {"reply": True}}
    message = codec.decode(wire._tagged(FLATLAND_RL.ENV_STEP, payload, names[0]))
    assert message["payload"] == {"action": 1, EXTENSION_KEY: {"reply": True, "session": wire.session, "seq": 1}}
    assert message["response_channel"] == names[0]
    assert payload == {"action": 1, EXTENSION_KEY: {"reply": True}}  # the caller's own maps are not changed
    bare = codec.decode(wire._tagged(FLATLAND_RL.ENV_CREATE, {}, names[1]))
    assert bare["payload"] == {EXTENSION_KEY: {"session": wire.session, "seq": 2}}
    wire.close()
    other.close()


def test_a_session_handed_over_goes_on_numbered_from_where_it_was_and_comes_back(redis_url, redis_conn, service_id):
    first = Wire(redis_url, service_id, reply_timeout_s=0.05)
    with pytest.raises(ServerUnavailable):
        first.request(FLATLAND_RL.ENV_CREATE, {})
    first.resend_all = True  # as after a PONG from arbiter's evaluator
    handed = first.hand_over()
    second = Wire.taking_over(handed)
    assert (second.session, second.seq, second.resend_all) == (first.session, 1, True)
    second.connect()  # its own connection, opened ahead of its first request
    assert second.packets is not first.packets
    for _ in range(2):
        with pytest.raises(ServerUnavailable):
            second.request(FLATLAND_RL.ENV_CREATE, {})
    first.take_back(second.seq)
    with pytest.raises(ServerUnavailable):
        first.request(FLATLAND_RL.ENV_CREATE, {})
    tags = [message["payload"][EXTENSION_KEY] for message in queued(redis_conn, service_id)]
    assert {tag["session"] for tag in tags} == {first.session}
    assert [tag["seq"] for tag in tags] == [1, 2, 3, 4]
    first.take_back(2)  # never back: a lower number would make the evaluator drop the requests as stale
    assert first.seq == 4
    first.close()
    second.close()


def test_connecting_ahead_to_a_redis_that_is_not_there_gives_up_within_the_reply_timeout():
    wire = Wire("redis://127.0.0.1:9/0", "T1", reply_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="cannot reach Redis at redis://127.0.0.1:9/0 for the connection"):
        wire.connect()
    assert time.monotonic() - started < 2.0
    wire.close()


@pytest.mark.parametrize(
    ("kind", "budget"), [(FLATLAND_RL.ENV_STEP_TIMEOUT, "step budget"), (FLATLAND_RL.ENV_RESET_TIMEOUT, "planning")]
)
def test_a_timeout_on_the_errors_list_is_raised_before_any_request(redis_url, redis_conn, service_id, kind, budget):
    redis_conn.rpush(keys.errors_key(service_id), codec.encode({"type": kind}))
    wire = Wire(redis_url, service_id, reply_timeout_s=0.05)
    with pytest.raises(TimeoutException, match=budget):
        wire.request(FLATLAND_RL.ENV_CREATE, {})
    assert queued(redis_conn, service_id) == []  # raised before anything was sent
    wire.close()


@pytest.fixture
def evaluator(redis_url, service_id, tmp_path):
    """A counting evaluation of one episode whose step budget (the takeover window between
    episodes) is short."""
    competition = counting_competition(num_episodes=1, budgets={"step_s": 0.5})
    with running_service(
        competition, tests=None, results=str(tmp_path / "results"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        yield service, outcome


def test_the_handshake_drops_timeouts_left_for_an_earlier_client(evaluator, redis_url, redis_conn, service_id):
    redis_conn.rpush(keys.errors_key(service_id), codec.encode({"type": FLATLAND_RL.ENV_STEP_TIMEOUT}))
    wire = Wire(redis_url, service_id, reply_timeout_s=5)
    info = wire.handshake("test", asks=HELLO)
    assert info is wire.server_info and info["format"] == "two-phase"
    assert wire.resend_all  # arbiter's evaluator: every request may be sent again
    assert redis_conn.llen(keys.errors_key(service_id)) == 0
    created = wire.request(FLATLAND_RL.ENV_CREATE, {})  # no TimeoutException: that one was not ours
    assert created["type"] == FLATLAND_RL.ENV_CREATE_RESPONSE
    wire.close()


def test_an_error_reply_is_raised_as_its_class(evaluator, redis_url, service_id):
    wire = Wire(redis_url, service_id, reply_timeout_s=5)
    with pytest.raises(OutOfOrder, match="PING"):
        wire.request(FLATLAND_RL.ENV_STEP, {"action": 1})
    wire.close()


def test_a_refused_handshake_waits_for_the_takeover_when_its_timeout_allows(evaluator, redis_url, service_id):
    first = Wire(redis_url, service_id, reply_timeout_s=5)
    first.handshake("test", asks=HELLO)
    impatient = Wire(redis_url, service_id, reply_timeout_s=0.1)
    with pytest.raises(ClientConflict):
        impatient.handshake("test", asks=HELLO)  # the window (0.5 s) is longer than its timeout
    patient = Wire(redis_url, service_id, reply_timeout_s=5)
    started = time.monotonic()
    info = patient.handshake("test", asks=HELLO)  # the first client stays silent from now on
    assert info["format"] == "two-phase" and time.monotonic() - started >= 0.4
    with pytest.raises(ClientConflict):
        first.request(FLATLAND_RL.ENV_CREATE, {})  # the evaluation is the patient client's now
    service, outcome = evaluator
    service.request_stop("the test is over")
    assert finish(outcome)["counters"]["takeovers"] == 1
    for wire in (first, impatient, patient):
        wire.close()


def test_a_wrong_password_is_said_at_once_not_ridden_out_as_an_outage():
    """Redis refusing the password is no outage: the client says so at once, the password hidden."""
    from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port

    with EmbeddedRedis(port=free_port(), password="right") as server:
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="refused this client's user or password") as refused:
            RemoteEnv(f"redis://:wrong@127.0.0.1:{server.port}/0", "svc", reply_timeout_s=30)
        assert time.monotonic() - started < 10 and "wrong" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://x", "notaurl", "localhost:6379"])
def test_a_url_that_is_no_redis_url_is_a_config_error_naming_where_it_came_from(url, monkeypatch):
    monkeypatch.setenv("ARBITER_REDIS_URL", url)
    with pytest.raises(ConfigError, match=f"^ARBITER_REDIS_URL: '{url}' is not a Redis URL"):
        connection_settings(None, "T1")
    with pytest.raises(ConfigError, match=f"^redis_url: '{url}' is not a Redis URL"):
        Wire(url, "T1")


def test_a_server_that_is_no_redis_is_said_to_be_none(service_id):
    """An HTTP server (any other program) on the URL's port: ServerUnavailable naming it, at once."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wire = Wire(f"redis://127.0.0.1:{server.server_address[1]}/0", service_id, reply_timeout_s=5)
        with pytest.raises(ServerUnavailable, match="does not answer as Redis does"):
            wire.request(FLATLAND_RL.ENV_CREATE, {})
        wire.close()
    finally:
        server.shutdown()
        server.server_close()
