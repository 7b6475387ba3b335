"""Every Redis key name arbiter uses, in one place.

The layout is flatland-rl's (``flatland-rl::<service_id>::...``) so that unmodified Flatland
clients and services interoperate with arbiter. Nothing else in arbiter formats a key.
"""

from __future__ import annotations

import re

NAMESPACE = "flatland-rl"

# A service id becomes part of every key; keep it to characters that cannot smuggle a key
# separator or a glob pattern into a key name or an ACL rule.
SERVICE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Flatland's clients name reply lists with 32 hex characters (an md5 digest); arbiter's too.
RESPONSE_TOKEN_RE = re.compile(r"[0-9a-f]{32}")


def validate_service_id(service_id: str) -> str:
    if not isinstance(service_id, str) or not SERVICE_ID_RE.fullmatch(service_id):
        raise ValueError(f"invalid service id {service_id!r}: use 1-64 characters from A-Z a-z 0-9 _ . -")
    return service_id


def commands_key(service_id: str) -> str:
    """Client LPUSHes requests here, the server BRPOPs them (FIFO)."""
    return f"{NAMESPACE}::{service_id}::commands"


def errors_key(service_id: str) -> str:
    """Out-of-band errors (timeouts): server RPUSHes, client RPOPs before every request."""
    return f"{NAMESPACE}::{service_id}::errors"


def events_key(service_id: str) -> str:
    """The evaluator XADDs progress events here (a capped stream); ``arbiter watch`` XREADs it.
    Not part of flatland's layout; a participant's ACL (server/acl.py) does not reach it."""
    return f"{NAMESPACE}::{service_id}::events"


def evaluator_key(service_id: str) -> str:
    """Which evaluator serves this service id (server/service/service_claim.py): set by the
    evaluator alone, on a lease. Not part of flatland's layout; a participant's ACL does not reach
    it, and a fresh evaluation does not clear it."""
    return f"{NAMESPACE}::{service_id}::evaluator"


def response_prefix(service_id: str) -> str:
    return f"{NAMESPACE}::{service_id}::response::"


def response_key(service_id: str, token: str) -> str:
    """One reply list per request, named by the client."""
    return response_prefix(service_id) + token


def response_channel_pattern(service_id: str) -> re.Pattern[str]:
    """The names of this service id's reply lists: an evaluator compiles it once and matches
    every request's channel against it (``is_valid_response_channel``)."""
    return re.compile(re.escape(response_prefix(service_id)) + RESPONSE_TOKEN_RE.pattern)


def is_valid_response_channel(channel: object, service_id: str) -> bool:
    """True only for a reply list of this service id, so the server never writes elsewhere."""
    return isinstance(channel, str) and response_channel_pattern(service_id).fullmatch(channel) is not None


def evaluation_keys(service_id: str) -> list[str]:
    """Keys that belong to one evaluation's state, cleared when a fresh evaluation starts."""
    return [commands_key(service_id), errors_key(service_id), events_key(service_id)]
