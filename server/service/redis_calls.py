"""The evaluator's calls to Redis, riding out what Redis does to them: an outage (Redis
unreachable, restarting or hung) and a stretch of refused writes (Redis at its ``maxmemory``).
Both are downtime: ``outages`` and ``downtime_s`` tell the service what happened, so that it is
never charged to the participant; past ``outage_limit_s`` the evaluation ends as
RedisUnavailable, a fault of the infrastructure.

A stop must end the evaluation at once whatever Redis does (an orchestrator's SIGTERM is followed
by SIGKILL), so no wait here outlives one: a stop from a signal handler ends the Redis call or
the outage its thread is in at once (``interrupt_wait``); one from another thread is seen within
``STOP_CHECK_S`` between attempts, and a call it cut off (the transport's ``request_stop``) ends
the evaluation rather than being ridden out as an outage. Once a stop is requested, no call
starts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis

from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.redis_conn import redacted

log = logging.getLogger(__name__)

DEFAULT_OUTAGE_LIMIT_S = 60.0
OUTAGE_FIRST_PAUSE_S = 0.05  # between attempts: doubling from this ...
OUTAGE_MAX_PAUSE_S = 1.0  # ... up to this
STOP_CHECK_S = 0.05  # how often a pause between attempts looks for a stop request
# A call that answers this long after its own blocking wait ended found Redis held up (its process
# stopped, its machine stalled) for less than a hang's socket timeout: the wait past its blocking
# wait is downtime too, never the participant's. Far above a round trip on a busy machine.
STALLED_AFTER_S = 1.0


class RedisUnavailable(ArbiterError):
    """Redis stayed unreachable, or refused writes, longer than the evaluator's outage limit."""

    code = "REDIS_UNAVAILABLE"


