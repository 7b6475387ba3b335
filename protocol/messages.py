"""The protocol on one screen.

Requests (client → server, LPUSH on the commands list) are maps:
    type              one of the request types below
    payload           a map, per type (below)
    response_channel  the reply list, ``flatland-rl::<service_id>::response::<32 hex>``
    timestamp         client wall clock; required by flatland's service, never trusted here

Payloads (Flatland, the client mirrors the env):
    PING         {"version": ...} → PONG {"arbiter": {"protocol", "budgets", "episodes", "scoring",
                    "reward_model", "debug"}}
    ENV_CREATE   {} → ENV_CREATE_RESPONSE {observation, info, random_seed, env_file_path,
                    "arbiter": {"env_state", "episode": i, "episodes": n, "reward_model", "debug"}}
                    all four legacy fields are False when no episode is left.
    ENV_STEP     {"action": {handle: int}, "inference_time": float, "arbiter": {"reply": bool}}
                 → no reply (fire-and-forget, as in flatland) unless arbiter.reply is true:
                   then ENV_STEP_RESPONSE {"done", "step", "invalid_actions"}
Payloads (every other format, the env is the server's):
    PING         → PONG's "arbiter" also has "format", "next" (the next item of the plan),
                   "spaces": {"observation", "action"} (protocol/spaces.py, plain data) and the
                   format's own fields (two-phase: "env_id", "stages" [{phase, stage, run, items}])
    ENV_CREATE   {"arbiter": {"item": i}} (optional: a reset within a training stage names the
                 stage's item) → ENV_CREATE_RESPONSE {observation, info,
                   "arbiter": {"item": i, the item's place in the plan ...}} (no seed: an
                   episode's seed is named only once it is over, below); when no item
                   is left the legacy False fields and "arbiter": {"finished": true}
    ENV_STEP     {"action": any value of the action space}
                 → always ENV_STEP_RESPONSE {observation, reward, terminated, truncated, info,
                   done, step, invalid_actions, "arbiter": {"stage_over": bool, ...}}; the
                   step that ends an episode also has "arbiter": {"seed": its reset seed}
    ENV_SUBMIT   {} → ENV_SUBMIT_RESPONSE {score, score_secondary, "arbiter": {"scores"}}
    any failure  → ERROR {"code": ..., "message": ...} (INVALID_ACTION: nothing was applied)
    Shared frames (protocol/shared_frames.py): a PING with "arbiter": {"frames": "shared"} gets
    "frames": {"path", "size", "token"} in its PONG when observations hold arrays of 16 KiB or
    more; ENV_CREATE and ENV_STEP with "frames": "shared" get those arrays as
    {"__shared__": [offset, nbytes], "dtype", "shape"}, their bytes in the segment.

Out-of-band errors (server RPUSH on the errors list; the client RPOPs it before every request
and raises ``TimeoutException``): {"type": ENV_STEP_TIMEOUT} or {"type": ENV_RESET_TIMEOUT}.
An evaluation that ends by itself (not ENV_SUBMIT, not a stop) LPUSHes an ERROR (code
EVALUATION) there, after any timeout: arbiter's clients raise it as ``EvaluationError``.

The handshake names the format: a PING of arbiter's client says what it plays, {"arbiter":
{"client": name, "formats": [names] or "server-side"}}; a client of another format is refused
(WRONG_FORMAT, naming both) and the evaluation ends FAILED with that cause.

After ``--resume`` (formats whose env is the server's), the first request of the client that
lived through the restart binds it again. A step, or an ENV_CREATE with "arbiter": {"within":
true} (a reset inside the item it names), from inside an item the killed evaluator was running
is refused with RESTARTED, whose payload's "arbiter": {"resume_item": i} says where the
evaluation goes on (the start of the item's group, server/evaluation_restarts.py).

Every request of arbiter's client carries {"arbiter": {"session": id, "seq": n}} in its payload.
A handshake (PING, or an ENV_CREATE without one) binds the evaluation to its session; another
session is refused (OTHER_CLIENT, with "retry_after_s") unless the bound one has been silent
longer than its current window, in which case the new one takes over (server/clients.py). A
resent request (same seq) is answered from the cached reply; stale ones are dropped.

Extension fields live under the ``"arbiter"`` key of a payload: legacy peers ignore them.
Pickled requests (flatland's client, use_pickle=True): plain data only, answered pickled.
"""

from __future__ import annotations

import time
from typing import Any

PROTOCOL_VERSION = 1
EXTENSION_KEY = "arbiter"


class FLATLAND_RL:  # noqa: N801 - the wire names, spelled as flatland-rl spells them
    PING = "FLATLAND_RL.PING"
    PONG = "FLATLAND_RL.PONG"
    ENV_CREATE = "FLATLAND_RL.ENV_CREATE"
    ENV_CREATE_RESPONSE = "FLATLAND_RL.ENV_CREATE_RESPONSE"
    ENV_RESET_TIMEOUT = "FLATLAND_RL.ENV_RESET_TIMEOUT"
    ENV_STEP = "FLATLAND_RL.ENV_STEP"
    ENV_STEP_RESPONSE = "FLATLAND_RL.ENV_STEP_RESPONSE"
    ENV_STEP_TIMEOUT = "FLATLAND_RL.ENV_STEP_TIMEOUT"
    ENV_SUBMIT = "FLATLAND_RL.ENV_SUBMIT"
    ENV_SUBMIT_RESPONSE = "FLATLAND_RL.ENV_SUBMIT_RESPONSE"
    ERROR = "FLATLAND_RL.ERROR"


class ARBITER:  # arbiter's own request types: flatland's service knows none of them
    RELEASE = "ARBITER.RELEASE"


REQUEST_TYPES = frozenset({FLATLAND_RL.PING, FLATLAND_RL.ENV_CREATE, FLATLAND_RL.ENV_STEP, FLATLAND_RL.ENV_SUBMIT})
TIMEOUT_TYPES = frozenset({FLATLAND_RL.ENV_STEP_TIMEOUT, FLATLAND_RL.ENV_RESET_TIMEOUT})


def request(type_: str, payload: dict[str, Any], response_channel: str | None) -> dict[str, Any]:
    return {
        "type": type_,
        "payload": payload,
        "response_channel": response_channel,
        "timestamp": time.time(),
    }


def reply(type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, "payload": payload}


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"type": FLATLAND_RL.ERROR, "payload": {"code": code, "message": message}}


def extension(payload: object) -> dict[str, Any]:
    """The arbiter extension map of a payload ({} for legacy peers or junk)."""
    if isinstance(payload, dict):
        ext = payload.get(EXTENSION_KEY)
        if isinstance(ext, dict):
            return ext
    return {}
