"""``agent.log``: what a hosted evaluation's agent printed, in the evaluation's results folder.

The ``local``, ``podman`` and ``docker`` backends give the agent's stdout and stderr one pipe
(``AgentProcess.output``), which a thread of the work-horse drains into ``agent.log`` as fast as
the agent writes: the agent never waits on its output, whatever it prints. Each attempt appends
a part of its own, headed by one line naming the attempt and when its agent started (UTC), so a
retried or resumed evaluation keeps what its earlier attempts' agents printed.

A part keeps at most ``AGENT_LOG_CAP_BYTES`` of output: the first bytes up to that cap less
``AGENT_LOG_TAIL_BYTES``, and the last ``AGENT_LOG_TAIL_BYTES`` (where a traceback ends). What
lies between is read and dropped, and a line in its place says how many bytes were dropped.
The file is written only while the attempt may write its results folder (results_fence.py).

What an agent prints may include what it saw of the hidden test data: the evaluation's cause
names ``agent.log`` (``note``), never carries what it holds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import IO, BinaryIO

from arbiter.server.core.summary import iso_utc
from arbiter.server.service import results_fence

log = logging.getLogger(__name__)

AGENT_LOG = "agent.log"
AGENT_LOG_CAP_BYTES = 4 * 1024 * 1024  # of one attempt's output, its head and its tail together
AGENT_LOG_TAIL_BYTES = 64 * 1024  # the last bytes of an attempt's output, kept past the cap
READ_BYTES = 64 * 1024  # a pipe's default capacity: one read takes all it holds
# Once the agent's process group is gone, how long a process it left outside its group may hold
# the pipe before the part is closed without what it prints.
CLOSE_WAIT_S = 2.0


def header(attempt: int, started_at: float) -> bytes:
    """The line that opens an attempt's part."""
    return f"=== arbiter: attempt {attempt}, agent started {iso_utc(started_at)} ===\n".encode()


def cut_line(dropped: int) -> bytes:
    """The line in place of the output an attempt's part dropped."""
    return f"=== arbiter: output cut here, {dropped} bytes dropped ===\n".encode()


class AgentLog:
    """One attempt's part of ``agent.log`` in ``results_dir``: ``follow`` the agent's pipe once
    the agent started, ``close`` once its process group is gone. Output read otherwise (the
    Kubernetes backend's, from the API) is given to ``take`` once ``start`` opened the part."""

    def __init__(self, results_dir: str, attempt: int):
        self.path = os.path.join(results_dir, AGENT_LOG)
        self.attempt = attempt
        self.head_bytes = AGENT_LOG_CAP_BYTES - AGENT_LOG_TAIL_BYTES
        self.written = 0  # of the output, in the head
        self.dropped = 0
        self._tail = bytearray()  # the last bytes past the head
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()  # the file, between the draining thread and ``close``
        self._thread: threading.Thread | None = None
        self._last = b"\n"  # the last byte written: a part ends with a whole line
        self.kept = False  # this attempt's part was opened

    def follow(self, pipe: IO[bytes] | None) -> None:
        """Open this attempt's part (its header line) and drain ``pipe`` into it from a thread."""
        assert pipe is not None
        self.start()
        self._thread = threading.Thread(target=self._drain, args=(pipe,), name="agent-log", daemon=True)
        self._thread.start()

    def start(self, started_at: float | None = None) -> bool:
        """Open this attempt's part, its header naming ``started_at`` (now when None); whether
        it is kept (the attempt may write its results folder, and the file could be opened)."""
        self._file = self._open(time.time() if started_at is None else started_at)
        self.kept = self._file is not None
        return self.kept

    def _open(self, started_at: float) -> BinaryIO | None:
        if results_fence.refusal() is not None:
            return None
        opened = None
        try:
            opened = open(self.path, "a+b")  # closed by ``close``; always written at its end
            size = opened.seek(0, os.SEEK_END)
            if size and opened.seek(size - 1) >= 0 and opened.read(1) != b"\n":
                opened.write(b"\n")  # an earlier attempt's part cut mid-line: the header starts a line
            opened.write(header(self.attempt, started_at))
            opened.flush()
        except OSError as exc:
            log.error("the agent's output is not kept: %s: %s", self.path, exc)
            if opened is not None:
                opened.close()
            return None
        return opened

    def _drain(self, pipe: IO[bytes]) -> None:
        descriptor = pipe.fileno()
        try:
            while True:
                try:
                    chunk = os.read(descriptor, READ_BYTES)
                except OSError:
                    return
                if not chunk:
                    return
                self.take(chunk)
        finally:
            pipe.close()

    def take(self, chunk: bytes) -> None:
        """The next bytes of the agent's output."""
        with self._lock:
            room = self.head_bytes - self.written
            if room > 0:
                self._write(chunk[:room])
                self.written += min(room, len(chunk))
                chunk = chunk[room:]
            if chunk:  # past the head: the latest bytes wait in the tail, the older ones are dropped
                self._tail += chunk
                over = len(self._tail) - AGENT_LOG_TAIL_BYTES
                if over > 0:
                    del self._tail[:over]
                    self.dropped += over

    def _write(self, data: bytes) -> None:
        if self._file is None or not data:
            return
        if results_fence.refusal() is not None:  # another attempt may be writing this folder now
            self._close_file()
            return
        try:
            self._file.write(data)
            self._file.flush()
            self._last = data[-1:]
        except OSError as exc:  # a full disk: the evaluation's own writes say so; this part stops
            log.error("the agent's output is no longer kept: %s: %s", self.path, exc)
            self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def close(self) -> None:
        """Wait for the pipe's last bytes (every writer gone), then end the part: the cut line
        and the tail when output was dropped. Closing again does nothing."""
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_WAIT_S)
            if self._thread.is_alive():
                log.warning("a process the agent left holds its output open; agent.log keeps what came before")
        with self._lock:
            if self._file is None:
                return
            tail, self._tail = bytes(self._tail), bytearray()
            if self.dropped:
                self._write(b"" if self._last == b"\n" else b"\n")
                self._write(cut_line(self.dropped))
            self._write(tail)
            self._write(b"" if self._last == b"\n" else b"\n")
            self._close_file()

    def note(self, status: int, how: str | None = None) -> str | None:
        """What the evaluation's cause adds about the output of an agent that exited with
        ``status``, ended ``how`` (a container engine's failure names agent.log already)."""
        if status == 0 or not self.kept or (how and AGENT_LOG in how):
            return None
        return f"its output is in {AGENT_LOG}"
