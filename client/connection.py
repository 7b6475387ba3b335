"""Where a client finds its evaluation, and how long it waits for a reply: its keywords, else
the environment the community's tools set (``ARBITER_REDIS_URL``, flatland's ``redis_ip`` and
``AICROWD_SUBMISSION_ID``, ``ARBITER_REPLY_TIMEOUT``), else flatland's defaults. A setting that
cannot be used is a ``ConfigError`` naming where it came from."""

from __future__ import annotations

import os

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import redacted

DEFAULT_SERVICE_ID = "T12345"  # flatland-rl's default, so unmodified setups line up
DEFAULT_REPLY_TIMEOUT_S = 60.0

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def connection_settings(redis_url: str | None, service_id: str | None) -> tuple[str, str]:
    """The keywords; else the environment (``ARBITER_REDIS_URL``, else ``redis_ip`` as flatland's
    client reads it, on port 6379; ``AICROWD_SUBMISSION_ID``); else flatland's defaults."""
    url = (
        redis_url
        or os.environ.get("ARBITER_REDIS_URL")
        or (f"redis://{os.environ.get('redis_ip', '127.0.0.1')}:6379/0")
    )
    if not url.startswith(REDIS_SCHEMES):
        source = "redis_url" if redis_url else "ARBITER_REDIS_URL"  # redis_ip always makes a redis:// URL
        raise ConfigError(f"{source}: {redacted(url)!r} is not a Redis URL (one of {', '.join(REDIS_SCHEMES)})")
    sid = keys.validate_service_id(service_id or os.environ.get("AICROWD_SUBMISSION_ID") or DEFAULT_SERVICE_ID)
    return url, sid


def reply_timeout(reply_timeout_s: float | None) -> float:
    """The argument, else ``ARBITER_REPLY_TIMEOUT``, else the default; a finite number of
    seconds > 0, since every wait must end (``ConfigError`` otherwise, naming where it came from)."""
    source = "reply_timeout_s"
    if reply_timeout_s is None:
        raw = os.environ.get("ARBITER_REPLY_TIMEOUT")
        if raw is None:
            return DEFAULT_REPLY_TIMEOUT_S
        source = "ARBITER_REPLY_TIMEOUT"
        try:
            reply_timeout_s = float(raw)
        except ValueError:
            raise ConfigError(f"ARBITER_REPLY_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if isinstance(reply_timeout_s, bool) or not 0 < reply_timeout_s < float("inf"):
        raise ConfigError(f"{source} must be a finite number of seconds > 0, got {reply_timeout_s!r}")
    return float(reply_timeout_s)
