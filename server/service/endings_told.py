"""How an agent learns that its evaluation has ended, once it has.

A request that comes after the end is answered with ``ended_reply``: an ``EvaluationError``
saying how it ended, the state under ``"arbiter"`` (``EvaluationError.ended`` on the client's
side). An ending the agent did not ask for (a budget, a flood, its successive timeouts) is also
posted on the errors list (``post_ending``), which every client (flatland's too) reads before
every request: an agent stepping without replies learns of it at its next step, not only at its
next request that waits for one.

A stop signal (SIGTERM, SIGINT, SIGHUP: someone stopped the evaluator) is posted too, even though
the evaluation ends INTERRUPTED and may be resumed: the agent is told the evaluator has stopped,
at its next request or, for one already waiting, when its reply is late (its client looks at the
errors list then), instead of waiting out its reply timeout. A resumed evaluator takes these
notices off the list as it starts (``withdraw_stop_notices``), so an agent whose next request
comes after the resume goes on. A stop that comes once the agent's ENV_SUBMIT was taken (it
ended the evaluation) posts no notice: the submit's reply, held back by the stop, is sent instead.
An evaluator that is killed or loses Redis posts nothing, and its agent waits for a resume within
its reply timeout, as before.

A request can still miss both: one sent just as the evaluation ended (its client read the
errors list a moment before the ending was posted) reaches a queue nobody serves any more, and
flatland's client waits for its reply for ever. So the evaluator goes on answering for a while
(``answer_after_end``): ``arbiter run`` until its agent exits, ``arbiter serve`` (whose agent is
another machine's) after an ending the agent did not ask for, until the agent has been told.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import EvaluationError
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, error_reply, extension
from arbiter.protocol.redis_conn import connect
from arbiter.server.core.evaluation import Evaluation, State
from arbiter.server.service.replies import REPLY_TTL_S
from arbiter.server.service.transport import RedisUnavailable, StopRequested

if TYPE_CHECKING:
    from arbiter.server.service.loop import EvaluatorService

log = logging.getLogger(__name__)

# After the end, the longest a wait for a late request lasts before the agent's exit (or whether
# it has been told) is looked at again.
AFTER_END_POLL_S = 0.1
# A stop's notice to a hung Redis is given up after this: the stop is obeyed at once (the summary
# is written before it), as the last event is given no more (events.EVENTS_FLUSH_INTERRUPTED_S).
STOP_NOTICE_TIMEOUT_S = 0.3


def ended_reply(evaluation: Evaluation) -> dict[str, Any]:
    """The EvaluationError that says how ``evaluation`` ended, its state under ``"arbiter"``."""
    said = f"the evaluation has ended ({evaluation.state.value}): {evaluation.termination_cause}"
    reply = error_reply(EvaluationError.code, said)
    reply["payload"][EXTENSION_KEY] = {"ended": evaluation.state.value}
    return reply


def ended_unasked(transport: Any, evaluation: Evaluation) -> bool:
    """Whether the evaluation ended without the agent asking (ENV_SUBMIT, whose reply says it)
    and without being interrupted (``--resume`` may continue it: a stale notice would stop the
    agent that lived on): an ending the agent is to be told of."""
    return not (evaluation.submitted or evaluation.state is State.INTERRUPTED or transport.stop_requested)


def post_ending(transport: Any, evaluation: Evaluation, wire: str, *, signalled: bool = False) -> None:
    """The ending on the errors list, when the agent did not ask for it (``ended_unasked``), or a
    stop signal ended it (``signalled``: see the module's docstring). One attempt: the evaluation
    is over. At the list's far end (LPUSH), so a timeout posted before it comes out first.
    A stop that came once ENV_SUBMIT was taken, before its reply went out: that reply is sent
    instead (the submit ended the evaluation, and its agent waits for it)."""
    if signalled:
        # After a stop no call of the transport's starts (a hung Redis would hold it for its
        # socket timeout): a connection of its own, given up quickly.
        quick = connect(transport.redis_url, socket_timeout_s=STOP_NOTICE_TIMEOUT_S)
        try:
            if evaluation.submitted:
                held_back = quick.pipeline(transaction=False)
                for channel, message in transport.replies.unwritten:
                    held_back.rpush(channel, message).expire(channel, REPLY_TTL_S)
                held_back.execute()
            else:
                quick.lpush(transport.errors_key, codec.encode(ended_reply(evaluation), wire=wire))
        except redis.RedisError as exc:
            log.warning("the client was not told the evaluator stopped: %s", exc)
        finally:
            quick.close()
        return
    if not ended_unasked(transport, evaluation):
        return
    try:
        transport.redis.lpush(transport.errors_key, codec.encode(ended_reply(evaluation), wire=wire))
    except redis.RedisError as exc:
        log.warning("the client was not told the evaluation ended: %s", exc)


def is_ending_notice(raw: bytes) -> bool:
    """Whether an errors-list entry is an ending's notice (``ended_reply``), not a timeout."""
    try:
        message = codec.decode(raw, codec.COMMAND_LIMITS)
    except Exception:  # not ours to judge: left where it is
        return False
    return (
        isinstance(message, dict)
        and message.get("type") == FLATLAND_RL.ERROR
        and "ended" in extension(message.get("payload"))
    )


def withdraw_stop_notices(transport: Any) -> int:
    """A resumed evaluator, before it serves: the notices of the run that was stopped come off the
    errors list (the evaluation goes on), the timeouts it posted stay. How many were taken."""
    withdrawn = 0
    for raw in transport.redis.lrange(transport.errors_key, 0, -1):
        if is_ending_notice(raw):
            withdrawn += transport.redis.lrem(transport.errors_key, 1, raw)
    return withdrawn


def answer_ended(service: EvaluatorService, raw: bytes) -> bool:
    """A request taken once the evaluation has ended: answered with ``ended_reply`` (when it
    names a reply list). Whether it was answered."""
    request = service.requests.read(raw)
    if request is None or request.reply_to is None:
        return False
    service.transport.reply(request.reply_to, codec.encode(ended_reply(service.evaluation), wire=request.wire))
    service.transport.flush()
    return True


def answer_after_end(service: EvaluatorService, until: float, *, until_told: bool = False) -> None:
    """Once the evaluation has ended, until ``until`` (monotonic), a stop, or the local agent's
    exit: every request that comes is answered with ``ended_reply``. ``until_told`` (an agent
    this process does not watch): also return once the agent has been told, by a request
    answered so, or by its client having taken everything off the errors list, the ending
    included."""
    transport = service.transport
    # A Redis outage now is ridden out no longer than the window: the evaluation is over.
    transport.outage_limit_s = min(transport.outage_limit_s, max(0.0, until - time.monotonic()))
    agent_gone = service.agent_gone
    while not (agent_gone() or transport.stop_requested):
        wait_until = min(until, time.monotonic() + AFTER_END_POLL_S)
        if wait_until <= time.monotonic():
            return
        try:
            raw = transport.pop(wait_until, should_stop=agent_gone)
            if raw is not None:
                if answer_ended(service, raw) and until_told:
                    return
            elif until_told and transport.redis.llen(transport.errors_key) == 0:
                return  # nothing queued, and the client read the ending off the errors list
        except (RedisUnavailable, StopRequested, redis.RedisError):
            return


def expire_made_reply_lists(transport: Any) -> int:
    """Give every list under the evaluation's reply prefix that has no expiry the one replies get:
    the evaluator sets it on each reply it writes, so a list without one was made by the
    participant (its ACL lets it push onto any name there), and on a shared Redis it would outlive
    the evaluation. One attempt, as the evaluation has ended; how many were found."""
    found = 0
    try:
        match = keys.response_prefix(transport.service_id) + "*"  # a service id holds no glob character
        for key in transport.redis.scan_iter(match=match, count=1000):
            if transport.redis.ttl(key) == -1:
                found += transport.redis.expire(key, REPLY_TTL_S)
    except redis.RedisError as exc:
        log.warning("the reply lists the agent made were not set to expire: %s", exc)
    return found
