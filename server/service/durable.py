"""Durable writes to the results folder: what a power loss cannot take back once they return.

``append_synced`` is how every finished item reaches ``episodes.jsonl`` (one write, then the
disk's sync of its bytes and the file's size); ``atomic_write`` replaces a whole file (temp file,
fsync, rename); ``cut_to`` takes back a write the disk cut short.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


def fsync_folder(directory: str) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def atomic_write(path: str, data: str | bytes, sync_folder: bool = False) -> None:
    """Temp file, fsync, rename (and, with ``sync_folder``, fsync of the folder, so the rename
    itself survives a power loss). A failed write leaves the old file and no temp file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        if sync_folder:
            fsync_folder(os.path.dirname(path) or ".")
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def sync_data(handle: int) -> None:
    """Make an append durable: its bytes and what reading them back needs (the file's size),
    without the metadata no reader uses (its times), which fsync would commit as well: less for
    the disk to write on every item's path. fsync where the platform has no fdatasync."""
    getattr(os, "fdatasync", os.fsync)(handle)


def append_synced(path: str, data: bytes) -> int:
    """``data`` at the end of ``path`` in one write, on the disk when this returns; the file's
    size before. A write the disk cuts short is taken back, so the file ends where it ended
    before."""
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(handle).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(handle, view) :]
            sync_data(handle)
        except OSError:
            cut_to(path, size, handle)
            raise
    finally:
        os.close(handle)
    return size


def cut_to(path: str, size: int, handle: int | None = None) -> None:
    """``path`` back to ``size`` bytes: a write that failed takes nothing with it. When even
    this fails, what the write left is a torn item that every reader drops, or a whole one."""
    try:
        if handle is None:
            with open(path, "r+b") as opened:
                opened.truncate(size)
                os.fsync(opened.fileno())
        else:
            os.ftruncate(handle, size)
            os.fsync(handle)
    except OSError as exc:
        log.warning("cannot cut %s back to %d bytes: %s", path, size, exc)
