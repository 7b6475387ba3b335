"""Addresses on this machine's loopback for the Redis servers arbiter starts itself.

flatland-rl's own client connects to port 6379 of the host named in ``$redis_ip`` (127.0.0.1
when unset), so a Redis started for it listens on port 6379 if it can: on 127.0.0.1, else on
the next loopback address free on that port (Linux routes all of 127.0.0.0/8 to the loopback),
which the agent is given as ``$redis_ip``. Two evaluations on one machine then each have one.
"""

from __future__ import annotations

import socket

HOST = "127.0.0.1"
DEFAULT_PORT = 6379
LOOPBACK_HOSTS = 64  # the loopback addresses tried for a port: 127.0.0.1 to 127.0.0.64


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` right now.

    SO_REUSEADDR mirrors what redis-server itself sets, so a port only lingering in TIME_WAIT
    counts as free, while one with a listener (on this address or on 0.0.0.0) does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS considers free now; another process may still take it before we listen."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_loopback_address(port: int) -> str | None:
    """127.0.0.1 if ``port`` is free there, else the first loopback address where it is; None
    when it is free on none of them (a server listening on every address holds it)."""
    for n in range(1, LOOPBACK_HOSTS + 1):
        if port_is_free(f"127.0.0.{n}", port):
            return f"127.0.0.{n}"
    return None
