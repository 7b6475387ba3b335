"""arbiter's participant SDK.

from arbiter.client import RemoteClient, TimeoutException
"""

from arbiter.protocol.errors import ArbiterError, ServerUnavailable, TimeoutException

from .remote_client import RemoteClient

__all__ = ["ArbiterError", "RemoteClient", "ServerUnavailable", "TimeoutException"]
