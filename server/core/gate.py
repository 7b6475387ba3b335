"""Who may talk to an evaluation, and exactly-once handling of their requests.

arbiter's client tags every request with its session id and a sequence number (under the
payload's "arbiter" key). The gate binds the evaluation to one client at a time, so two clients
never interleave steps:

- only a handshake binds: a PING, or an ENV_CREATE (a client that skips the PING). Any other
  request while no client is bound is refused, so the stray steps of a client that died before
  a ``--resume`` can never lock its successor out (and what was queued before a resumed
  evaluator started never even reaches the gate: the service drops it). The one exception is a
  resumed evaluation of a format whose env is the server's (``rejoin``): there the first
  request of any client binds, so an agent that lived through the evaluator's restart goes on
  (its request is one it sent again, after the restart);
- a handshake from another client while one is bound is refused (OTHER_CLIENT), unless the
  bound client has been silent for longer than ``takeover_after_s()``: as long as the running
  episode waits for it (its planning or step budget plus what is left in the time bank), the
  step budget between episodes. Then the new client takes over: an agent that crashed and was
  started again goes on with the evaluation. The refusal says when that would be possible
  (``retry_after_s``), and arbiter's client keeps asking until then if its reply timeout allows.
  A bound client the evaluator told it cannot go on (``EvaluatorRestarted``: its env went with a
  restarted evaluator), or one that said it is done (``ARBITER.RELEASE``, sent by its
  ``close()``), can be replaced at once (``yield_to_successor``), until it sends a new request.

For the bound client:

- a request with the last sequence number seen is a resend (its reply was lost or late): it is
  answered from the cached reply and never applied again;
- a lower sequence number is stale and dropped;
- a jump over one or more numbers is counted (``lost_requests``) and the request applied as it
  is: arbiter's client sends every request again until it is answered, so a gap is the client's
  own doing, and it never buys a second try at anything (see EvaluatorService.handle).

flatland's own client sends neither: it is bound as "the legacy client" and its requests are
applied as they come. Two legacy clients on one service id cannot be told apart.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple

from arbiter.protocol.errors import ClientConflict
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, error_reply

LEGACY = "<legacy client>"
_MAX_SESSION_LEN = 64
HANDSHAKES = frozenset({FLATLAND_RL.PING, FLATLAND_RL.ENV_CREATE})


class Verdict(enum.Enum):
    APPLY = "apply"
    RESEND = "resend"  # answer from the cache, do not apply
    STALE = "stale"  # older than the last request: drop
    FOREIGN = "foreign"  # another client while one is bound: refuse
    UNBOUND = "unbound"  # not a handshake, and no client is bound: refuse


class Admission(NamedTuple):  # a tuple: one is made for every request, a frozen dataclass costs 2.5x
    verdict: Verdict
    seq: int | None = None
    lost: int = 0  # requests missing before this one (a gap in the sequence)
    cached_reply: dict[str, Any] | None = None
    took_over_after_s: float | None = None  # this request replaced a client silent that long
    retry_after_s: float | None = None  # FOREIGN handshake: when a takeover becomes possible
    bound: bool = False  # this request bound its client to the evaluation (the first, or a takeover)


def other_client_reply(admission: Admission) -> dict[str, Any]:
    """The OTHER_CLIENT refusal; for a handshake, it says how long the bound client would have to
    stay silent before this one could take over."""
    said = "another client is running this evaluation (one client per evaluation)"
    if admission.retry_after_s is not None:
        said += (
            f"; it may be taken over once that client has been silent {admission.retry_after_s:.1f} s more "
            "(ask again then)"
        )
    response = error_reply(ClientConflict.code, said)
    if admission.retry_after_s is not None:
        response["payload"][EXTENSION_KEY] = {"retry_after_s": admission.retry_after_s}
    return response


class ClientGate:
    def __init__(self, takeover_after_s: Callable[[], float], *, rejoin: bool = False) -> None:
        self.owner: str | None = None
        self._takeover_after_s = takeover_after_s
        self._rejoin = rejoin  # until a client is bound, any request may bind it (see the module docstring)
        self._heard_at = 0.0  # the bound client's last request (monotonic)
        self._yielded = False  # the bound client was told to restart: a successor need not wait
        self._last_seq: int | None = None
        self._last_reply: dict[str, Any] | None = None

    def admit(self, ext: dict[str, Any], now: float, *, handshake: bool) -> Admission:
        session = ext.get("session")
        seq = ext.get("seq")
        who = session if isinstance(session, str) and 0 < len(session) <= _MAX_SESSION_LEN else LEGACY
        took_over_after_s = None
        bound = who != self.owner
        if bound:
            if self.owner is None:
                if not handshake and not (self._rejoin and who is not LEGACY):
                    return Admission(Verdict.UNBOUND)
                self._rejoin = False
            else:
                silent_s = now - self._heard_at
                limit_s = 0.0 if self._yielded else self._takeover_after_s()
                if not handshake or silent_s <= limit_s:
                    return Admission(Verdict.FOREIGN, retry_after_s=limit_s - silent_s if handshake else None)
                took_over_after_s = silent_s
            self.owner = who
            self._last_seq = self._last_reply = None
        self._heard_at = now
        if who is LEGACY or not isinstance(seq, int) or isinstance(seq, bool):
            self._yielded = False
            return Admission(Verdict.APPLY, took_over_after_s=took_over_after_s, bound=bound)
        last = self._last_seq
        if last is not None and seq == last:
            return Admission(Verdict.RESEND, seq, cached_reply=self._last_reply)
        if last is not None and seq < last:
            return Admission(Verdict.STALE, seq)
        lost = seq - last - 1 if last is not None else 0
        self._yielded = False  # a new request: the client goes on (a resend only asks again)
        return Admission(Verdict.APPLY, seq, lost=lost, took_over_after_s=took_over_after_s, bound=bound)

    def yield_to_successor(self) -> None:
        """The bound client was told it cannot go on and must be restarted (``EvaluatorRestarted``),
        or it released the evaluation (closed): another client's handshake may take over at once
        rather than after the client's silence, so its successor is served as soon as it asks. A
        request of its own first (a runner that rebuilds its agent and goes on) keeps the
        evaluation bound to it."""
        self._yielded = True

    def remember(self, admission: Admission, reply: dict[str, Any] | None) -> None:
        """After applying a request: its reply is what a resend of it gets."""
        if admission.seq is not None:
            self._last_seq = admission.seq
            self._last_reply = reply
