"""arbiter's participant SDK.

from arbiter.client import RemoteClient, RemoteEnv, TimeoutException
"""

from typing import Any

from arbiter.protocol.errors import ArbiterError, EvaluatorRestarted, ServerUnavailable, TimeoutException, WrongFormat

from .remote_client import RemoteClient

__all__ = [
    "ArbiterError",
    "EvaluatorRestarted",
    "RemoteClient",
    "RemoteEnv",
    "ServerUnavailable",
    "TimeoutException",
    "WrongFormat",
]


def __getattr__(name: str) -> Any:
    # RemoteEnv imports gymnasium: loaded on first use, so a Flatland agent's start stays fast.
    if name == "RemoteEnv":
        from .remote_env import RemoteEnv

        return RemoteEnv
    raise AttributeError(f"module 'arbiter.client' has no attribute {name!r}")
