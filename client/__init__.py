"""arbiter's participant SDK.

from arbiter.client import RemoteClient, RemoteEnv, TimeoutException
"""

from typing import TYPE_CHECKING, Any

from arbiter.protocol.errors import (
    ArbiterError,
    ClientConflict,
    ConfigError,
    DecodeError,
    EvaluationError,
    EvaluatorRestarted,
    InvalidAction,
    MessageTooLarge,
    OutOfOrder,
    ProtocolError,
    ServerUnavailable,
    TimeoutException,
    UnknownMessageType,
    VersionMismatch,
    WrongFormat,
)

if TYPE_CHECKING:
    from arbiter.client.remote_client import RemoteClient
    from arbiter.client.remote_env import RemoteEnv

__all__ = [
    "ArbiterError",
    "ClientConflict",
    "ConfigError",
    "DecodeError",
    "EvaluationError",
    "EvaluatorRestarted",
    "InvalidAction",
    "MessageTooLarge",
    "OutOfOrder",
    "ProtocolError",
    "RemoteClient",
    "RemoteEnv",
    "ServerUnavailable",
    "TimeoutException",
    "UnknownMessageType",
    "VersionMismatch",
    "WrongFormat",
]


def __getattr__(name: str) -> Any:
    # Each loaded on first use: RemoteEnv imports gymnasium, RemoteClient flatland's env, and
    # a module of this package run alone (the socket bridge) needs neither.
    if name == "RemoteClient":
        from arbiter.client.remote_client import RemoteClient

        return RemoteClient
    if name == "RemoteEnv":
        from arbiter.client.remote_env import RemoteEnv

        return RemoteEnv
    raise AttributeError(f"module 'arbiter.client' has no attribute {name!r}")
