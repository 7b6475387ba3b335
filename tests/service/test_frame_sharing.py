"""server/service/frame_sharing.py: which client gets a shared frames segment, and which replies
carry their large arrays through it. Driven with the replies an evaluator makes (a PONG with the
spaces of its env, step replies with observations), on real sealed memory files read back with the
client's reader; RemoteEnv over a real evaluator is in tests/protocol/test_shared_frames.py."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, reply
from arbiter.protocol.shared_frames import PLACEHOLDER_KEY, SHARED, SharedFramesReader
from arbiter.protocol.spaces import space_to_wire
from arbiter.server.service.frame_sharing import FrameSharing

FRAME = gymnasium.spaces.Box(0, 255, shape=(128, 160, 3), dtype=np.uint8)  # 60 KiB: shared
VECTOR = gymnasium.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)  # 16 bytes: inline
ASKS = {EXTENSION_KEY: {"frames": SHARED}}


def pong(observation_space: Any) -> dict[str, Any]:
    spaces = {"observation": space_to_wire(observation_space), "action": space_to_wire(gymnasium.spaces.Discrete(3))}
    return reply(FLATLAND_RL.PONG, {EXTENSION_KEY: {"protocol": 1, "spaces": spaces}})


def step_reply(observation: Any) -> dict[str, Any]:
    return reply(FLATLAND_RL.ENV_STEP_RESPONSE, {"observation": observation, "reward": 1.0})


@pytest.fixture
def sharing():
    frames = FrameSharing()
    yield frames
    frames.close()


def test_a_client_that_asks_gets_a_segment_it_can_map(sharing):
    offered = sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))
    offer = offered["payload"][EXTENSION_KEY]["frames"]
    assert offered["payload"][EXTENSION_KEY]["spaces"]  # the rest of the PONG is as it was
    reader = SharedFramesReader(offer)
    reader.close()
    assert sharing.writer is not None and offer["size"] > FRAME.shape[0] * FRAME.shape[1] * 3


def test_large_arrays_go_through_the_segment_and_come_back_equal(sharing):
    offer = sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))["payload"][EXTENSION_KEY]["frames"]
    reader = SharedFramesReader(offer)
    frames = [FRAME.sample() for _ in range(3)]
    try:
        for frame in frames:
            sent = sharing.applied(FLATLAND_RL.ENV_STEP, ASKS, step_reply(frame))
            placeholder = sent["payload"]["observation"]
            assert PLACEHOLDER_KEY in placeholder and sent["payload"]["reward"] == 1.0
            assert np.array_equal(reader.restore(placeholder), frame)
    finally:
        reader.close()


def test_a_client_that_does_not_ask_gets_replies_as_they_are(sharing):
    plain_pong = pong(FRAME)
    assert sharing.applied(FLATLAND_RL.PING, {}, plain_pong) is plain_pong and sharing.writer is None
    frame = FRAME.sample()
    assert sharing.applied(FLATLAND_RL.ENV_STEP, {}, step_reply(frame))["payload"]["observation"] is frame


def test_small_observations_get_no_segment(sharing):
    answered = sharing.applied(FLATLAND_RL.PING, ASKS, pong(VECTOR))
    assert "frames" not in answered["payload"][EXTENSION_KEY] and sharing.writer is None
    vector = VECTOR.sample()
    assert sharing.applied(FLATLAND_RL.ENV_STEP, ASKS, step_reply(vector))["payload"]["observation"] is vector


def test_an_evaluation_without_spaces_offers_nothing(sharing):
    flatland_pong = reply(FLATLAND_RL.PONG, {EXTENSION_KEY: {"protocol": 1}})
    assert sharing.applied(FLATLAND_RL.PING, ASKS, flatland_pong) is flatland_pong


def test_errors_and_replies_without_observations_pass_unchanged(sharing):
    sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))
    error = reply(FLATLAND_RL.ERROR, {"code": "INVALID_ACTION", "message": "no"})
    assert sharing.applied(FLATLAND_RL.ENV_STEP, ASKS, error) is error
    submitted = reply(FLATLAND_RL.ENV_SUBMIT_RESPONSE, {"score": 1.0})
    assert sharing.applied(FLATLAND_RL.ENV_SUBMIT, ASKS, submitted) is submitted
    assert sharing.applied(FLATLAND_RL.ENV_STEP, ASKS, None) is None


def test_a_new_handshake_gets_a_new_segment(sharing):
    first = sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))["payload"][EXTENSION_KEY]["frames"]
    second = sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))["payload"][EXTENSION_KEY]["frames"]
    assert first["token"] != second["token"]
    SharedFramesReader(second).close()


def asking_for(slot: object) -> dict[str, Any]:
    return {EXTENSION_KEY: {"frames": slot}}


def test_a_named_slot_gets_the_arrays_and_an_older_clients_requests_alternate(sharing):
    offer = sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))["payload"][EXTENSION_KEY]["frames"]
    writer = sharing.writer
    assert offer["slots"] == writer.slots >= 2 and offer["slot_bytes"] == writer.slot_bytes

    def offset(frames: object) -> int:
        sent = sharing.applied(FLATLAND_RL.ENV_STEP, asking_for(frames), step_reply(FRAME.sample()))
        return sent["payload"]["observation"][PLACEHOLDER_KEY][0]

    first_slot = offer["size"] - writer.slots * writer.slot_bytes
    for slot in (writer.slots - 1, 1, 0, 1):
        assert offset(slot) == first_slot + slot * writer.slot_bytes
    # "shared" (an agent from before slots were named): slots 0 and 1 in turn
    assert [offset(SHARED) for _ in range(3)] == [first_slot, first_slot + writer.slot_bytes, first_slot]


@pytest.mark.parametrize("frames", [-1, "slots", True, 2.0, [1], "the last slot + 1"])
def test_a_slot_there_is_not_gets_the_arrays_inline(sharing, frames):
    sharing.applied(FLATLAND_RL.PING, ASKS, pong(FRAME))
    if frames == "the last slot + 1":
        frames = sharing.writer.slots
    frame = FRAME.sample()
    answered = sharing.applied(FLATLAND_RL.ENV_STEP, asking_for(frames), step_reply(frame))
    assert answered["payload"]["observation"] is frame
