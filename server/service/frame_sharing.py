"""The evaluator's side of shared frames (protocol/shared_frames.py): which client gets a segment,
and which replies carry their large arrays through it. Format-agnostic: it reads the observation
space the PONG sends and the ``observation`` of the replies that have one."""

from __future__ import annotations

import logging
from typing import Any

from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension
from arbiter.protocol.shared_frames import SHARED, SharedFramesWriter
from arbiter.protocol.spaces import space_from_wire

log = logging.getLogger(__name__)

_WITH_OBSERVATIONS = frozenset({FLATLAND_RL.ENV_CREATE_RESPONSE, FLATLAND_RL.ENV_STEP_RESPONSE})


class FrameSharing:
    def __init__(self) -> None:
        self.writer: SharedFramesWriter | None = None

    def applied(self, type_: str, payload: dict[str, Any], response: dict[str, Any] | None) -> dict[str, Any] | None:
        """``response`` to an applied request, as it goes to the client: a PONG that offers a
        segment to a client that asked for one; an observation's large arrays in the slot a
        client that mapped the segment named (protocol/shared_frames.py)."""
        if response is None:
            return response
        frames = extension(payload).get("frames")
        # ``is True``: an array from the wire compares element by element, and its truth raises.
        shared = (frames == SHARED) is True
        if shared and type_ == FLATLAND_RL.PING and response.get("type") == FLATLAND_RL.PONG:
            return self._offer(response)
        writer = self.writer
        if writer is None or response.get("type") not in _WITH_OBSERVATIONS:
            return response
        if shared:  # an older client: slots 0 and 1 in turn, copied out
            slot = None
        elif type(frames) is int and 0 <= frames < writer.slots:  # the slot the client named
            slot = frames
        else:  # asked for nothing (every slot taken), or for no slot there is: inline
            return response
        writer.claimed()
        return {**response, "payload": writer.share(response["payload"], slot)}

    def _offer(self, pong: dict[str, Any]) -> dict[str, Any]:
        body = extension(pong.get("payload"))
        try:
            space = space_from_wire(body["spaces"]["observation"])
        except (KeyError, TypeError, ArbiterError):  # no env on the server (Flatland): nothing to share
            return pong
        self.close()  # a client's handshake: whoever had the last segment is gone
        try:
            self.writer = SharedFramesWriter.for_space(space)
        except OSError as exc:  # no sealed memory files here, or no memory: the arrays go through Redis
            log.info("observations go through Redis: no shared memory segment (%s)", exc)
            return pong
        if self.writer is None:  # no large arrays to share
            return pong
        return {**pong, "payload": {**pong["payload"], EXTENSION_KEY: {**body, "frames": self.writer.offer()}}}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
