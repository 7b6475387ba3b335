"""What the serving loop reads off the wire: each request decoded within the limits the
evaluator sets, its reply list checked against this evaluation's own, and pickled requests let
through the restricted unpickler or refused, as the competition says.

What the agent cannot get right is counted in the summary's counters and logged, each kind at
most once a second (``ThrottledLog``): an agent may send junk as fast as Redis takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import DecodeError, ProtocolError
from arbiter.protocol.messages import error_reply
from arbiter.server.service.throttled_log import ThrottledLog
from arbiter.server.service.transport import RedisTransport

PICKLE_REFUSED = (
    "this evaluator refuses pickled requests (it runs with --refuse-pickle, or accept_pickle = false in its "
    "competition file): create the client with FlatlandRemoteClient(use_pickle=False)"
)


@dataclass(slots=True)
class Request:
    """One decoded request: its type (as sent: not yet known to be valid), its payload (a map,
    empty when the client sent none), the wire it came in, and its reply list when valid."""

    type: Any
    payload: dict[str, Any]
    wire: str
    reply_to: str | None


class RequestReader:
    def __init__(
        self, transport: RedisTransport, counters: dict[str, int], agent_log: ThrottledLog, *, accept_pickle: bool
    ):
        self.transport = transport
        self.counters = counters  # the evaluation's: what summary.json reports
        self.agent_log = agent_log
        self.accept_pickle = accept_pickle
        self._match_reply_channel = keys.response_channel_pattern(transport.service_id).fullmatch

    def read(self, raw: bytes) -> Request | None:
        """The request in ``raw``, or None when it is not one (counted, logged, never answered:
        with no readable reply list there is no one to answer)."""
        try:
            message, wire = codec.decode_request(raw, codec.COMMAND_LIMITS)
            if not isinstance(message, dict):
                raise DecodeError(f"a request must be a map, got {type(message).__name__}")
        except DecodeError as exc:
            self.counters["bad_messages"] += 1
            self.agent_log.warning("undecodable", "rejected a message of %d bytes: %s", len(raw), exc)
            return None
        channel = message.get("response_channel")
        reply_to = channel if isinstance(channel, str) and self._match_reply_channel(channel) is not None else None
        if channel is not None and reply_to is None:
            self.counters["bad_reply_channels"] += 1
        payload = message.get("payload")
        return Request(message.get("type"), payload if isinstance(payload, dict) else {}, wire, reply_to)

    def admit_wire(self, request: Request) -> bool:
        """Whether the request's wire is served: msgpack always, pickle unless refused (then
        the client is told why)."""
        if request.wire != codec.PICKLE:
            return True
        if not self.accept_pickle:
            self._refuse_pickle(request.reply_to)
            return False
        self.counters["pickled_requests"] += 1
        return True

    def _refuse_pickle(self, reply_to: str | None) -> None:
        """A pickling client while pickle is off: told why in the format it reads, so it fails
        at once instead of waiting for a reply it could not read."""
        self.counters["refused_pickles"] += 1
        self.agent_log.warning("pickle", "refused a pickled request: %s", PICKLE_REFUSED)
        if reply_to is not None:
            response = error_reply(ProtocolError.code, PICKLE_REFUSED)
            self.transport.reply(reply_to, codec.encode(response, wire=codec.PICKLE))
