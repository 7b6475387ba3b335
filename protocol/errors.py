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


class WrongFormat(ProtocolError):
    """The client plays another competition format than the evaluator runs (a Flatland client
    on a two-phase evaluation, say): the handshake names both, and the evaluation ends."""

    code = "WRONG_FORMAT"


class ClientConflict(ProtocolError):
    """Another client already runs this evaluation: one client per evaluation."""

    code = "OTHER_CLIENT"


class EvaluationError(ArbiterError):
    """The evaluation cannot go on (over budget, already finished, ...). ``ended``: the state it
    ended in (``SUCCESS``, ``FAILED``, or ``INTERRUPTED`` when its evaluator was stopped) when it has
    ended, as the evaluator said; else None."""

    code = "EVALUATION"

    def __init__(self, message: str, ended: str | None = None):
        super().__init__(message)
        self.ended = ended


class ServerUnavailable(ArbiterError):
    """No reply from the evaluator within the client's wait: it is down or unreachable."""

    code = "SERVER_UNAVAILABLE"


class TimeoutException(ArbiterError, StopAsyncIteration):
    """The evaluator timed out the current episode (planning or step budget).

    Subclasses ``StopAsyncIteration`` like flatland-rl's own ``TimeoutException``, so agent
    code written for FlatlandRemoteClient catches it unchanged.
    """

    code = "TIMEOUT"


class EvaluatorRestarted(ArbiterError):
    """The evaluator was restarted (``--resume``) while this client was inside an item it cannot
    continue (its env or the agent's state from that item's start is gone). The evaluation goes
    on at ``resume_item`` (the start of everything that depends on the lost item): arbiter's
    runners rebuild their agent there; any other agent must be restarted."""

    code = "RESTARTED"

    def __init__(self, message: str, resume_item: int | None = None):
        super().__init__(message)
        self.resume_item = resume_item


class ConfigError(ArbiterError):
    """An impossible or unknown setting (competition spec, command line)."""

    code = "CONFIG"


def _all_errors(root: type[ArbiterError]) -> list[type[ArbiterError]]:
    found = [root]
    for sub in root.__subclasses__():
        found += _all_errors(sub)
    return found


# Every class of the hierarchy, by its wire code (derived, so a new class cannot be forgotten).
ERRORS_BY_CODE: dict[str, type[ArbiterError]] = {cls.code: cls for cls in _all_errors(ArbiterError)}
assert len(ERRORS_BY_CODE) == len(_all_errors(ArbiterError)), "two error classes share a code"


def error_from_payload(payload: object) -> ArbiterError:
    """Rebuild the error a peer sent; legacy peers send free-form payloads."""
    if isinstance(payload, dict):
        code = payload.get("code")
        message = payload.get("message", payload)
        cls = ERRORS_BY_CODE.get(code, ArbiterError) if isinstance(code, str) else ArbiterError
        if cls is EvaluationError:
            ext = payload.get("arbiter")
            ended = ext.get("ended") if isinstance(ext, dict) else None
            return EvaluationError(str(message), ended=ended if isinstance(ended, str) else None)
        return cls(str(message))
    return ArbiterError(str(payload))
