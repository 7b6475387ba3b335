"""server/service/loop.py: the service loop, driven over a real redis-server with raw requests.

A request goes in on the commands list and its reply comes out on the reply list it names; an
error becomes an ERROR reply with its code; what cannot be decoded or names no reply list of this
service gets no reply and is counted; pickled requests pass the pickle gate or are refused in the
client's own format; the client gate's verdicts (another client, a resend) are answered as such.
The evaluation behind the loop is two-phase on a counting env (tests/support/counting.py), whose
observation counts the steps applied, so a step applied twice would show.
"""

from __future__ import annotations

import pickle
import time
import uuid
from typing import Any

import pytest
from fake_envs import counting_competition
from harness import finish, read_summary, running_service, wait_for

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import ClientConflict, InvalidAction, OutOfOrder, ProtocolError, UnknownMessageType
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, request
from arbiter.server.service import transport as transport_module
from arbiter.server.service.requests import PICKLE_REFUSED


class RawClient:
    """Requests as raw bytes on the commands list, tagged with a session id and sequence numbers
    as arbiter's client tags them (without them a client is flatland's own, which a two-phase
    evaluation refuses)."""

    def __init__(self, conn: Any, service_id: str, session: str | None = None):
        self.conn = conn
        self.service_id = service_id
        self.session = session or uuid.uuid4().hex
        self.seq = 0

    def payload(self, payload: dict[str, Any], seq: int | None = None) -> dict[str, Any]:
        if seq is None:
            self.seq += 1
            seq = self.seq
        return {**payload, EXTENSION_KEY: {**payload.get(EXTENSION_KEY, {}), "session": self.session, "seq": seq}}

    def push(self, type_: Any, payload: dict[str, Any], *, seq: int | None = None, wire: str = codec.MSGPACK) -> str:
        channel = keys.response_key(self.service_id, uuid.uuid4().hex)
        message = request(type_, self.payload(payload, seq), channel)
        data = pickle.dumps(message, protocol=4) if wire == codec.PICKLE else codec.encode(message)
        self.conn.lpush(keys.commands_key(self.service_id), data)
        return channel

    def reply(self, channel: str, *, pickled: bool = False) -> dict[str, Any]:
        found = self.conn.blpop([channel], timeout=4)  # within the connection's socket timeout
        assert found is not None, f"no reply on {channel}"
        return pickle.loads(found[1]) if pickled else codec.decode(found[1], codec.REPLY_LIMITS)

    def call(self, type_: Any, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.reply(self.push(type_, payload, **kwargs))


# What a PING of a client of this format says about itself (a PING that names no client is
# flatland's own client, refused by a two-phase evaluation).
HELLO = {EXTENSION_KEY: {"client": "a raw test client", "formats": "server-side"}}


def code_of(reply: dict[str, Any]) -> str | None:
    return reply["payload"]["code"] if reply["type"] == FLATLAND_RL.ERROR else None


@pytest.fixture
def serving(redis_url, redis_conn, service_id, tmp_path):
    """A running counting evaluation of two five-step episodes, and where its results go."""
    results = str(tmp_path / "results")
    with running_service(
        counting_competition(num_episodes=2), tests=None, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        yield service, outcome, results


def end(service: Any, outcome: dict[str, Any], results: str) -> dict[str, Any]:
    """Stop the evaluation and return its summary.json, as written."""
    service.request_stop("the test is over")
    finish(outcome)
    return read_summary(results)


def test_a_request_in_gets_its_reply_out_on_the_list_it_names(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id, session="s1")
    pong = client.call(FLATLAND_RL.PING, HELLO)
    assert pong["type"] == FLATLAND_RL.PONG
    assert pong["payload"][EXTENSION_KEY]["format"] == "two-phase"
    created = client.call(FLATLAND_RL.ENV_CREATE, {})
    assert created["type"] == FLATLAND_RL.ENV_CREATE_RESPONSE and list(created["payload"]["observation"])[0] == 0
    stepped = client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    assert stepped["type"] == FLATLAND_RL.ENV_STEP_RESPONSE
    assert stepped["payload"]["reward"] == 2.0 and list(stepped["payload"]["observation"])[0] == 1


def test_undecodable_bytes_get_no_reply_are_counted_and_the_loop_serves_on(serving, redis_conn, service_id):
    service, outcome, results = serving
    commands = keys.commands_key(service_id)
    for junk in (b"\xc1", b"not msgpack at all \xff\xfe", codec.encode([1, 2, 3])):
        redis_conn.lpush(commands, junk)
    assert RawClient(redis_conn, service_id).call(FLATLAND_RL.PING, HELLO)["type"] == FLATLAND_RL.PONG
    assert end(service, outcome, results)["counters"]["bad_messages"] == 3


def test_an_unknown_request_type_is_answered_with_its_error_and_counted(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id, session="s1")
    reply = client.call("FLATLAND_RL.ENV_DESTROY", {})
    assert code_of(reply) == UnknownMessageType.code and "ENV_DESTROY" in reply["payload"]["message"]
    assert client.call(FLATLAND_RL.PING, HELLO)["type"] == FLATLAND_RL.PONG
    assert end(service, outcome, results)["counters"]["unknown_types"] == 1


def test_a_step_before_any_handshake_is_refused_as_out_of_order(serving, redis_conn, service_id):
    service, outcome, results = serving
    reply = RawClient(redis_conn, service_id, session="s1").call(FLATLAND_RL.ENV_STEP, {"action": 1})
    assert code_of(reply) == OutOfOrder.code and "PING" in reply["payload"]["message"]
    assert end(service, outcome, results)["counters"]["unbound_requests"] == 1


def test_an_error_of_the_evaluation_is_mapped_to_its_reply_and_nothing_is_applied(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id, session="s1")
    client.call(FLATLAND_RL.PING, HELLO)
    client.call(FLATLAND_RL.ENV_CREATE, {})
    refused = client.call(FLATLAND_RL.ENV_STEP, {"action": 7})  # the action space is Discrete(2)
    assert code_of(refused) == InvalidAction.code
    applied = client.call(FLATLAND_RL.ENV_STEP, {"action": 0})
    assert list(applied["payload"]["observation"])[0] == 1  # the refused step was never applied
    assert end(service, outcome, results)["counters"]["errors_invalid_action"] == 1


def test_a_reply_list_of_another_service_is_never_written(serving, redis_conn, service_id):
    service, outcome, results = serving
    elsewhere = keys.response_key("another-service", uuid.uuid4().hex)
    message = request(FLATLAND_RL.PING, RawClient(redis_conn, service_id).payload(HELLO), elsewhere)
    redis_conn.lpush(keys.commands_key(service_id), codec.encode(message))
    RawClient(redis_conn, service_id).call(FLATLAND_RL.PING, HELLO)  # handled in order: the first one was too
    assert redis_conn.exists(elsewhere) == 0
    assert end(service, outcome, results)["counters"]["bad_reply_channels"] == 1


def test_a_resent_request_is_answered_again_and_applied_once(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id, session="s1")
    client.call(FLATLAND_RL.PING, HELLO)
    client.call(FLATLAND_RL.ENV_CREATE, {})
    first = client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    again = client.call(FLATLAND_RL.ENV_STEP, {"action": 1}, seq=client.seq)
    assert again["type"] == first["type"] and again["payload"]["reward"] == first["payload"]["reward"]
    assert list(again["payload"]["observation"]) == list(first["payload"]["observation"])
    assert list(first["payload"]["observation"])[0] == 1
    following = client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    assert list(following["payload"]["observation"])[0] == 2
    assert end(service, outcome, results)["counters"]["resent_requests"] == 1


def test_a_second_client_is_refused_with_when_it_may_take_over(serving, redis_conn, service_id):
    service, outcome, results = serving
    RawClient(redis_conn, service_id, session="first").call(FLATLAND_RL.PING, HELLO)
    refused = RawClient(redis_conn, service_id, session="second").call(FLATLAND_RL.PING, HELLO)
    assert code_of(refused) == ClientConflict.code
    retry_after_s = refused["payload"][EXTENSION_KEY]["retry_after_s"]
    assert retry_after_s > 0
    # The message says it too, for whoever reads the error rather than the payload.
    assert f"silent {retry_after_s:.1f} s more" in refused["payload"]["message"]
    assert end(service, outcome, results)["counters"]["foreign_requests"] == 1


def test_requests_queued_before_the_evaluator_started_are_dropped(redis_url, redis_conn, service_id, tmp_path):
    """What waits on the commands list was sent to an earlier evaluator: it must not bind this one."""
    competition = counting_competition(num_episodes=1)
    stray = RawClient(redis_conn, service_id, session="dead-agent")
    results = str(tmp_path / "results")
    # A results folder to resume: a resumed evaluation keeps the lists (a fresh one clears them).
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        service.request_stop("make a results folder to resume")
        finish(outcome)
    stray_channel = stray.push(FLATLAND_RL.PING, HELLO)
    with running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (service, outcome):
        live = RawClient(redis_conn, service_id, session="live-agent")
        assert live.call(FLATLAND_RL.PING, HELLO)["type"] == FLATLAND_RL.PONG  # not OTHER_CLIENT: nobody bound it
        assert redis_conn.exists(stray_channel) == 0
        assert end(service, outcome, results)["counters"]["leftover_requests"] == 1


def test_a_pickled_request_is_answered_pickled(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id)
    channel = client.push(FLATLAND_RL.PING, HELLO, wire=codec.PICKLE)
    pong = client.reply(channel, pickled=True)
    assert pong["type"] == FLATLAND_RL.PONG
    assert end(service, outcome, results)["counters"]["pickled_requests"] == 1


def test_the_pickle_gate_refuses_a_pickled_request_in_the_clients_format(redis_url, redis_conn, service_id, tmp_path):
    competition = counting_competition(num_episodes=1, accept_pickle=False)
    results = str(tmp_path / "results")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        client = RawClient(redis_conn, service_id)
        refusal = client.reply(client.push(FLATLAND_RL.PING, HELLO, wire=codec.PICKLE), pickled=True)
        assert code_of(refusal) == ProtocolError.code and refusal["payload"]["message"] == PICKLE_REFUSED
        # The gate is on pickle only: the same request in msgpack is served.
        assert client.call(FLATLAND_RL.PING, HELLO)["type"] == FLATLAND_RL.PONG
        counters = end(service, outcome, results)["counters"]
    assert counters["refused_pickles"] == 1 and counters.get("pickled_requests", 0) == 0


def test_a_whole_evaluation_through_the_loop_ends_with_its_submit_reply(serving, redis_conn, service_id):
    service, outcome, results = serving
    client = RawClient(redis_conn, service_id, session="s1")
    client.call(FLATLAND_RL.PING, HELLO)
    for _ in range(2):
        client.call(FLATLAND_RL.ENV_CREATE, {})
        for _ in range(5):
            client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    finished = client.call(FLATLAND_RL.ENV_CREATE, {})
    assert finished["payload"][EXTENSION_KEY]["finished"] is True
    submitted = client.call(FLATLAND_RL.ENV_SUBMIT, {})
    assert submitted["type"] == FLATLAND_RL.ENV_SUBMIT_RESPONSE
    summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and submitted["payload"]["score"] == summary["score"]["primary"] == 10.0


def test_a_stop_request_ends_the_evaluation_as_interrupted_with_its_reason(serving):
    service, outcome, results = serving
    service.request_stop("stopped by the operator")
    service.request_stop("a second reason is not the cause")
    summary = finish(outcome)
    assert summary["state"] == "INTERRUPTED" and "stopped by the operator" in summary["termination_cause"]


def test_a_stop_from_another_thread_cuts_off_the_evaluators_wait_for_redis(
    redis_url, service_id, tmp_path, monkeypatch, caplog, record_property
):
    """The evaluator waits for its first request in a blocking pop far longer than the test
    waits: the stop must end that wait itself, and is no Redis outage."""
    monkeypatch.setattr(transport_module, "MAX_BLOCK_S", 60.0)  # a pop blocks until the idle budget ends
    competition = counting_competition(num_episodes=1, budgets={"idle_s": 60})
    results = str(tmp_path / "results")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        wait_for(lambda: service.transport._waiting_thread is not None, what="the evaluator waiting in Redis")
        asked = time.monotonic()
        service.request_stop("stopped from the operator's thread")
        summary = finish(outcome, timeout_s=10)
        record_property("stop_to_end_s", round(time.monotonic() - asked, 3))
    assert summary["state"] == "INTERRUPTED" and "stopped from the operator's thread" in summary["termination_cause"]
    assert service.transport.outages == 0 and service.transport.downtime_s == 0
    assert not [r for r in caplog.records if "Redis unreachable" in r.getMessage()]


def test_a_steps_reply_takes_the_wait_for_the_next_request_along_until_the_evaluation_ends(
    serving, redis_conn, service_id
):
    """The reply of a turn that ends in the next wait carries that wait's deadline (the
    transport writes both in one packet); the turn that ends the evaluation waits for nothing."""
    service, outcome, results = serving
    given: list[tuple[bytes, float | None]] = []
    reply = service.transport.reply

    def noted_reply(channel: str, message: bytes, next_deadline: float | None = None) -> None:
        given.append((codec.decode(message, codec.REPLY_LIMITS)["type"], next_deadline))
        reply(channel, message, next_deadline=next_deadline)

    service.transport.reply = noted_reply
    client = RawClient(redis_conn, service_id, session="s1")
    client.call(FLATLAND_RL.PING, HELLO)
    client.call(FLATLAND_RL.ENV_CREATE, {})
    client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    step_type, step_deadline = given[-1]
    # The deadline the evaluator now waits for the next step until (it waits meanwhile).
    assert step_type == FLATLAND_RL.ENV_STEP_RESPONSE and step_deadline == service.evaluation.endings.deadline().at
    for _ in range(4):
        client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    client.call(FLATLAND_RL.ENV_CREATE, {})
    for _ in range(5):
        client.call(FLATLAND_RL.ENV_STEP, {"action": 1})
    client.call(FLATLAND_RL.ENV_CREATE, {})
    client.call(FLATLAND_RL.ENV_SUBMIT, {})
    assert given[-1] == (FLATLAND_RL.ENV_SUBMIT_RESPONSE, None)
    assert finish(outcome)["state"] == "SUCCESS"
