"""The evaluator's side of Redis: bounded blocking pops up to a deadline, replies, errors.

Redis checks blocking-pop timeouts on its own timer (10 times a second by default), so a
BRPOP can return up to ~100 ms after its timeout. Budgets must be exact, so the transport
blocks with BRPOP only until ``POLL_MARGIN_S`` before the deadline and covers the last stretch
with non-blocking RPOPs; the final RPOP happens after the deadline, so a command queued before
the deadline is always seen, and nothing queued is ever dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from arbiter.protocol import keys
from arbiter.protocol.redis_conn import connect

POLL_MARGIN_S = 0.12  # longer than Redis's timer period at its default hz of 10
# Redis turns a BRPOP timeout into whole milliseconds and 0 means "block forever": never send
# a timeout that could round down to 0.
MIN_BLOCK_S = 0.01
POLL_INTERVAL_S = 0.0005
MAX_BLOCK_S = 1.0  # wake up at least this often to notice a stop request
REPLY_TTL_S = 600  # a reply nobody collects (a dead client) expires instead of piling up


class RedisTransport:
    def __init__(self, redis_url: str, service_id: str):
        self.redis = connect(redis_url, socket_timeout_s=MAX_BLOCK_S + 10.0)
        self.service_id = service_id
        self.commands_key = keys.commands_key(service_id)
        self.errors_key = keys.errors_key(service_id)
        self.outages = 0  # Redis outages survived so far (see service._lost_in_outage)

    def clear(self) -> None:
        """Forget a previous evaluation's leftovers (stale errors broke flatland's handshakes)."""
        self.redis.delete(*keys.evaluation_keys(self.service_id))

    def pop(self, deadline: float, should_stop: Callable[[], bool] = lambda: False) -> bytes | None:
        """The next command, or None once ``deadline`` (monotonic) passed or a stop was asked."""
        while not should_stop():
            remaining = deadline - time.monotonic()
            block_s = min(remaining - POLL_MARGIN_S, MAX_BLOCK_S)
            if block_s >= MIN_BLOCK_S:
                found = self.redis.brpop([self.commands_key], timeout=round(block_s, 3))
                if found is not None:
                    return found[1]
                continue
            command = self.redis.rpop(self.commands_key)
            if command is not None:
                return command
            if remaining <= 0:
                return None
            time.sleep(min(POLL_INTERVAL_S, remaining))
        return None

    def pop_nowait(self) -> bytes | None:
        return self.redis.rpop(self.commands_key)

    def reply(self, channel: str, message: bytes) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(channel, message)
        pipe.expire(channel, REPLY_TTL_S)
        pipe.execute()

    def push_error(self, message: bytes) -> None:
        self.redis.rpush(self.errors_key, message)

    def close(self) -> None:
        self.redis.close()
