"""arbiter's participant SDK.

from arbiter.client import RemoteClient, TimeoutException
"""

from arbiter.protocol.errors import ArbiterError, EpisodeLost, ServerUnavailable, TimeoutException

from .remote_client import RemoteClient

__all__ = ["ArbiterError", "EpisodeLost", "RemoteClient", "ServerUnavailable", "TimeoutException"]
