"""Durable writes to the results folder: what a power loss cannot take back once they return.

``append_synced`` is how every finished item reaches ``episodes.jsonl`` (one write, then the
disk's sync of its bytes and the file's size); ``start_append`` does it in two halves, for a
caller with work to do while the disk writes; ``atomic_write`` replaces a whole file (temp file,
fsync, rename); ``cut_to`` takes back a write the disk cut short; ``replace_folder`` puts a
folder written elsewhere in the place of another (generated test data, ``folder_written_whole``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

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
            _write_all(handle, data)
            sync_data(handle)
        except OSError:
            cut_to(path, size, handle)
            raise
    finally:
        os.close(handle)
    return size


def _write_all(handle: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view) :]


def _writeback_starter() -> object:
    """Linux's ``sync_file_range``, which starts writing a file's range to the disk and returns at
    once; None where there is none (the sync that follows does the whole work)."""
    try:
        start = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    start.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    start.restype = ctypes.c_int
    return start


_start_writeback = _writeback_starter()
SYNC_FILE_RANGE_WRITE = 2


class PendingAppend:
    """An append written and on its way to the disk (``start_append``); ``finish`` makes it durable."""

    def __init__(self, path: str, handle: int, size: int, took_s: float):
        self.path, self.handle, self.size = path, handle, size
        self.took_s = took_s  # the time spent making it durable: the write, then the sync

    def finish(self) -> None:
        """Return once the disk has the append. A sync the disk refuses takes the append back (the
        file ends where it ended before) and raises its OSError."""
        began = time.perf_counter()
        try:
            try:
                sync_data(self.handle)
            except OSError:
                cut_to(self.path, self.size, self.handle)
                raise
        finally:
            os.close(self.handle)
        self.took_s += time.perf_counter() - began


def start_append(path: str, data: bytes) -> PendingAppend:
    """``append_synced``'s first half: ``data`` at the end of ``path`` in one write, and the disk
    asked to start writing it (Linux), without waiting. The work done before ``finish`` overlaps
    the disk's, so the sync then has less to wait for. A write the disk cuts short is taken back
    and raised at once."""
    began = time.perf_counter()
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(handle).st_size
        try:
            _write_all(handle, data)
        except OSError:
            cut_to(path, size, handle)
            raise
    except BaseException:
        os.close(handle)
        raise
    if _start_writeback is not None:
        _start_writeback(handle, size, len(data), SYNC_FILE_RANGE_WRITE)  # a hint: failing costs nothing
    return PendingAppend(path, handle, size, time.perf_counter() - began)


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


@contextlib.contextmanager
def folder_written_whole(out_dir: str | os.PathLike[str], *, overwrite: bool) -> Iterator[Path]:
    """A folder to write, beside ``out_dir``, that becomes ``out_dir`` once the block ends (and is
    removed if it raises). An ``out_dir`` that holds anything is refused unless ``overwrite``, then
    replaced whole: never written into, never half old, half new."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        # --overwrite replaces a folder of data: a file there is someone's, never removed for it.
        raise FileExistsError(f"{out} is a file, not a folder: give another --out")
    if out.exists() and overwrite and Path.cwd().resolve().is_relative_to(out.resolve()):
        # Replacing the folder one works in moves it away under one's feet (or fails half way).
        raise FileExistsError(f"{out} holds the current folder, which --overwrite would remove: give another --out")
    if out.exists() and any(out.iterdir()) and not overwrite:
        # Said in the command's words: the functions' own keyword is overwrite=True.
        raise FileExistsError(f"{out} exists and is not empty; give --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    written = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        yield written
        written.chmod(0o755)  # mkdtemp makes it 0700; the evaluator may run as another user
        replace_folder(written, out)
    except BaseException:
        shutil.rmtree(written, ignore_errors=True)
        raise


def replace_folder(written: Path, out: Path) -> None:
    """Rename ``written`` (a folder beside ``out``) to ``out``; an ``out`` already there, which the
    caller decided may be replaced, is moved aside first and removed after, so ``out`` is never
    half old, half new."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        trash = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, trash / "old")
        os.replace(written, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(written, out)  # POSIX rename replaces an empty directory atomically
