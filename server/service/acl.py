"""The Redis ACL rule for the participant of one evaluation (hosted mode).

It starts from nothing (``reset``: no commands, no keys, no channels, no password) and allows
only the three commands a client needs — LPUSH onto the commands list, RPOP from the errors
list, BLPOP on its reply lists — on this evaluation's own keys. A key-pattern rule alone is not
enough: SCAN, KEYS and RANDOMKEY ignore key patterns and would list every evaluation's keys, so
every command not named stays forbidden. The password is given as its SHA-256 (``#...``), so
the rule can be logged or stored without revealing it.

Scripts (EVAL and the like) are among the forbidden: a script may touch any key. The evaluator,
Redis's default user, runs one of its own to take requests (server/transport.py), so that
however large the values the participant pushes, no more than the request limit leaves Redis.
"""

from __future__ import annotations

import hashlib
import re

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError

CLIENT_COMMANDS = ("lpush", "rpop", "blpop")
_USER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def participant_acl(service_id: str, password: str, user: str | None = None) -> list[str]:
    """The ``ACL SETUSER`` arguments, one token each (for redis-py's execute_command)."""
    keys.validate_service_id(service_id)
    user = user or f"participant-{service_id}"
    if not _USER_RE.fullmatch(user):
        raise ConfigError(f"invalid ACL user name {user!r}: use 1-64 characters from A-Z a-z 0-9 _ . -")
    if not password:
        raise ConfigError("the participant's password must not be empty")
    key_patterns = [
        keys.commands_key(service_id),
        keys.errors_key(service_id),
        keys.response_prefix(service_id) + "*",
    ]
    return [
        "ACL",
        "SETUSER",
        user,
        "reset",
        "on",
        "#" + hashlib.sha256(password.encode("utf-8")).hexdigest(),
        *(f"~{pattern}" for pattern in key_patterns),
        *(f"+{command}" for command in CLIENT_COMMANDS),
    ]


def acl_line(tokens: list[str]) -> str:
    """One line for redis-cli; no token holds a space (ids are validated)."""
    return " ".join(tokens)


def config_line(tokens: list[str]) -> str:
    """The same rule as a ``user`` directive, for a redis.conf file given to redis-server at start.

    A server started with it has the participant's user before any client can connect, so the
    hosted setup needs no step that runs redis-cli against a live server.
    """
    assert tokens[:2] == ["ACL", "SETUSER"], tokens
    return " ".join(["user", *tokens[2:]])
