"""arbiter's participant SDK.

from arbiter.client import RemoteClient, RemoteEnv, TimeoutException
"""

from typing import Any

from arbiter.client.remote_client import RemoteClient
from arbiter.protocol.errors import ArbiterError, EvaluatorRestarted, ServerUnavailable, TimeoutException, WrongFormat

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
        from arbiter.client.remote_env import RemoteEnv

        return RemoteEnv
    raise AttributeError(f"module 'arbiter.client' has no attribute {name!r}")
