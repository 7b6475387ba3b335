"""An agent that looks around its container before it plays, for the isolation tests.

    python container_probe_main.py --tcp HOST:PORT --read PATH... --write PATH... -- AGENT_COMMAND...

It tries to connect to each ``--tcp`` address, to list and read each ``--read`` path and to
create a file in each ``--write`` folder, prints what it found as one line ``PROBE {json}`` on
stdout (the worker's log), then becomes the agent command (exec), which plays the evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys


def reach(address: str) -> str:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"
    return "connected"


def read(path: str) -> str:
    """What of ``path`` could be seen: its listing's names, or a file's first bytes."""
    try:
        if os.path.isdir(path):
            found = []
            for root, _, files in os.walk(path):
                for name in files:
                    with open(os.path.join(root, name), "rb") as handle:
                        found.append(f"{name}:{handle.read(16)!r}")
            return f"read {len(found)} files" if found else "nothing there"
        with open(path, "rb") as handle:
            return f"read {handle.read(16)!r}"
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"


def write(folder: str) -> str:
    try:
        with open(os.path.join(folder, "probe-was-here"), "w") as handle:
            handle.write("x")
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"
    return "written"


parser = argparse.ArgumentParser()
parser.add_argument("--tcp", nargs="*", default=[])
parser.add_argument("--read", nargs="*", default=[])
parser.add_argument("--write", nargs="*", default=[])
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
found = {
    "uid": os.getuid(),
    "redis_url": os.environ.get("ARBITER_REDIS_URL", "").split("@")[-1],  # the password left out
    "tcp": {address: reach(address) for address in args.tcp},
    "read": {path: read(path) for path in args.read},
    "write": {folder: write(folder) for folder in args.write},
}
print("PROBE " + json.dumps(found), flush=True)
command = args.command[1:] if args.command[:1] == ["--"] else args.command
os.execvp(command[0], command)
sys.exit(127)
