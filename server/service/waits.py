"""The evaluator's wait for requests and its bounded take, as the Redis commands that carry them.

The wait is a BLMOVE of the commands list onto its own tail with its reply switched off: it leaves
the list as it was, returns once the list holds a request, and never hands one over. The requests
are taken by a script inside Redis (``redis_conn.bounded_take``) that hands over at most
``TAKE_BYTES`` at once, cutting a request over the size limit to one byte more than the limit.
Redis runs a blocked client's next command only once the block ends, so the take sent in the same
packet as the wait takes what was queued when the wait returned (``RedisTransport``).
"""

from __future__ import annotations

from typing import Any

from arbiter.protocol import codec
from arbiter.protocol.redis_conn import bounded_take, pack

# Commands taken from Redis per round trip when several are queued. A killed evaluator loses at
# most this many; sequence numbers tell the client's resends.
POP_BATCH = 64
# The largest request the evaluator decodes, and what one round trip may take from Redis: the
# requests' bytes add up to at most this, so the first request always fits (cut if over the limit).
REQUEST_LIMIT = codec.COMMAND_LIMITS.max_bytes
TAKE_BYTES = REQUEST_LIMIT + 1
# The wait's commands that Redis answers (CLIENT REPLY ON, then the take); the first two, replies
# off and the blocking BLMOVE, get none.
WAIT_UNANSWERED = 2
WAIT_ANSWERED = 2


class WaitCommands:
    """The wait and the take for one commands list, packed once for as long as they stay the same."""

    def __init__(self, commands_key: str):
        self.commands_key = commands_key
        # Whether Redis has the take's script cached: EVALSHA then spares sending its text. A Redis
        # that lost its cache (a restart, SCRIPT FLUSH) answers NOSCRIPT: the text goes again.
        self.script_cached = False
        self._shape: tuple[float, bool] | None = None  # what the packed wait was made for
        self._packed: list[bytes] = []

    def wait(self, block_s: float) -> list[bytes]:
        """The wait of ``block_s`` and the take behind it, packed: the same from one turn to the
        next while the timeout and the script's state in Redis stay as they were, so they are
        packed again only when either changes (packing them costs more than the rest of a turn's
        bookkeeping)."""
        shape = (block_s, self.script_cached)
        if shape != self._shape:
            key = self.commands_key
            self._packed = [
                pack(("CLIENT", "REPLY", "OFF")),
                pack(("BLMOVE", key, key, "RIGHT", "RIGHT", block_s)),
                pack(("CLIENT", "REPLY", "ON")),
                pack(self.take(POP_BATCH)),
            ]
            self._shape = shape
        return self._packed

    def take(self, most: int) -> tuple[Any, ...]:
        """The take of up to ``most`` requests, on its own (no wait)."""
        return bounded_take(self.commands_key, most, TAKE_BYTES, REQUEST_LIMIT, cached=self.script_cached)
