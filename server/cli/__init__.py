"""The command line and the local runner: ``arbiter``'s commands, ``arbiter run``, ``watch``, progress.

``main`` is the ``arbiter`` command (``arbiter.server.cli:main``); it loads the command line only
when called, so the evaluator's modules that share this package's words and progress lines do not
load every command with them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from arbiter.server.cli.main import main as run
    except KeyboardInterrupt:  # Ctrl-C while the command line loads: said as after it, not a traceback
        print("arbiter: interrupted", file=sys.stderr)
        return 130
    return run(argv)


__all__ = ["main"]
