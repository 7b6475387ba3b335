"""One error hierarchy, shared by both sides.

An error crosses the wire as ``{"code": ..., "message": ...}`` in a ``FLATLAND_RL.ERROR`` reply
and becomes the same class again on the other side (``error_from_payload``).
"""

from __future__ import annotations


class ArbiterError(Exception):
    """Root of every error arbiter raises on purpose."""

    code = "ERROR"

    def to_payload(self) -> dict[str, str]:
        return {"code": self.code, "message": str(self)}


class ProtocolError(ArbiterError):
    """A request the server cannot act on."""

    code = "PROTOCOL"


class DecodeError(ProtocolError):
    """Bytes that are not a valid arbiter/Flatland message."""

    code = "BAD_MESSAGE"


class MessageTooLarge(DecodeError):
    code = "TOO_LARGE"


class UnknownMessageType(ProtocolError):
    code = "UNKNOWN_TYPE"


class OutOfOrder(ProtocolError):
    """A valid request at the wrong time (e.g. a step before any env_create)."""

    code = "OUT_OF_ORDER"


class InvalidAction(ProtocolError):
    code = "INVALID_ACTION"


class VersionMismatch(ProtocolError):
    code = "VERSION_MISMATCH"


class EvaluationError(ArbiterError):
    """The evaluation cannot go on (over budget, already finished, ...)."""

    code = "EVALUATION"


class ServerUnavailable(ArbiterError):
    """No reply from the evaluator within the client's wait: it is down or unreachable."""

    code = "SERVER_UNAVAILABLE"


class TimeoutException(ArbiterError, StopAsyncIteration):
    """The evaluator timed out the current episode (planning or step budget).

    Subclasses ``StopAsyncIteration`` like flatland-rl's own ``TimeoutException``, so agent
    code written for FlatlandRemoteClient catches it unchanged.
    """

    code = "TIMEOUT"


class ConfigError(ArbiterError):
    """An impossible or unknown setting (competition spec, command line)."""

    code = "CONFIG"


ERRORS_BY_CODE: dict[str, type[ArbiterError]] = {
    cls.code: cls
    for cls in (
        ArbiterError,
        ProtocolError,
        DecodeError,
        MessageTooLarge,
        UnknownMessageType,
        OutOfOrder,
        InvalidAction,
        VersionMismatch,
        EvaluationError,
        ServerUnavailable,
        TimeoutException,
        ConfigError,
    )
}


def error_from_payload(payload: object) -> ArbiterError:
    """Rebuild the error a peer sent; legacy peers send free-form payloads."""
    if isinstance(payload, dict):
        code = payload.get("code")
        message = payload.get("message", payload)
        cls = ERRORS_BY_CODE.get(code, ArbiterError) if isinstance(code, str) else ArbiterError
        return cls(str(message))
    return ArbiterError(str(payload))
