"""A Redis client with explicit timeouts and no silent retries.

redis-py retries failed commands by default; a retried LPUSH duplicates a request and a
retried BLPOP can wait many times its timeout, so every retry here is the caller's decision.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from hiredis import pack_command
from redis.backoff import NoBackoff
from redis.retry import Retry


def connect(redis_url: str, socket_timeout_s: float) -> redis.Redis:
    return redis.Redis.from_url(
        redis_url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(socket_timeout_s, 10.0),
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=0,
    )


class Packets:
    """Packets of commands, each sent in one write on one connection kept for them, their
    replies returned in order: what a non-transactional pipeline does, without its per-command
    bookkeeping and the pool's per-call checkout, which together cost as much Python time as
    the round trip itself on a step's path. Replies are Redis's own (a blocking pop gives
    ``[key, value]`` or None). Not for use by several threads at once.

    An error reply is raised once every reply of its packet has been read; any other failure
    (a lost connection, an exception from a signal handler) closes the connection, so no reply
    of one packet is ever read as another's, and the next packet connects again.
    """

    def __init__(self, client: redis.Redis):
        self._pool = client.connection_pool
        self._connection: Any = None
        self._pid = os.getpid()

    def run(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._pid != os.getpid():
            # A forked child never writes on its parent's socket (nor shuts it down): it leaves
            # the inherited connection alone and opens its own, as redis-py's pool does.
            self._connection = None
            self._pid = os.getpid()
        connection = self._connection
        if connection is None:
            connection = self._connection = self._pool.get_connection()
        try:
            connection.send_packed_command([b"".join([pack_command(command) for command in commands])], False)
            replies: list[Any] = []
            error: redis.ResponseError | None = None
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as exc:  # this reply was read whole: the next ones follow
                    error = error or exc
                    replies.append(exc)
        except BaseException:
            connection.disconnect()
            raise
        if error is not None:
            raise error
        return replies

    def close(self) -> None:
        if self._connection is not None:
            self._connection.disconnect()
            self._pool.release(self._connection)
            self._connection = None


def redacted(redis_url: str) -> str:
    """The URL as it may be shown in logs and messages: any password replaced by ``***``."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
