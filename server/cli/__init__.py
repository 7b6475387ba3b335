"""The command line and the local runner: ``arbiter``'s commands, ``arbiter run``, ``watch``, progress."""

from arbiter.server.cli.main import main

__all__ = ["main"]
