"""protocol/messages.py: the messages both sides build, and the extension map of a payload.

Every message goes through the real codec here, so a field that could not cross the wire (or
that flatland's own peers would not find where they look) fails.
"""

from __future__ import annotations

import time

import pytest

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import InvalidAction, error_from_payload
from arbiter.protocol.messages import (
    EXTENSION_KEY,
    FLATLAND_RL,
    REQUEST_TYPES,
    TIMEOUT_TYPES,
    error_reply,
    extension,
    reply,
    request,
)


def test_a_request_carries_flatlands_four_fields_and_crosses_the_wire():
    channel = keys.response_key("svc", "0" * 32)
    before = time.time()
    message = request(FLATLAND_RL.ENV_STEP, {"action": {0: 2}}, channel)
    assert set(message) == {"type", "payload", "response_channel", "timestamp"}
    assert before <= message["timestamp"] <= time.time()
    decoded, wire = codec.decode_request(codec.encode(message))
    assert wire == codec.MSGPACK
    assert decoded["type"] == FLATLAND_RL.ENV_STEP and decoded["payload"] == {"action": {0: 2}}
    assert keys.is_valid_response_channel(decoded["response_channel"], "svc")


def test_a_reply_is_its_type_and_payload():
    assert reply(FLATLAND_RL.PONG, {"x": 1}) == {"type": FLATLAND_RL.PONG, "payload": {"x": 1}}


def test_an_error_reply_becomes_the_same_error_class_on_the_other_side():
    message = codec.decode(codec.encode(error_reply(InvalidAction.code, "action 9 is outside Discrete(2)")))
    assert message["type"] == FLATLAND_RL.ERROR
    error = error_from_payload(message["payload"])
    assert isinstance(error, InvalidAction) and str(error) == "action 9 is outside Discrete(2)"


def test_the_extension_of_a_payload_is_its_arbiter_map():
    assert extension({"action": 1, EXTENSION_KEY: {"seq": 3}}) == {"seq": 3}


@pytest.mark.parametrize(
    "payload", [None, 3, "text", [EXTENSION_KEY], {}, {"action": 1}, {EXTENSION_KEY: "seq"}, {EXTENSION_KEY: [1]}]
)
def test_a_payload_without_an_extension_map_has_an_empty_one(payload):
    assert extension(payload) == {}


def test_request_and_timeout_types_are_flatlands_names():
    assert REQUEST_TYPES == {
        "FLATLAND_RL.PING",
        "FLATLAND_RL.ENV_CREATE",
        "FLATLAND_RL.ENV_STEP",
        "FLATLAND_RL.ENV_SUBMIT",
    }
    assert TIMEOUT_TYPES == {"FLATLAND_RL.ENV_STEP_TIMEOUT", "FLATLAND_RL.ENV_RESET_TIMEOUT"}
    assert not REQUEST_TYPES & TIMEOUT_TYPES
