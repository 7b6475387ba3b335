"""What a test folder holds, as one digest: which test set an evaluation played.

A path names a folder, not its contents: two participants' ``--tests data`` may hold other
episodes, and a folder may be regenerated between an evaluation's start and its resume. The
digest is SHA-256 over every file's path inside the folder (sorted, ``/``-separated) and its
contents' own SHA-256, so it is the same wherever the folder is mounted (a Kubernetes Job's
``/tests``, a worker's copy) and changes with any file. Names starting with a dot are not test
data (an editor's or a file system's leftovers) and are left out.

``seed.json`` keeps it beside the seed and the folder (``seeds.record_seed``), a resume refuses
a folder whose contents changed, ``summary.json`` carries it (``tests_digest``), and a board
ranks together only the evaluations played on one test set (leaderboard/entries.py).
"""

from __future__ import annotations

import hashlib
import os

from arbiter.protocol.errors import ConfigError

PREFIX = "sha256:"
CHUNK_BYTES = 1 << 20


def folder_digest(folder: str) -> str:
    """``sha256:<hex>`` of the test folder ``folder`` (see the module's docstring)."""
    if not os.path.isdir(folder):
        raise ConfigError(f"test folder {folder!r} is not a folder: its contents cannot be identified")
    whole = hashlib.sha256()
    for relative in sorted(_files(folder)):
        own = hashlib.sha256()
        try:
            with open(os.path.join(folder, relative), "rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    own.update(chunk)
        except OSError as exc:
            raise ConfigError(f"test folder {folder!r}: {relative} cannot be read ({exc.strerror or exc})") from None
        whole.update(relative.replace(os.sep, "/").encode("utf-8", "surrogateescape") + b"\0")
        whole.update(own.digest())
    return PREFIX + whole.hexdigest()


def _files(folder: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                found.append(os.path.relpath(os.path.join(root, name), folder))
    return found


def short(digest: str | None) -> str:
    """A digest as people compare them: its first twelve hex digits."""
    return "none" if not digest else digest.removeprefix(PREFIX)[:12]
