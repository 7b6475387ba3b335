"""The wire both sides agree on: message types, codec, Redis key names, errors.

Imports neither the server nor the client.
"""

from arbiter.protocol.errors import ArbiterError, TimeoutException
from arbiter.protocol.messages import FLATLAND_RL, PROTOCOL_VERSION

__all__ = ["ArbiterError", "TimeoutException", "FLATLAND_RL", "PROTOCOL_VERSION"]
