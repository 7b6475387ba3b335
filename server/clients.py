"""Who may talk to an evaluation, and exactly-once handling of their requests.

arbiter's client tags every request with its session id and a sequence number (under the
payload's "arbiter" key). The gate binds the evaluation to the first client it hears from and
refuses every other one, so two clients never interleave steps. For the bound client:

- a request with the last sequence number seen is a resend (its reply was lost or late): it is
  answered from the cached reply and never applied again;
- a lower sequence number is stale and dropped;
- a jump over one or more numbers means requests were lost on the way (a Redis outage): the
  caller decides what that costs (see Evaluation.on_lost_requests).

flatland's own client sends neither: it is bound as "the legacy client" and its requests are
applied as they come. Two legacy clients on one service id cannot be told apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

LEGACY = "<legacy client>"
_MAX_SESSION_LEN = 64


class Verdict(enum.Enum):
    APPLY = "apply"
    RESEND = "resend"  # answer from the cache, do not apply
    STALE = "stale"  # older than the last request: drop
    FOREIGN = "foreign"  # another client: refuse


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    seq: int | None = None
    lost: int = 0  # requests missing before this one (a gap in the sequence)
    cached_reply: dict[str, Any] | None = None


class ClientGate:
    def __init__(self) -> None:
        self.owner: str | None = None
        self._last_seq: int | None = None
        self._last_reply: dict[str, Any] | None = None

    def admit(self, ext: dict[str, Any]) -> Admission:
        session = ext.get("session")
        seq = ext.get("seq")
        who = session if isinstance(session, str) and 0 < len(session) <= _MAX_SESSION_LEN else LEGACY
        if self.owner is None:
            self.owner = who
        elif who != self.owner:
            return Admission(Verdict.FOREIGN)
        if who is LEGACY or not isinstance(seq, int) or isinstance(seq, bool):
            return Admission(Verdict.APPLY)
        last = self._last_seq
        if last is not None and seq == last:
            return Admission(Verdict.RESEND, seq, cached_reply=self._last_reply)
        if last is not None and seq < last:
            return Admission(Verdict.STALE, seq)
        lost = seq - last - 1 if last is not None else 0
        return Admission(Verdict.APPLY, seq, lost=lost)

    def remember(self, admission: Admission, reply: dict[str, Any] | None) -> None:
        """After applying a request: its reply is what a resend of it gets."""
        if admission.seq is not None:
            self._last_seq = admission.seq
            self._last_reply = reply
