"""The service loop: it reads like flatland's request sequence (docs/design/wire.md).

    wait for the next request, at most until the nearest deadline
    no request by then  → the evaluation expires that deadline (maybe a timeout for the client)
    a request           → decode → dispatch table → handler → at most one reply

Nothing a client sends can stop the loop: undecodable or unknown requests are counted and,
where they name a valid reply list of this service, answered with an error.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from arbiter.protocol import codec
from arbiter.protocol.errors import (
    ArbiterError,
    EvaluationError,
    EvaluatorRestarted,
    OutOfOrder,
    UnknownMessageType,
)
from arbiter.protocol.messages import ARBITER, EXTENSION_KEY, FLATLAND_RL, error_reply, extension
from arbiter.server.core.evaluation import Evaluation
from arbiter.server.core.gate import HANDSHAKES, LEGACY, Admission, ClientGate, Verdict, other_client_reply
from arbiter.server.core.words import quoted_from_agent
from arbiter.server.service import held_stops
from arbiter.server.service.endings_told import answer_ended, expire_made_reply_lists, post_ending
from arbiter.server.service.events import EventLog
from arbiter.server.service.frame_sharing import FrameSharing
from arbiter.server.service.redis_calls import RedisFull
from arbiter.server.service.requests import Request, RequestReader
from arbiter.server.service.service_claim import ServiceClaim
from arbiter.server.service.throttled_log import ThrottledLog
from arbiter.server.service.transport import RedisTransport, RedisUnavailable, StopRequested

log = logging.getLogger(__name__)


# A flood: more unprocessed requests than any agent can have in flight. Checked every
# FLOOD_CHECK_EVERY requests or FLOOD_CHECK_S seconds, whichever comes first (one LLEN).
FLOOD_QUEUE_LIMIT = 50_000
FLOOD_CHECK_EVERY = 1000
FLOOD_CHECK_S = 1.0
# What ends an evaluation from outside: an orchestrator (SIGTERM), Ctrl-C, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


Handler = Callable[[dict[str, Any], float], "dict[str, Any] | None"]


class EvaluatorService:
    def __init__(
        self,
        evaluation: Evaluation,
        transport: RedisTransport,
        flood_queue_limit: int = FLOOD_QUEUE_LIMIT,
        accept_pickle: bool = True,
        redis_private: bool = False,
    ):
        """``redis_private``: the Redis serves this evaluation alone (a hosted evaluation's own), so
        when it stays full the agent filled it: the evaluation fails for it, rather than stopping
        as INTERRUPTED for a resume (a second try)."""
        self.evaluation = evaluation
        self.redis_private = redis_private
        self.transport = transport
        self.flood_queue_limit = flood_queue_limit
        self._handled_since_check = 0
        self._last_flood_check = time.monotonic()
        # A resumed evaluation whose env is the server's lets the agent that lived through the
        # restart back in with whatever it sends again (see core/restarts.py).
        self.gate = ClientGate(evaluation.endings.takeover_after_s, rejoin=evaluation.restarted)
        # What is queued before this evaluator serves was sent to an earlier one (a --resume):
        # a live client sends it again, and a dead one's must not bind the evaluation.
        self._leftovers = transport.queued()
        # flatland's client with use_pickle=True pickles its requests and unpickles what it
        # gets back: errors-list entries go in the wire format of the client applied last.
        self.client_wire = codec.MSGPACK
        self._downtime_seen_s = 0.0
        self._refused_replies_seen = 0  # transport.refused_replies already counted
        self.service_id = transport.service_id
        # When the wait after the last turn ends, decided as its reply went out: the next turn's
        # wait for a request is that one (nothing between them moves a deadline).
        self._next_wait_at: float | None = None
        self._stop_reason = ""  # the stop itself is transport.stop_requested: every wait sees it
        self._signalled = False  # a stop signal came: the agent is told the evaluator stopped (post_ending)
        self._agent_gone = threading.Event()
        self.ended_at: float | None = None  # monotonic: when run() returned
        self._agent_status: int | None = None
        self._agent_ended_how: str | None = None
        self._agent_note: str | None = None
        self.clock = time.monotonic
        self.frames = FrameSharing()  # large observation arrays through shared memory, for a local client
        self.claim: ServiceClaim | None = None  # this evaluator's hold on its service id (build_service)
        self.events: EventLog | None = None  # its events.jsonl and stream (build_service)
        # What the agent's requests cause is logged at most once a second per kind.
        self.requests = RequestReader(transport, evaluation.counters, ThrottledLog(log), accept_pickle=accept_pickle)
        self.agent_log = self.requests.agent_log
        evaluation.recording.notices_after_reply = (
            True  # given at the end of each turn (_serve_once), once its reply is out
        )
        self.dispatch: dict[str, Handler] = {
            FLATLAND_RL.PING: evaluation.on_ping,
            FLATLAND_RL.ENV_CREATE: evaluation.on_create,
            FLATLAND_RL.ENV_STEP: evaluation.on_step,
            FLATLAND_RL.ENV_SUBMIT: evaluation.on_submit,
            ARBITER.RELEASE: self._release,
        }

    def _release(self, payload: dict[str, Any], now: float) -> None:
        """The bound client is done (its ``close()``): the next client's handshake need not wait
        out its silence. Whatever it left running is not ended here: its budget runs on, and a
        takeover times it out as it would a crashed client's."""
        self.evaluation.counters["releases"] += 1
        self.gate.yield_to_successor()

    def request_stop(self, reason: str) -> None:
        """End the evaluation as INTERRUPTED with ``reason`` (the first one given) as soon as
        the loop sees it. Safe in a signal handler (there it only sets attributes); from another
        thread it also cuts off the loop's wait for Redis (``RedisTransport.request_stop``)."""
        if not self._stop_reason:
            self._stop_reason = reason
        self.transport.request_stop()

    @property
    def stop_requested(self) -> bool:
        return self.transport.stop_requested

    def agent_exited(self, status: int, how: str | None = None, note: str | None = None) -> None:
        """The local agent process ended (``arbiter run``): finish once its requests are handled.
        ``how``: how it ended, when its status does not say it (killed at its memory limit);
        ``note``: what the cause adds after it (where a hosted agent's output is)."""
        self._agent_status = status
        self._agent_ended_how = how
        self._agent_note = note
        self._agent_gone.set()

    def close(self) -> None:
        """Close the connection (its last reply flushed) and give up the service id's claim."""
        self.transport.close()
        if self.claim is not None:
            self.claim.release()

    def agent_gone(self) -> bool:
        """Whether the local agent process has ended (``agent_exited``)."""
        return self._agent_gone.is_set()

    def install_signal_handlers(self, also: Callable[[int], None] | None = None) -> None:
        """SIGTERM, SIGINT and SIGHUP end the evaluation as INTERRUPTED at once, with everything
        finished kept: a wait for Redis the signal cuts into (a blocking pop, a hung Redis, an
        outage being ridden out) is abandoned. ``also(signum)`` hears of every such signal
        (``arbiter run`` passes it on to the agent); like the handler it must take no lock. A stop
        signal held while the evaluation was built (held_stops.py) is obeyed now."""

        def handler(signum: int, frame: Any) -> None:
            self._signalled = True
            self.request_stop(f"stopped by {signal.Signals(signum).name}")
            if also is not None:
                also(signum)
            self.transport.interrupt_wait(frame)  # raises StopRequested inside a wait for Redis

        for signum in STOP_SIGNALS:
            signal.signal(signum, handler)
        noted = held_stops.take()  # a stop that came while the evaluation was being built
        if noted is not None:
            handler(noted, None)

    def run(self) -> dict[str, Any]:
        evaluation = self.evaluation
        while not evaluation.finished:
            try:
                if not self._serve_once():
                    break
            except StopRequested:
                self._account_downtime()
                evaluation.endings.interrupt(self._stop_reason)
                break
            except RedisUnavailable as exc:
                self._account_downtime()
                if isinstance(exc, RedisFull) and self.redis_private:
                    cause = f"the agent filled its evaluation's Redis, which serves this evaluation alone ({exc})"
                    evaluation.endings.fail_for_misbehaviour(cause, time.monotonic())
                else:
                    evaluation.endings.interrupt(str(exc))
                break
            except Exception as exc:
                if evaluation.store.unwritable is not None:  # not a bug: the results folder is full or read-only
                    evaluation.endings.interrupt(str(evaluation.store.unwritable))
                    break
                # A bug of ours: end with a summary that says so, never a traceback.
                log.exception("internal error in the service loop")
                evaluation.endings.fail_internal(f"{type(exc).__name__}: {exc}", time.monotonic())
                break
            if evaluation.store.unwritable is not None:
                # Refused while a request was handled: that request got the cause as its error reply.
                evaluation.endings.interrupt(str(evaluation.store.unwritable))
                break
        self.transport.flush_last()  # ENV_SUBMIT's reply, or the one that ended the evaluation
        # An ending it did not ask for, or a stop signal's
        post_ending(self.transport, evaluation, self.client_wire, signalled=self._signalled)
        if not self._signalled:  # after a stop no call of the transport's starts (post_ending)
            expire_made_reply_lists(self.transport)
        self.frames.close()
        self.ended_at = time.monotonic()
        return evaluation.summary()

    def _serve_once(self) -> bool:
        """Wait for one request or the nearest deadline, and act on it; False: stop serving."""
        evaluation = self.evaluation
        wait_until, self._next_wait_at = self._next_wait_at, None
        if wait_until is None:
            wait_until = evaluation.endings.deadline().at
        raw = self.transport.pop(
            wait_until,
            should_stop=self._agent_gone.is_set,
            idle_pending=evaluation.preparation_pending,
            idle_work=evaluation.prepare_ahead,
        )
        self._account_downtime()
        if self.transport.refused_replies != self._refused_replies_seen:  # read with this pop's acks
            self.evaluation.counters["refused_replies"] += self.transport.refused_replies - self._refused_replies_seen
            self._refused_replies_seen = self.transport.refused_replies
        if self.transport.stop_requested:
            evaluation.endings.interrupt(self._stop_reason)
            return False
        if raw is None and self._agent_gone.is_set():
            # Requests the agent sent before exiting still count; then the evaluation ends.
            raw = self.transport.pop_nowait()
            if raw is None:
                evaluation.endings.agent_exited(
                    self._agent_status, time.monotonic(), self._agent_ended_how, self._agent_note
                )
                return False
        now = time.monotonic()
        if raw is None or now >= wait_until:
            # No request by the nearest deadline, or one taken after it: the deadline passes first,
            # so a stream of requests (junk included) never keeps a budget from running out.
            deadline = evaluation.endings.deadline()  # an outage may have moved it
            if now >= deadline.at:
                for error in evaluation.endings.expire(deadline, now):
                    self.transport.push_error(codec.encode(error, wire=self.client_wire))
                evaluation.recording.announce()
            if raw is None:
                return True
            if evaluation.finished:
                answer_ended(self, raw)
                return False
        self.handle(raw, now)
        evaluation.recording.announce()  # the reply is on its way (or rides the next packet)
        self._check_flood(now)
        return True

    def _check_flood(self, now: float) -> None:
        self._handled_since_check += 1
        if self._handled_since_check < FLOOD_CHECK_EVERY and now - self._last_flood_check < FLOOD_CHECK_S:
            return
        self._handled_since_check = 0
        self._last_flood_check = now
        queued = self.transport.queued()
        if queued > self.flood_queue_limit:
            self.evaluation.counters["flood_queue_length"] = queued
            self.evaluation.endings.fail_for_misbehaviour(
                f"flood: {queued} requests queued (limit {self.flood_queue_limit}); the agent sends far more than "
                "an evaluation can use",
                now,
            )

    def _account_downtime(self) -> None:
        """Redis downtime is not the participant's: every running budget is moved by it."""
        new_downtime_s = self.transport.downtime_s - self._downtime_seen_s
        if new_downtime_s > 0:
            self._downtime_seen_s = self.transport.downtime_s
            self.evaluation.endings.add_downtime(new_downtime_s)

    def handle(self, raw: bytes, now: float) -> None:
        """One request: decoded, let through the pickle gate, admitted by the client gate,
        applied to the evaluation, answered (at most one reply, on a valid reply list)."""
        if self._leftovers:
            self._leftovers -= 1
            self.evaluation.counters["leftover_requests"] += 1
            return
        request = self.requests.read(raw)
        if request is None or not self.requests.admit_wire(request):
            return
        admission, response = self._answer(request, now)
        if admission is not None and admission.verdict is Verdict.APPLY:
            self.gate.remember(admission, response)
            self.client_wire = request.wire
        if response is not None and request.reply_to is not None:
            encoded = codec.encode(response, wire=request.wire)
            self.transport.reply(request.reply_to, encoded, next_deadline=self._next_wait_deadline())

    def _next_wait_deadline(self) -> float | None:
        """When the wait that follows this turn must end, if only the turn's notices come before
        it: the reply then takes that wait along (``RedisTransport.reply``). None when something
        else comes next: the end of the evaluation, the next item to open ahead, the agent gone."""
        evaluation = self.evaluation
        if (
            evaluation.finished
            or evaluation.store.unwritable is not None
            or self._agent_gone.is_set()
            or self.transport.stop_requested
            or evaluation.preparation_pending()
        ):
            return None
        self._next_wait_at = evaluation.endings.deadline().at
        return self._next_wait_at

    def _answer(self, request: Request, now: float) -> tuple[Admission | None, dict[str, Any] | None]:
        """The client gate's verdict on the request and the reply it gets; every refusal becomes
        an error reply, and a fault of the evaluator ends the evaluation, never the loop."""
        type_ = request.type
        admission = None
        try:
            handler = self.dispatch.get(type_) if isinstance(type_, str) else None
            if handler is None:
                self.evaluation.counters["unknown_types"] += 1
                raise UnknownMessageType(f"unknown request type '{quoted_from_agent(type_)}'")
            admission = self.gate.admit(extension(request.payload), now, handshake=type_ in HANDSHAKES)
            response = self._admitted(request, admission, handler, now)
        except ArbiterError as exc:
            self.evaluation.counters[f"errors_{exc.code.lower()}"] += 1
            self.agent_log.warning("refused", "request %s refused: %s", quoted_from_agent(type_), exc)
            response = error_reply(exc.code, str(exc))
            if isinstance(exc, EvaluatorRestarted):
                response["payload"][EXTENSION_KEY] = {"resume_item": exc.resume_item}
                self.gate.yield_to_successor()
        except RedisUnavailable:
            raise
        except Exception as exc:  # a bug or a broken test file: end cleanly, never with a traceback
            log.exception("internal error while handling %s", quoted_from_agent(type_))
            self.evaluation.endings.fail_internal(
                f"{type(exc).__name__}: {exc} (while handling {quoted_from_agent(type_)})", now
            )
            response = error_reply("EVALUATION", "the evaluator failed; see its summary for the cause")
        return admission, response

    def _admitted(self, request: Request, admission: Admission, handler: Handler, now: float) -> dict[str, Any] | None:
        """What the gate's verdict makes of the request: refused, dropped, answered again, or applied."""
        if admission.verdict is Verdict.APPLY:  # nearly every request
            return self._apply(request, admission, handler, now)
        counters = self.evaluation.counters
        if admission.verdict is Verdict.UNBOUND:
            counters["unbound_requests"] += 1
            raise OutOfOrder("no client has started this evaluation: PING (or ENV_CREATE) first")
        if admission.verdict is Verdict.FOREIGN:
            counters["foreign_requests"] += 1
            counters["errors_other_client"] += 1
            refused = quoted_from_agent(request.type)
            self.agent_log.warning("other client", "request %s refused: another client is bound to it", refused)
            return other_client_reply(admission)
        if admission.verdict is Verdict.STALE:
            counters["stale_requests"] += 1
            return None
        counters["resent_requests"] += 1  # Verdict.RESEND
        return admission.cached_reply

    def _apply(self, request: Request, admission: Admission, handler: Handler, now: float) -> dict[str, Any] | None:
        """An admitted request, applied to the evaluation."""
        evaluation = self.evaluation
        evaluation.endings.check_overall(now)
        if admission.took_over_after_s is not None:
            evaluation.endings.take_over(admission.took_over_after_s, now)
            if evaluation.finished:  # the episode it timed out was the last one allowed
                raise EvaluationError(evaluation.termination_cause)
        if admission.bound:
            evaluation.restarts.client_bound(
                self.gate.owner,
                now,
                handshake_type=request.type if request.type in HANDSHAKES else None,
                took_over=admission.took_over_after_s is not None,
                legacy=self.gate.owner == LEGACY,
            )
        # A gap in the sequence is the client's doing (arbiter's client sends a request again
        # until it is answered): counted, and the request applied as it is. Not even a Redis
        # outage makes the evaluator play an episode again on the client's word: that would be
        # a second try on the same seed.
        if admission.lost:
            evaluation.counters["lost_requests"] += admission.lost
        return self.frames.applied(request.type, request.payload, handler(request.payload, now))
