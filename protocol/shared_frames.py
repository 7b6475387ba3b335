"""Large observation arrays (game frames) through shared memory, when the agent runs on the
evaluator's machine; everything else still travels through Redis.

A 480×512×3 DIAMBRA frame through Redis is copied about ten times on its way (into the message,
the socket, Redis, its reply buffers, the agent's socket, hiredis, msgpack, numpy) and makes the
evaluator and Redis wait on each other's socket buffers: 1.6 ms a step. Through shared memory it
is copied twice (by the evaluator into the segment, by the agent out of it), the way Gymnasium's
``AsyncVectorEnv`` passes observations to its workers.

How the two sides agree (all under the ``"arbiter"`` extension key):

1. The agent's PING says ``"frames": "shared"``. An evaluator whose observations hold arrays of
   ``LARGE_ARRAY_BYTES`` or more creates a segment: an anonymous memory file (``memfd``) of a
   header and two slots, each big enough for one observation's large arrays. It is sealed
   against shrinking and growing before the evaluator maps it, and against writes (but through
   the evaluator's own mapping) before it is offered. Its PONG names it by the evaluator's
   descriptor: ``"frames": {"path": "/proc/<pid>/fd/<fd>", "size", "token"}``, a path only
   processes of the evaluator's user can open.
2. The agent maps the file read-only and checks the header's token (the file it opened is this
   evaluation's). From then on, every ENV_CREATE and ENV_STEP it sends says ``"frames":
   "shared"``. An agent that cannot (another machine, another container) never says so, and gets
   every array inline as before.
3. To a request that says so, the evaluator answers with each large array of the observation
   written into the next slot and replaced by ``{"__shared__": [offset, nbytes], "dtype",
   "shape"}``; the agent copies it out. The first such request tells the evaluator the file is
   mapped: it closes the descriptor, so the path is gone and the memory goes with the mappings.

Slots alternate: the agent has copied a reply's arrays before it sends the request whose reply
reuses that slot, and a resent request gets its cached reply, whose slot is still intact. The
evaluator never reads the segment, so an agent can change nothing through it (a process that
mapped it for writing in the microseconds before the write seal could change only what the agent
reads); and the size seals keep the evaluator alive: a file that a process of the same user could
shrink would make the evaluator's next write into its mapping a SIGBUS.
"""

from __future__ import annotations

import math
import mmap
import os
import secrets
import stat
from typing import Any

import numpy as np

from arbiter.protocol.errors import ArbiterError

try:
    import fcntl
except ImportError:  # Windows: no shared frames, arrays through Redis
    fcntl = None  # type: ignore[assignment]

PLACEHOLDER_KEY = "__shared__"
SHARED = "shared"  # the value of "frames" in requests that take shared arrays
LARGE_ARRAY_BYTES = 16 * 1024  # smaller arrays travel inline (a 128×128 frame is 16 KiB: shared)
# Python's fcntl names the other seals; this one is Linux 5.1's: no new writes or writable
# mappings, while the writable mapping made before it stays usable (the evaluator's own).
F_SEAL_FUTURE_WRITE = 0x0010
_SEALS = (
    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
    if hasattr(fcntl, "F_ADD_SEALS")
    else 0
)
_HEADER = 64  # bytes before the first slot: the token
_TOKEN_BYTES = 16
_ALIGN = 64


