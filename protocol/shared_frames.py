"""Large observation arrays (game frames) through shared memory, when the agent runs on the
evaluator's machine; everything else still travels through Redis.

A 480×512×3 DIAMBRA frame through Redis is copied about ten times on its way (into the message,
the socket, Redis, its reply buffers, the agent's socket, hiredis, msgpack, numpy) and makes the
evaluator and Redis wait on each other's socket buffers: 1.6 ms a step. Through shared memory it
is copied once, by the evaluator into the segment; the agent's observation is a view of it, the
way Gymnasium's ``AsyncVectorEnv(copy=False)`` hands its workers' observations over.

How the two sides agree (all under the ``"arbiter"`` extension key):

1. The agent's PING says ``"frames": "shared"``. An evaluator whose observations hold arrays of
   ``LARGE_ARRAY_BYTES`` or more creates a segment: an anonymous memory file (``memfd``) of a
   header and ``slots`` slots, each big enough for one observation's large arrays. It is sealed
   against shrinking and growing before the evaluator maps it. Its PONG names it by the
   evaluator's descriptor: ``"frames": {"path": "/proc/<pid>/fd/<fd>", "size", "token", "slots",
   "slot_bytes"}``, a path only processes of the evaluator's user can open.
2. The agent maps the file and checks the header's token (the file it opened is this
   evaluation's). From then on, every ENV_CREATE and ENV_STEP it sends names the slot its reply's
   arrays go to: ``"frames": k``. An agent that cannot map it (another machine, another
   container) never says so, and gets every array inline as before.
3. To such a request, the evaluator answers with each large array of the observation written
   into slot ``k`` and replaced by ``{"__shared__": [offset, nbytes], "dtype", "shape"}``. The
   first such request tells the evaluator the file is mapped: it closes the descriptor, so the
   path is gone and the memory goes with the mappings.

**Who may write a slot.** The agent owns the slots, and the evaluator writes one only while
answering a request that names it. The agent's observation arrays are views of their slot (its
*lease*): the slot is named again only once every array viewing it is gone (a finalizer on the
view they all share). An agent that keeps more observations than there are slots (a list of
frames as a replay buffer) gets the next ones copied out of slot 0, kept for that. A slot named
by a request whose reply never came (an error, a lost connection) is named again only once a
later request has its reply: the evaluator answers requests in order, so by then it will never
write that slot for the earlier one. A resent request names the same slot and is answered from
the evaluator's cached reply, without a write.

An older agent says ``"frames": "shared"`` in its requests and copies each array out of the slot
named in its reply; the evaluator alternates slots 0 and 1 for it (the agent has copied a reply's
arrays before it sends the request whose reply reuses that slot). A newer agent meeting an
evaluator whose offer names no slots does the same.

The evaluator never reads the segment, so nothing written into it (by the agent, to its own
observations) reaches the evaluation; and the size seals keep the evaluator alive: a file that a
process of the same user could shrink would make the evaluator's next write into its mapping a
SIGBUS.
"""

from __future__ import annotations

import math
import mmap
import os
import secrets
import stat
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.large_arrays import (
    LARGE_ARRAY_BYTES,
    SHAREABLE_KINDS,
    LargeArray,
    large_arrays,
    member_at,
    replaced_at,
)

try:
    import fcntl
except ImportError:  # Windows: no shared frames, arrays through Redis
    fcntl = None  # type: ignore[assignment]

PLACEHOLDER_KEY = "__shared__"
SHARED = "shared"  # "frames" in the handshake, and in an older agent's requests (copied out)
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if hasattr(fcntl, "F_ADD_SEALS") else 0
_HEADER = 64  # bytes before the first slot: the token
_TOKEN_BYTES = 16
_ALIGN = 64
# How many observations an agent may hold without copies (one slot is kept for copying out),
# within a bound on the segment's memory.
MOST_SLOTS = 8
MOST_SEGMENT_BYTES = 128 * 1024 * 1024
COPY_SLOT = 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _slot_start(slot: int, slot_bytes: int) -> int:
    return _HEADER + slot * slot_bytes


