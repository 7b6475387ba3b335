"""A file a command writes where its user said (``arbiter report --out``, ``arbiter replay --out``).

Missing folders on its path are made, as ``arbiter run --results`` makes its own; a file where
one of them should be, or a folder where the file should be, is an error that names it, found
before anything is computed or written.
"""

from __future__ import annotations

import os

from arbiter.protocol.errors import ConfigError


def nearest_existing(path: str) -> str:
    """``path`` itself, made absolute, or the nearest of its parents that exists: what decides
    whether the folders it lacks can be made (a file there cannot hold one)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return existing


def check_output_file(path: str, option: str = "--out") -> None:
    """``ConfigError`` when ``path`` cannot be written as a file: it is a folder, or something on
    its way that exists is not a folder."""
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path!r} is a folder: name the file to write")
    folder = nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(folder):
        raise ConfigError(f"{option} {path!r}: {folder!r} is a file, not a folder")


def make_output_folder(path: str, option: str = "--out") -> None:
    """The folder of ``path``, made with any folder missing above it (``check_output_file`` first)."""
    check_output_file(path, option)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make the folder of {option} {path!r}: {exc.strerror or exc}") from None
