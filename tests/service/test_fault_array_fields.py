"""An array where the protocol has a flag or a name (docs/design/reliability.md#f5).

msgpack_numpy's layout makes any field of a request a numpy array: comparing one with a string
gives an array, whose truth raises. Such a request is one of the agent's mistakes, never a fault
of the evaluator's: the evaluation goes on and serves the next request.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from harness import running_service, spec

from arbiter.protocol import codec, keys
from arbiter.protocol.messages import FLATLAND_RL

ARRAY = np.array([1, 2])


def call(redis_conn: Any, service_id: str, type_: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """A legacy request (no session: applied as it comes); its reply, or None when none came."""
    channel = keys.response_key(service_id, uuid.uuid4().hex)
    request = {"type": type_, "payload": payload, "response_channel": channel, "timestamp": 1.0}
    redis_conn.lpush(keys.commands_key(service_id), codec.encode(request))
    found = redis_conn.blpop([channel], timeout=0.5)
    return None if found is None else codec.decode(found[1], codec.REPLY_LIMITS)


@pytest.mark.parametrize(
    "type_, payload",
    [
        (FLATLAND_RL.PING, {"arbiter": {"formats": ARRAY}}),
        (FLATLAND_RL.PING, {"arbiter": {"frames": ARRAY}}),
        (FLATLAND_RL.ENV_STEP, {"action": {0: 2, 1: 2}, "arbiter": {"reply": ARRAY}}),
    ],
    ids=["ping-formats", "ping-frames", "step-reply"],
)
def test_an_array_in_a_field_is_the_agents_mistake_and_the_evaluation_goes_on(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, type_, payload
):
    with running_service(
        spec(step_s=2.0), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, _):
        created = call(redis_conn, service_id, FLATLAND_RL.ENV_CREATE, {})
        assert created is not None and created["type"] == FLATLAND_RL.ENV_CREATE_RESPONSE
        reply = call(redis_conn, service_id, type_, payload)
        if reply is not None:
            assert reply["type"] != FLATLAND_RL.ERROR or reply["payload"]["code"] != "EVALUATION", reply
        step = call(redis_conn, service_id, FLATLAND_RL.ENV_STEP, {"action": {0: 2}, "arbiter": {"reply": True}})
        assert step is not None and step["type"] == FLATLAND_RL.ENV_STEP_RESPONSE, step
        assert not service.evaluation.finished, service.evaluation.termination_cause