def large_array_bytes(space: Any) -> int:
    """The bytes of the arrays of ``LARGE_ARRAY_BYTES`` or more in one observation of ``space``."""
    kind = type(space).__name__
    if kind == "Dict":
        return sum(large_array_bytes(member) for member in space.spaces.values())
    if kind == "Tuple":
        return sum(large_array_bytes(member) for member in space.spaces)
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if not shape or dtype is None:
        return 0
    size = math.prod(shape) * dtype.itemsize
    return size if size >= LARGE_ARRAY_BYTES else 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class SharedFramesWriter:
    """The evaluator's side: one segment, written into and offered to one client at a time.
    ``OSError`` when this system cannot make a sealed memory file (no ``memfd_create``, a kernel
    before 5.1): the arrays then go through Redis."""

    def __init__(self, slot_bytes: int):
        self.slot_bytes = _aligned(slot_bytes)
        self.size = _HEADER + 2 * self.slot_bytes
        self.token = secrets.token_hex(_TOKEN_BYTES)
        if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
            raise OSError("no sealed memory files (memfd_create) on this system")
        fd = os.memfd_create("arbiter-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            # Its size is sealed before it is mapped: from the moment it exists another process
            # of this user can open it (as /proc/<pid>/fd/<n>), and a file shrunk under the
            # mapping would kill the evaluator with SIGBUS at its next write.
            os.ftruncate(fd, self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            if os.fstat(fd).st_size != self.size:
                raise OSError("the segment was resized before it was sealed")
            self._map = mmap.mmap(fd, self.size)
            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL)
                if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
                    raise OSError("the segment could not be sealed")
                self._map[:_TOKEN_BYTES] = bytes.fromhex(self.token)
            except BaseException:
                self._map.close()
                raise
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._slot = 0

    def offer(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "token": self.token}

    def claimed(self) -> None:
        """The client mapped the segment: its path is no longer needed (the mapping lives on)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def share(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with its observation's large arrays moved into the next slot."""
        observation = payload.get("observation")
        start = _HEADER + self._slot * self.slot_bytes
        cursor = [start, start + self.slot_bytes]
        shared = self._move(observation, cursor)
        if shared is observation:
            return payload
        self._slot ^= 1
        return {**payload, "observation": shared}

    def _move(self, value: Any, cursor: list[int]) -> Any:
        if isinstance(value, np.ndarray):
            nbytes = value.nbytes
            if nbytes < LARGE_ARRAY_BYTES or value.dtype.kind not in "biufc" or cursor[0] + nbytes > cursor[1]:
                return value
            offset = cursor[0]
            self._bytes[offset : offset + nbytes] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            cursor[0] = _aligned(offset + nbytes)
            return {PLACEHOLDER_KEY: [offset, nbytes], "dtype": value.dtype.str, "shape": list(value.shape)}
        if isinstance(value, dict):
            moved = {k: self._move(v, cursor) for k, v in value.items()}
            return value if all(moved[k] is value[k] for k in value) else moved
        if isinstance(value, (list, tuple)):
            items = [self._move(v, cursor) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def close(self) -> None:
        self.claimed()
        self._bytes = None  # type: ignore[assignment]  # the buffer export must go before the map closes
        self._map.close()


class SharedFramesReader:
    """The client's side: the segment an evaluator offered, mapped read-only."""

    def __init__(self, offer: Any):
        if not isinstance(offer, dict):
            raise ArbiterError("no shared frames offered")
        path, size, token = offer.get("path"), offer.get("size"), offer.get("token")
        if not (isinstance(path, str) and isinstance(size, int) and isinstance(token, str)):
            raise ArbiterError(f"a malformed shared frames offer: {offer!r}"[:200])
        # The path names a descriptor of the evaluator's: if it was closed and its number reused
        # (another client took over in between), it may name a pipe, which a blocking open of a
        # FIFO would wait on; any file that is not a regular one of the offered size is refused.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise ArbiterError(f"{path} is not the segment offered (not a regular file)")
            if status.st_size != size:
                raise ArbiterError(f"{path} is not the segment offered (its size differs)")
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if self._map[:_TOKEN_BYTES].hex() != token:
            self._map.close()
            raise ArbiterError(f"{path} is not the segment offered (its token differs)")
        self._size = size

    def restore(self, value: Any) -> Any:
        """``value`` with every placeholder replaced by a copy of its array."""
        if isinstance(value, dict):
            where = value.get(PLACEHOLDER_KEY)
            if where is not None:
                return self._array(where, value)
            return {k: self.restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.restore(v) for v in value]
        return value

    def _array(self, where: Any, spec: dict[str, Any]) -> np.ndarray:
        offset, nbytes = where
        dtype = np.dtype(spec["dtype"])
        shape = tuple(spec["shape"])
        if offset < _HEADER or offset + nbytes > self._size or math.prod(shape) * dtype.itemsize != nbytes:
            raise ArbiterError(f"a shared array outside its segment: {where!r}")
        return (
            np.frombuffer(self._map, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape).copy()
        )

    def close(self) -> None:
        self._map.close()