def slots_for(slot_bytes: int) -> int:
    """How many slots a segment of ``slot_bytes`` slots has: ``MOST_SLOTS`` while they fit in
    ``MOST_SEGMENT_BYTES``, never fewer than two (an older agent's alternation)."""
    return max(2, min(MOST_SLOTS, MOST_SEGMENT_BYTES // max(slot_bytes, 1)))


class SharedFramesWriter:
    """The evaluator's side: one segment, written into and offered to one client at a time.
    ``OSError`` when this system cannot make a sealed memory file (no ``memfd_create``): the
    arrays then go through Redis.

    ``arrays``: the large arrays the observation space declares (``large_arrays``). Each gets a
    place of its own in every slot, and an observation that holds them as the space says is
    shared by going straight to them; any other observation is searched for large arrays."""

    def __init__(self, slot_bytes: int, slots: int | None = None, arrays: Sequence[LargeArray] = ()):
        starts, end = _places(arrays)
        self.slot_bytes = _aligned(max(slot_bytes, end))
        self.slots = slots_for(self.slot_bytes) if slots is None else slots
        if self.slots < 2:
            raise ValueError(f"a segment has at least two slots, not {self.slots}")
        self.size = _HEADER + self.slots * self.slot_bytes
        self.token = secrets.token_hex(_TOKEN_BYTES)
        if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
            raise OSError("no sealed memory files (memfd_create) on this system")
        fd = os.memfd_create("arbiter-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            # Its size is sealed before it is mapped: from the moment it exists another process
            # of this user can open it (as /proc/<pid>/fd/<n>), and a file shrunk under the
            # mapping would kill the evaluator with SIGBUS at its next write.
            os.ftruncate(fd, self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            if os.fstat(fd).st_size != self.size or fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
                raise OSError("the segment could not be sealed at its size")
            self._map = mmap.mmap(fd, self.size)
            self._map[:_TOKEN_BYTES] = bytes.fromhex(self.token)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self._alternate = 0
        self._arrays = tuple(arrays)
        # Per slot, each declared array's view of the segment and its placeholder (the same
        # object in every reply that names the slot: replies are encoded, never changed).
        self._views: list[list[np.ndarray]] = []
        self._placeholders: list[list[dict[str, Any]]] = []
        for slot in range(self.slots if self._arrays else 0):
            offsets = [_slot_start(slot, self.slot_bytes) + start for start in starts]
            places = list(zip(self._arrays, offsets, strict=True))
            self._views.append([self._view(array, offset) for array, offset in places])
            self._placeholders.append([_placeholder(offset, array.nbytes, array.dtype, array.shape)
                                       for array, offset in places])  # fmt: skip

    def _view(self, array: LargeArray, offset: int) -> np.ndarray:
        return self._bytes[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)

    @classmethod
    def for_space(cls, space: Any) -> SharedFramesWriter | None:
        """A segment for observations of ``space``; None when it declares no large arrays."""
        arrays = large_arrays(space)
        return cls(0, arrays=arrays) if arrays else None

    def offer(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "token": self.token, "slots": self.slots,
                "slot_bytes": self.slot_bytes}  # fmt: skip

    def claimed(self) -> None:
        """The client mapped the segment: its path is no longer needed (the mapping lives on)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def share(self, payload: dict[str, Any], slot: int | None = None) -> dict[str, Any]:
        """``payload`` with its observation's large arrays moved into ``slot`` (one the client
        named), or, for an older client (None), into slots 0 and 1 in turn."""
        chosen = self._alternate if slot is None else slot
        if not 0 <= chosen < self.slots:
            raise ValueError(f"slot {chosen} of a segment of {self.slots}")
        observation = payload.get("observation")
        shared = self._place(observation, chosen) if self._arrays else None
        if shared is None:
            start = _slot_start(chosen, self.slot_bytes)
            shared = self._move(observation, [start, start + self.slot_bytes])
        if shared is observation:
            return payload
        if slot is None:
            self._alternate ^= 1
        return {**payload, "observation": shared}

    def _place(self, observation: Any, slot: int) -> Any:
        """``observation`` with its declared arrays in ``slot``, reached by their paths; None
        when one is not there as the space declares it (missing, another dtype or shape)."""
        placed = observation
        for array, view, placeholder in zip(self._arrays, self._views[slot], self._placeholders[slot], strict=True):
            value = member_at(observation, array.path)
            if type(value) is not np.ndarray or value.dtype != array.dtype or value.shape != array.shape:
                return None
            np.copyto(view, value)
            placed = replaced_at(placed, array.path, placeholder)
        return placed

    def _move(self, value: Any, cursor: list[int]) -> Any:
        """``value`` with every large array found in it moved into the segment from ``cursor``."""
        if isinstance(value, np.ndarray):
            nbytes = value.nbytes
            if nbytes < LARGE_ARRAY_BYTES or value.dtype.kind not in SHAREABLE_KINDS or cursor[0] + nbytes > cursor[1]:
                return value
            offset = cursor[0]
            self._bytes[offset : offset + nbytes] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            cursor[0] = _aligned(offset + nbytes)
            return _placeholder(offset, nbytes, value.dtype, value.shape)
        if isinstance(value, dict):
            moved = {k: self._move(v, cursor) for k, v in value.items()}
            return value if all(moved[k] is value[k] for k in value) else moved
        if isinstance(value, (list, tuple)):
            items = [self._move(v, cursor) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def close(self) -> None:
        self.claimed()
        # The buffer's exports must go before the map closes.
        self._bytes = self._views = None  # type: ignore[assignment]
        self._map.close()


def _places(arrays: Sequence[LargeArray]) -> tuple[list[int], int]:
    """Where each array starts in a slot, and where the last one ends: aligned."""
    starts, end = [], 0
    for array in arrays:
        starts.append(end)
        end = _aligned(end + array.nbytes)
    return starts, end


def _placeholder(offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """What stands in a reply for an array in the segment (the client's ``_array`` reads it)."""
    return {PLACEHOLDER_KEY: [offset, nbytes], "dtype": dtype.str, "shape": list(shape)}


def _slot_layout(offer: dict[str, Any], size: int) -> tuple[int, int] | None:
    """The offer's ``(slots, slot_bytes)`` if it names slots that fit its size; None for an
    older evaluator's offer (two slots, alternating, copied out)."""
    slots, slot_bytes = offer.get("slots"), offer.get("slot_bytes")
    if type(slots) is not int or type(slot_bytes) is not int:
        return None
    if slots < 2 or slot_bytes <= 0 or slot_bytes % _ALIGN or _HEADER + slots * slot_bytes > size:
        raise ArbiterError(f"a malformed shared frames offer: {offer!r}"[:200])
    return slots, slot_bytes


class SharedFramesReader:
    """The client's side: the segment an evaluator offered, mapped. Before each request that
    may bring an observation, ``ask()`` gives the request's ``"frames"`` (None: ask for nothing,
    the arrays then come inline); ``restore()`` turns the reply's placeholders into arrays."""

    def __init__(self, offer: Any):
        if not isinstance(offer, dict):
            raise ArbiterError("no shared frames offered")
        path, size, token = offer.get("path"), offer.get("size"), offer.get("token")
        if not (isinstance(path, str) and isinstance(size, int) and isinstance(token, str)):
            raise ArbiterError(f"a malformed shared frames offer: {offer!r}"[:200])
        layout = _slot_layout(offer, size)
        # The path names a descriptor of the evaluator's: if it was closed and its number reused
        # (another client took over in between), it may name a pipe, which a blocking open of a
        # FIFO would wait on; any file that is not a regular one of the offered size is refused.
        flags = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        fd = os.open(path, (os.O_RDWR if layout else os.O_RDONLY) | flags)
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise ArbiterError(f"{path} is not the segment offered (not a regular file)")
            if status.st_size != size:
                raise ArbiterError(f"{path} is not the segment offered (its size differs)")
            # Observations viewing a slot are writable, as an env's own are.
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if layout else 0))
        finally:
            os.close(fd)
        if self._map[:_TOKEN_BYTES].hex() != token:
            self._map.close()
            raise ArbiterError(f"{path} is not the segment offered (its token differs)")
        self._size = size
        self.slots, self.slot_bytes = layout or (2, 0)
        self.leasing = layout is not None
        # Slots no observation views, the most recently freed last (named first: warm in cache).
        self._free = list(range(self.slots - 1, COPY_SLOT, -1))
        self._copy_slot_free = True
        self._asked: int | None = None  # the slot the request on its way named
        self._unsettled: list[int] = []  # slots named by requests whose reply never came

    def ask(self) -> Any:
        """The ``"frames"`` of the next request: the slot its reply's arrays go to (``"shared"``
        for an older evaluator; None when every slot is taken, and the arrays come inline)."""
        if not self.leasing:
            return SHARED
        if self._asked is not None:  # the last request got no reply (an error, a lost connection)
            self._unsettled.append(self._asked)
            self._asked = None
        if self._free:
            self._asked = self._free.pop()
        elif self._copy_slot_free:
            self._asked = COPY_SLOT
            self._copy_slot_free = False
        return self._asked

    def restore(self, value: Any) -> Any:
        """``value`` (a reply's observation) with every placeholder replaced by its array: a view
        of the slot the request named, or, out of the copy slot or an older evaluator's
        alternating slots, a copy."""
        slot, self._asked = self._asked, None
        if self._unsettled:  # a reply came: the evaluator is done with the earlier requests
            for earlier in self._unsettled:
                self._settle(earlier)
            self._unsettled.clear()
        lease: list[np.ndarray] = []
        try:
            return self._restore(value, slot, lease)
        finally:
            if slot is not None and not lease:
                self._settle(slot)  # nothing views it (the copy slot, or no arrays shared)

    def _settle(self, slot: int) -> None:
        if slot == COPY_SLOT:
            self._copy_slot_free = True
        else:
            self._free.append(slot)

    def _restore(self, value: Any, slot: int | None, lease: list[np.ndarray]) -> Any:
        """``value`` with its placeholders replaced, in place: a reply is decoded afresh, so
        its maps and lists are the client's own."""
        if type(value) is dict:
            where = value.get(PLACEHOLDER_KEY)
            if where is not None:
                return self._array(where, value, slot, lease)
            members: Any = value.items()
        elif type(value) is list:
            members = enumerate(value)
        else:
            return value
        for key, member in members:  # replacing a member changes no size: the walk goes on
            if type(member) is dict or type(member) is list:
                restored = self._restore(member, slot, lease)
                if restored is not member:
                    value[key] = restored
        return value

    def _array(self, where: Any, spec: dict[str, Any], slot: int | None, lease: list[np.ndarray]) -> np.ndarray:
        offset, nbytes = where
        dtype = np.dtype(spec["dtype"])
        shape = tuple(spec["shape"])
        if offset < _HEADER or offset + nbytes > self._size or math.prod(shape) * dtype.itemsize != nbytes:
            raise ArbiterError(f"a shared array outside its segment: {where!r}")
        if slot is not None and slot != COPY_SLOT:
            start = _slot_start(slot, self.slot_bytes)
            if start <= offset and offset + nbytes <= start + self.slot_bytes:
                if not lease:  # the slot's one view, which every array of this reply is a view of
                    view = np.frombuffer(self._map, dtype=np.uint8, count=self.slot_bytes, offset=start)
                    weakref.finalize(view, self._free.append, slot)
                    lease.append(view)
                return lease[0][offset - start : offset - start + nbytes].view(dtype).reshape(shape)
        array = np.frombuffer(self._map, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        return array.reshape(shape).copy()

    def close(self) -> None:
        """Unmap the segment, or leave it to go with the last observation that views it."""
        try:
            self._map.close()
        except BufferError:
            pass