def is_out_of_memory(exc: redis.ResponseError) -> bool:
    """Redis's refusal of a write once it holds ``maxmemory`` (``-OOM command not allowed ...``)."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or str(exc).startswith("OOM")


class RedisFull(RedisUnavailable):
    """Redis refused writes for want of memory (its ``maxmemory``) longer than the outage limit."""


class StopRequested(BaseException):
    """A stop ended a wait for Redis: the evaluation ends as INTERRUPTED, at once.

    A BaseException, like KeyboardInterrupt, because it may be raised by a signal handler in the
    middle of any Redis call: it must pass every ``except Exception`` on its way to the service
    loop. A Redis connection it cut off is disconnected by redis-py and never used again."""


_LOGGING_FOLDER = os.path.dirname(logging.__file__) + os.sep  # the logging package's own files


def _inside_logging(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame that called it runs code of the logging package."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_LOGGING_FOLDER):
            return True
        frame = frame.f_back
    return False


class OutageRidingCalls:
    """Every Redis call of the evaluator goes through ``_call``, which rides out an outage (a
    Redis restart) with backoff for up to ``outage_limit_s``, and Redis's refusals of writes for
    want of memory the same way."""

    def __init__(self, client: redis.Redis, redis_url: str, outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S):
        self.redis = client
        self.redis_url = redis_url
        self.outage_limit_s = outage_limit_s
        self.outages = 0  # Redis outages survived so far (see service._lost_in_outage)
        self.downtime_s = 0.0
        # Plain attributes, not a threading.Event: a signal handler sets and reads them, and one
        # that took a lock the interrupted code held would deadlock.
        self.stop_requested = False
        self._waiting_thread: int | None = None  # the thread inside a Redis call or an outage
        # A stretch of writes refused for want of memory (``_ride_out_refusals``): its start, its latest.
        self._refusals_since: float | None = None
        self._refusals_last = 0.0
        self._refusal_pause_s = OUTAGE_FIRST_PAUSE_S

    def request_stop(self) -> None:
        """Give up waiting for Redis: a pop returns, an outage is no longer ridden out."""
        self.stop_requested = True

    def interrupt_wait(self, frame: FrameType | None = None) -> None:
        """For a signal handler: if its thread is inside a Redis call or riding out an outage
        (a hung Redis answers nothing for ``socket_timeout``), end that wait now by raising
        StopRequested there. At most once: the handler of a second signal raises nothing.

        ``frame``: where the signal found the thread. Inside logging (the outage's warnings) the
        exception could land between a lock's acquire and the ``try`` that releases it, leaving
        the lock held and every other thread's next log line waiting forever; there nothing is
        raised, and the wait ends at its next look at ``stop_requested``."""
        if self._waiting_thread is not None and self._waiting_thread == threading.get_ident():
            if frame is not None and _inside_logging(frame):
                return
            self._waiting_thread = None
            raise StopRequested

    def riding_out(self, command: Callable[[], Any]) -> Any:
        """``command()`` (given ``self.redis``) as the evaluator's own calls are made, outages ridden
        out: for the parts of the evaluator beside the transport (its service id's claim)."""
        return self._call(command)

    def _call(self, command: Callable[[], Any], blocks_s: float = 0.0) -> Any:
        """``command()``, riding out outages. ``blocks_s``: how long it may wait by design (a
        blocking pop); a failed call's time past that was Redis's, not the participant's."""
        self._waiting_thread = threading.get_ident()  # what interrupt_wait looks for
        try:
            while True:
                # A stop whose signal came between two calls found no wait to end: the call it
                # would have cut off is not started (to a hung Redis it would wait out the socket).
                if self.stop_requested:
                    raise StopRequested
                sent = time.monotonic()
                try:
                    answer = command()
                except (redis.AuthenticationError, redis.exceptions.AuthorizationError):
                    raise  # a wrong user or password is no outage: riding it out would only delay saying so
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    if self.stop_requested:  # a stop cut the call off, or came first: Redis is not down
                        raise StopRequested from exc
                    # A hung Redis answers nothing until the socket times out: that wait was
                    # already part of the outage.
                    self._ride_out_outage(exc, down_before_s=max(0.0, time.monotonic() - sent - blocks_s))
                    if self.stop_requested:  # a stop signal that came during "Redis is back" (interrupt_wait)
                        raise StopRequested from exc
                except redis.ResponseError as exc:
                    if not is_out_of_memory(exc):
                        raise
                    self._ride_out_refusals(exc)
                else:
                    late_s = time.monotonic() - sent - blocks_s
                    if late_s > STALLED_AFTER_S:
                        self.downtime_s += late_s
                        log.warning("Redis answered %.2f s after the call's wait ended (held up): downtime", late_s)
                    return answer
        finally:
            self._waiting_thread = None

    def _ride_out_refusals(self, exc: redis.ResponseError) -> None:
        """Redis refused a write for want of memory (its ``maxmemory``, filled by whoever shares
        it): like an outage, the evaluator waits for Redis to take writes again and tries the
        same call again, for up to the outage limit, and the time is downtime, never the
        participant's. ``_refused_since`` spans the refusals of consecutive attempts; a call that
        Redis accepts ends the stretch (``_call`` returns)."""
        now = time.monotonic()
        if self._refusals_since is None or now - self._refusals_last > OUTAGE_MAX_PAUSE_S * 2:
            self._refusals_since = now
            self._refusal_pause_s = OUTAGE_FIRST_PAUSE_S
            self.outages += 1
            log.warning("Redis refuses writes (%s); retrying for up to %g s", exc, self.outage_limit_s)
        self._refusals_last = now
        if now - self._refusals_since > self.outage_limit_s:
            self._refusals_since = None
            raise RedisFull(
                f"Redis at {redacted(self.redis_url)} refused writes for more than {self.outage_limit_s:g} s: {exc}"
            ) from exc
        started = time.monotonic()
        try:
            self._pause(self._refusal_pause_s)
        finally:
            self.downtime_s += time.monotonic() - started
        self._refusal_pause_s = min(self._refusal_pause_s * 2, OUTAGE_MAX_PAUSE_S)
        self._refusals_last = time.monotonic()

    def _ride_out_outage(self, exc: Exception, down_before_s: float = 0.0) -> None:
        """Reconnect with backoff until Redis answers, the outage limit passes (RedisUnavailable)
        or a stop is requested (StopRequested). What the outage lasted (``down_before_s``, the
        failed call's wait for a hung Redis, included) is in ``downtime_s`` either way, so it is
        never charged to the participant."""
        started = time.monotonic() - down_before_s
        self.outages += 1
        log.warning("Redis unreachable (%s); retrying for up to %g s", exc, self.outage_limit_s)
        pause_s = OUTAGE_FIRST_PAUSE_S
        try:
            while True:
                if time.monotonic() - started > self.outage_limit_s:
                    raise RedisUnavailable(
                        f"Redis at {redacted(self.redis_url)} unreachable for more than {self.outage_limit_s:g} s: "
                        f"{exc}"
                    ) from exc
                self._pause(pause_s)
                pause_s = min(pause_s * 2, OUTAGE_MAX_PAUSE_S)
                try:
                    self.redis.ping()
                    break
                except (redis.ConnectionError, redis.TimeoutError):
                    continue
        finally:
            down_s = time.monotonic() - started
            self.downtime_s += down_s
        log.warning("Redis is back after %.2f s", down_s)

    def _pause(self, pause_s: float) -> None:
        """Sleep between reconnection attempts, in short slices so that a stop requested by
        another thread ends it promptly (a signal handler's stop ends it at once)."""
        wake_at = time.monotonic() + pause_s
        while True:
            if self.stop_requested:
                raise StopRequested
            left_s = wake_at - time.monotonic()
            if left_s <= 0:
                return
            time.sleep(min(left_s, STOP_CHECK_S))
