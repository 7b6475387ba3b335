"""A Redis client with explicit timeouts and no silent retries.

redis-py retries failed commands by default; a retried LPUSH duplicates a request and a
retried BLPOP can wait many times its timeout, so every retry here is the caller's decision.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis
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


def redacted(redis_url: str) -> str:
    """The URL as it may be shown in logs and messages: any password replaced by ``***``."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
