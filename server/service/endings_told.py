"""How an agent learns that its evaluation has ended, once it has.

A request that comes after the end is answered with ``ended_reply``: an ``EvaluationError``
saying how it ended, the state under ``"arbiter"`` (``EvaluationError.ended`` on the client's
side). An ending the agent did not ask for (a budget, a flood, its successive timeouts) is also
posted on the errors list (``post_ending``), which arbiter's clients read before every request:
an agent stepping without replies learns of it at its next step, not only at its next request
that waits for one.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from arbiter.protocol import codec
from arbiter.protocol.errors import EvaluationError
from arbiter.protocol.messages import EXTENSION_KEY, error_reply
from arbiter.server.core.evaluation import Evaluation, State

log = logging.getLogger(__name__)


def ended_reply(evaluation: Evaluation) -> dict[str, Any]:
    """The EvaluationError that says how ``evaluation`` ended, its state under ``"arbiter"``."""
    said = f"the evaluation has ended ({evaluation.state.value}): {evaluation.termination_cause}"
    reply = error_reply(EvaluationError.code, said)
    reply["payload"][EXTENSION_KEY] = {"ended": evaluation.state.value}
    return reply


def post_ending(transport: Any, evaluation: Evaluation, wire: str) -> None:
    """The ending on the errors list, unless the agent asked for it (ENV_SUBMIT, whose reply says
    it) or the evaluation was interrupted (``--resume`` may continue it: a stale notice would stop
    the agent that lived on). One attempt: the evaluation is over. At the list's far end (LPUSH),
    so a timeout posted before it comes out first."""
    if evaluation.submitted or evaluation.state is State.INTERRUPTED or transport.stop_requested:
        return
    try:
        transport.redis.lpush(transport.errors_key, codec.encode(ended_reply(evaluation), wire=wire))
    except redis.RedisError as exc:
        log.warning("the client was not told the evaluation ended: %s", exc)
