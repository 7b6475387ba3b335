"""codec.Packed: a value packed once and spliced into every message that holds it, byte for byte
what packing the message with the plain value gives."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError

STATE = {
    "grid": np.arange(30, dtype=np.uint16).reshape(5, 6),
    "agents": [{"handle": i, "position": (i, i + 1), "speed": 0.5} for i in range(4)],
    "name": "Level_0",
    "raw": b"\x00\xc4\xff",
}


def _holding(value: object) -> dict:
    """A create reply's shape: the value deep in the payload, among values packed as usual."""
    return {
        "type": "FLATLAND_RL.ENV_CREATE_RESPONSE",
        "payload": {
            "observation": {0: True, 1: True},
            "info": {"action_required": {0: False}, "speed": np.float64(0.25)},
            "arbiter": {"env_state": value, "episode": 3},
        },
    }


@pytest.mark.parametrize(
    "message",
    [
        lambda v: _holding(v),
        lambda v: [v, 1, v],  # the same value twice
        lambda v: {"a": {"b": [{"c": v}]}, "z": v},
        lambda v: v,  # the whole message
    ],
    ids=["create-reply", "twice-in-a-list", "nested", "alone"],
)
def test_a_packed_value_encodes_as_the_plain_value_does(message):
    packed = codec.Packed(STATE)
    assert codec.encode(message(packed)) == codec.encode(message(STATE))


def test_two_packed_values_in_one_message():
    first, second = codec.Packed(STATE), codec.Packed([1, "two", {3: 4.5}])
    assert codec.encode({"x": first, "y": [second, first]}) == codec.encode({"x": STATE, "y": [second.value, STATE]})


def test_the_decoded_message_holds_the_plain_value():
    decoded = codec.decode(codec.encode(_holding(codec.Packed(STATE))), codec.REPLY_LIMITS)
    state = decoded["payload"]["arbiter"]["env_state"]
    np.testing.assert_array_equal(state["grid"], STATE["grid"])
    assert state["agents"] == [{**a, "position": list(a["position"])} for a in STATE["agents"]]
    assert (state["name"], state["raw"]) == (STATE["name"], STATE["raw"])


def test_a_pickled_reply_holds_the_plain_value():
    # As flatland's client reads a reply: it needs nothing of arbiter's to load it.
    data = codec.encode(_holding(codec.Packed(STATE)), wire=codec.PICKLE)
    assert b"arbiter.protocol" not in data and b"Packed" not in data
    loaded = pickle.loads(data)
    state = loaded["payload"]["arbiter"]["env_state"]
    assert type(state) is dict and state["name"] == "Level_0" and state["agents"] == STATE["agents"]
    assert pickle.loads(codec.encode(codec.Packed([1, 2]), wire=codec.PICKLE)) == [1, 2]


def test_only_maps_and_lists_are_packed():
    for value in (3, "text", b"bytes", None, (1, 2)):
        with pytest.raises(TypeError, match="a map or a list"):
            codec.Packed(value)  # type: ignore[arg-type]


def test_a_value_that_cannot_be_encoded_is_refused_when_packed():
    with pytest.raises(DecodeError, match="cannot encode"):
        codec.Packed({"f": object()})


def test_a_message_that_repeats_a_markers_bytes_is_refused_not_misencoded():
    packed = codec.Packed(STATE)
    with pytest.raises(DecodeError, match="ambiguous"):
        codec.encode({"state": packed, "echo": packed._marker[0]})
