"""Stopping when told to (F12), in the test process itself: a stop that finds the evaluator
between two Redis calls lets no further call start, and a stop signal that finds it inside
logging raises nothing there. The processes signalled for real: test_fault_shutdown.py.

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import signal
import time

import pytest


def test_a_stop_asked_between_two_redis_calls_lets_no_further_call_start(redis_url, redis_conn, service_id):
    """A stop signal that finds the evaluator between two Redis calls (writing its notices, say)
    has no wait to end. The calls after it must not start: to a hung Redis each would wait out
    its socket timeout before the stop was seen (once seen as an 11 s stop in CI)."""
    from arbiter.protocol import keys
    from arbiter.server.service.transport import RedisTransport, StopRequested

    def calls_made() -> int:
        stats = redis_conn.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("llen", "rpush", "eval", "evalsha"))

    transport = RedisTransport(redis_url, service_id)
    try:
        assert transport.queued() == 0  # the connection is up and answers before the stop
        transport.request_stop()  # all the handler does when no wait of this thread is under way
        before = calls_made()
        for call in (transport.queued, transport.pop_nowait, lambda: transport.push_error(b"late")):
            with pytest.raises(StopRequested):
                call()
        assert calls_made() == before
        assert redis_conn.llen(transport.errors_key) == 0
        # Nor is a reply written, however it would go: at once, or with the next wait.
        channel = keys.response_key(service_id, "5" * 32)
        transport.reply(channel, b"late", next_deadline=time.monotonic() + 30.0)
        transport.reply(channel, b"later")
        assert len(transport.replies.unwritten) == 2 and transport._wait_sent is None
        assert transport.packets.unread == 0 and redis_conn.llen(channel) == 0
    finally:
        transport.close()


def test_a_stop_signal_that_finds_the_evaluator_inside_logging_raises_nothing_there(redis_url):
    """The handler's stop is raised where the evaluator waits for Redis, never inside logging
    (an outage's warnings): raised between a lock's acquire and its ``try``, it would leave the
    lock held and every other thread's next log line waiting forever. The wait still ends: the
    next look at the stop raises it."""
    import logging

    import redis

    from arbiter.server.service.redis_calls import OutageRidingCalls, StopRequested

    calls = OutageRidingCalls(redis.Redis.from_url(redis_url), redis_url)
    emitted = []

    def stop(signum, frame):  # what the evaluator's handler does (loop.install_signal_handlers)
        calls.request_stop()
        calls.interrupt_wait(frame)

    class SignalWhileEmitting(logging.Handler):
        def __init__(self, on: str):
            super().__init__()
            self.on = on

        def emit(self, record):
            if record.getMessage().startswith(self.on):
                signal.raise_signal(signal.SIGUSR1)  # its handler runs here, inside logging
            emitted.append(record.getMessage())

    logger = logging.getLogger("test.stop-inside-logging")
    handler = SignalWhileEmitting(on="Redis unreachable")
    logger.addHandler(handler)
    outage_logger = logging.getLogger("arbiter.server.service.redis_calls")
    outage_handler = SignalWhileEmitting(on="Redis is back")
    previous = signal.signal(signal.SIGUSR1, stop)
    try:

        def logs_then_waits():
            logger.warning("Redis unreachable")  # as _ride_out_outage warns
            assert calls.stop_requested
            return calls.redis.ping()

        assert calls._call(logs_then_waits) is True  # the signal came inside logging: nothing raised there
        assert emitted == ["Redis unreachable"]
        calls.stop_requested = False  # else the next call would not start at all
        with pytest.raises(StopRequested):  # a wait the signal finds outside logging ends at once
            calls._call(lambda: (signal.raise_signal(signal.SIGUSR1), time.sleep(5)))
        with pytest.raises(StopRequested):  # and a pause between attempts sees the stop asked earlier
            calls._pause(5)

        # The signal comes as the evaluator says Redis is back: the call is not made again.
        calls.stop_requested = False
        outage_logger.addHandler(outage_handler)
        attempts = []

        def fails_once():
            attempts.append(time.monotonic())
            if len(attempts) == 1:
                raise redis.ConnectionError("as when Redis restarts")
            return "answered"

        with pytest.raises(StopRequested):
            calls._call(fails_once)
        assert len(attempts) == 1 and calls.stop_requested and emitted[-1].startswith("Redis is back")
    finally:
        signal.signal(signal.SIGUSR1, previous)
        logger.removeHandler(handler)
        outage_logger.removeHandler(outage_handler)
        calls.redis.close()
