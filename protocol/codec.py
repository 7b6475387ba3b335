"""The only module that touches the wire format: msgpack, and pickle for flatland's legacy client.

Compatible with flatland-rl's msgpack_numpy-patched peers: numpy arrays and scalars travel as
maps with bytes keys ``{b'nd', b'type', b'kind', b'shape', b'data'}``, fractions as
``{'__fraction__': True, 'as_str': '(1, 4)'}``. Unlike msgpack_numpy, arrays are rebuilt only for
plain dtypes (bool, int, uint, float, complex): the object-dtype path, which msgpack_numpy hands
to ``pickle.loads``, is rejected. Sizes and nesting are bounded before anything is built.

``FlatlandRemoteClient(use_pickle=True)`` pickles its requests and unpickles what it gets back:
``decode_request`` tells the two formats apart and loads pickles with ``safe_pickle``'s restricted
unpickler (plain data, numpy arrays and scalars of plain dtypes, fractions, flatland's enums as
ints); ``encode(message, wire=PICKLE)`` answers such a client in its own format.
"""

from __future__ import annotations

import enum
import io
import itertools
import os
import pickle
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from msgpack.exceptions import ExtraData

from arbiter.protocol.errors import DecodeError, MessageTooLarge
from arbiter.protocol.legacy import safe_pickle

# msgpack's own implementation, bound explicitly: importing flatland runs msgpack_numpy.patch(),
# which replaces msgpack.packb/unpackb with versions that unpickle object arrays. Through the
# module attributes, the codec would inherit that code-execution path.
try:
    from msgpack import _cmsgpack as _msgpack
except ImportError:  # pure-Python builds of msgpack
    from msgpack import fallback as _msgpack


@dataclass(frozen=True)
class Limits:
    """Bounds checked while decoding, so hostile input costs little to reject."""

    max_bytes: int
    max_depth: int
    max_container_len: int
    max_str_len: int
    # Walk the structure before building it (bounds nesting and claimed sizes against hostile
    # input). Needed for what agents send; replies come from the evaluator, which the client
    # trusts with its whole environment anyway, and are large: they skip the (Python) walk.
    prescan: bool = True


# A request from an agent: small by nature (the biggest is an action dict of a few hundred agents).
COMMAND_LIMITS = Limits(max_bytes=64 * 1024, max_depth=16, max_container_len=10_000, max_str_len=4096)
# A reply from the evaluator carries the env's state: large, but from the trusted side.
REPLY_LIMITS = Limits(
    max_bytes=256 * 1024 * 1024,
    max_depth=64,
    max_container_len=50_000_000,
    max_str_len=64 * 1024 * 1024,
    prescan=False,
)

# The two wire formats a request can come in; replies go back in the request's.
MSGPACK = "msgpack"
PICKLE = "pickle"

_PLAIN_DTYPE_RE = re.compile(r"[<>|=]?[biufc]\d{1,2}")
_FRACTION_RE = re.compile(r"\(\s*(-?\d{1,300})\s*,\s*(-?\d{1,300})\s*\)")
_MAX_NDIM = 32


_VIEW_FROM_BYTES = 4096


def _array_bytes(array: np.ndarray) -> Any:
    """The array's bytes for msgpack: a large one as a view of its memory, which msgpack copies
    once into the message (``tobytes`` would copy it twice; a 480×512×3 frame encodes ~15× faster)."""
    if array.nbytes >= _VIEW_FROM_BYTES:
        return memoryview(np.ascontiguousarray(array)).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer
    return np.ascontiguousarray(array).tobytes()


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc":
            raise TypeError(f"cannot encode numpy array of dtype {obj.dtype}")
        return {
            b"nd": True,
            b"type": obj.dtype.str,
            b"kind": b"",
            b"shape": list(obj.shape),
            b"data": _array_bytes(obj),
        }
    if isinstance(obj, (np.bool_, np.number)):
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    if isinstance(obj, Fraction):
        return {"__fraction__": True, "as_str": str((obj.numerator, obj.denominator))}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    if hasattr(obj, "value") and isinstance(obj.value, int):
        # fastenum members (flatland's RailEnvActions) are not enum.Enum but carry .value
        return obj.value
    if type(obj) is Packed:
        raise _HoldsPacked
    raise TypeError(f"cannot encode {type(obj).__name__}")


class _HoldsPacked(Exception):
    """The message holds a Packed value: ``encode`` packs it again, splicing (see Packed)."""


# Replies to a pickling client: protocol 4, what flatland's client writes, readable by Python 3.4+.
PICKLE_REPLY_PROTOCOL = 4
# The functions and classes that numpy's, Fraction's and _ReplyPickler's own reductions name.
_REPLY_GLOBALS = (int, str, float, dict, list, tuple, Fraction, np.dtype, np.ndarray)
_GLOBAL_KINDS = (type, types.FunctionType, types.BuiltinFunctionType)


class _ReplyPickler(pickle.Pickler):
    """Pickled replies hold what msgpack replies hold (``_default``): plain data, numpy data of
    plain dtypes, fractions, enum members as their values, container subclasses as the plain
    container; so the client needs nothing of arbiter to load them."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _GLOBAL_KINDS):
            if obj not in _REPLY_GLOBALS and not str(getattr(obj, "__module__", "")).startswith("numpy."):
                raise TypeError(f"cannot encode {obj!r}")
            return NotImplemented
        if isinstance(obj, (np.ndarray, np.generic, np.dtype)):
            dtype = obj if isinstance(obj, np.dtype) else obj.dtype
            if dtype.kind not in "biufc":
                raise TypeError(f"cannot encode numpy data of dtype {dtype}")
            return NotImplemented
        if isinstance(obj, Fraction):
            return NotImplemented
        if type(obj) is Packed:
            obj = obj.value
        for container in (dict, list, tuple):
            if isinstance(obj, container):
                return container, (container(obj),)
        plain = _default(obj)  # enum members and sets as msgpack sends them; TypeError for the rest
        return type(plain), (plain,)


# What stands in for a Packed value while the message around it is packed: bytes no message
# holds (a per-process random prefix), one value per Packed, replaced by its bytes afterwards.
_MARKER_PREFIX = b"arbiter.Packed:" + os.urandom(16).hex().encode() + b":"
_MARKER_SERIAL = itertools.count()


class Packed:
    """A map or list whose msgpack form is built once, here, and spliced into every message that
    holds it: a large part of a reply (a Flatland env's state) is then packed while the evaluator
    would otherwise wait, not while the agent waits for the reply. ``value`` stays what it was
    given (a pickled reply holds it as it is); it must not change once packed."""

    __slots__ = ("value", "packed", "_marker")

    def __init__(self, value: dict[Any, Any] | list[Any]):
        if not isinstance(value, (dict, list)):
            raise TypeError(f"Packed holds a map or a list, not {type(value).__name__}")
        self.value = value
        self.packed = encode(value)
        marker = _MARKER_PREFIX + str(next(_MARKER_SERIAL)).encode()
        # The marker's own msgpack form (bin 8: 0xc4, its length, its bytes) is what gets replaced.
        self._marker = (marker, b"\xc4" + bytes([len(marker)]) + marker)


def _pack_with_packed_values(message: Any) -> bytes:
    """``message`` packed, its Packed values as their own bytes: each packed first as a marker,
    then the marker's bytes replaced. msgpack's containers count their elements, not their bytes,
    so a value's bytes can stand in for any other value's."""
    values: list[Packed] = []

    def default(obj: Any) -> Any:
        if type(obj) is Packed:
            values.append(obj)
            return obj._marker[0]
        return _default(obj)

    packed = _msgpack.Packer(use_bin_type=True, default=default).pack(message)
    for value in dict.fromkeys(values):  # the same value may sit in a message more than once
        marker_bytes = value._marker[1]
        if packed.count(marker_bytes) != values.count(value):
            raise ValueError("a Packed value's marker is ambiguous in the message")
        packed = packed.replace(marker_bytes, value.packed)
    return packed


def encode(message: Any, wire: str = MSGPACK) -> bytes:
    try:
        if wire == MSGPACK:
            try:
                return _msgpack.Packer(use_bin_type=True, default=_default).pack(message)
            except _HoldsPacked:  # rare (Flatland's create replies): the common path pays nothing for it
                return _pack_with_packed_values(message)
        if wire == PICKLE:
            buffer = io.BytesIO()
            _ReplyPickler(buffer, protocol=PICKLE_REPLY_PROTOCOL).dump(message)
            return buffer.getvalue()
    except (TypeError, ValueError, OverflowError, pickle.PicklingError) as exc:
        raise DecodeError(f"cannot encode message: {exc}") from exc
    raise ValueError(f"unknown wire format {wire!r}")


# Plain dtypes seen so far, by their wire name (str or bytes): a DIAMBRA observation holds a
# dozen arrays. Bounded: only names that _PLAIN_DTYPE_RE accepts get in (a few thousand at most).
_PLAIN_DTYPES: dict[str | bytes, np.dtype] = {}


def _plain_dtype(name: Any) -> np.dtype:
    dtype_str = name.decode("ascii", "replace") if isinstance(name, bytes) else name
    if not isinstance(dtype_str, str) or not _PLAIN_DTYPE_RE.fullmatch(dtype_str):
        raise DecodeError(f"numpy payload of unsupported dtype {dtype_str!r} (only plain dtypes are accepted)")
    try:
        dtype = np.dtype(dtype_str)
    except TypeError as exc:
        raise DecodeError(f"bad numpy dtype {dtype_str!r}") from exc
    _PLAIN_DTYPES[name] = dtype
    return dtype


def _numpy_from_map(obj: dict) -> Any:
    # Runs for every small array of every observation: its checks are plain type tests and lookups.
    kind = obj.get(b"kind", b"")
    if kind != b"" and kind != "":
        raise DecodeError(
            f"numpy payload of unsupported dtype {obj.get(b'type')!r} of kind {kind!r} (only plain dtypes are accepted)"
        )
    name = obj.get(b"type")
    try:
        dtype = _PLAIN_DTYPES[name]  # type: ignore[index]  # a name from the wire, of any type
    except (KeyError, TypeError):  # not seen yet, or unhashable: checked there
        dtype = _plain_dtype(name)
    data = obj.get(b"data")
    if not isinstance(data, bytes):
        raise DecodeError("numpy payload without bytes data")
    if obj[b"nd"] is True:
        shape = obj.get(b"shape")
        if (type(shape) is not list and type(shape) is not tuple) or len(shape) > _MAX_NDIM:
            raise DecodeError(f"bad numpy shape {shape!r}")
        count = 1
        for n in shape:
            if type(n) is not int or n < 0:
                raise DecodeError(f"bad numpy shape {shape!r}")
            count *= n
        if count * dtype.itemsize != len(data):
            raise DecodeError("numpy payload size does not match its shape and dtype")
        return np.ndarray(shape, dtype, data).copy()  # a copy: writable, as an env's own arrays are
    if len(data) != dtype.itemsize:
        raise DecodeError("numpy scalar payload of the wrong size")
    return np.ndarray((), dtype, data)[()]  # a scalar of its own: it keeps nothing of ``data``


def map_from_wire(obj: dict) -> Any:
    """What a decoded map stands for: a numpy array or scalar, a fraction, or the map itself."""
    if b"nd" in obj:
        return _numpy_from_map(obj)
    if obj.get("__fraction__") is True:
        match = _FRACTION_RE.fullmatch(str(obj.get("as_str", "")))
        if not match or int(match.group(2)) == 0:
            raise DecodeError(f"bad fraction {obj.get('as_str')!r}")
        return Fraction(int(match.group(1)), int(match.group(2)))
    return obj


def _reject_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"msgpack extension type {code} is not accepted")


# msgpack format bytes → (bytes of length prefix, fixed payload bytes) for the variable and
# fixed-size scalar types; containers and fix-types are handled in _prescan.
_SCALAR_SIZES = {
    0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0),  # nil, false, true
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),  # bin 8/16/32
    0xCA: (0, 4), 0xCB: (0, 8),  # float 32/64
    0xCC: (0, 1), 0xCD: (0, 2), 0xCE: (0, 4), 0xCF: (0, 8),  # uint 8..64
    0xD0: (0, 1), 0xD1: (0, 2), 0xD2: (0, 4), 0xD3: (0, 8),  # int 8..64
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),  # str 8/16/32
}  # fmt: skip
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # array 16/32, map 16/32
# Every byte value but the container headers (fixmap, fixarray, array 16/32, map 16/32).
_NOT_CONTAINER_HEADERS = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or b in _CONTAINERS))


def _prescan(data: bytes, max_depth: int) -> None:
    """Walk the message's structure without building it: nesting within ``max_depth``, and no
    container claiming more elements than there are bytes left to hold them. msgpack allocates
    what a header claims before it reads the elements, so this keeps a small hostile message
    from costing a large allocation."""
    size = len(data)
    pos = 0
    remaining = [1]  # elements still expected at each open level; the root holds one value
    while remaining:
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        if pos >= size:
            raise DecodeError("truncated message")
        byte = data[pos]
        pos += 1
        count = -1  # elements of a container; -1 for a scalar
        if byte <= 0x7F or byte >= 0xE0:  # fixint
            continue
        if 0xA0 <= byte <= 0xBF:  # fixstr
            pos += byte & 0x1F
        elif 0x80 <= byte <= 0x8F:  # fixmap
            count = 2 * (byte & 0x0F)
        elif 0x90 <= byte <= 0x9F:  # fixarray
            count = byte & 0x0F
        elif byte in _SCALAR_SIZES:
            prefix, fixed = _SCALAR_SIZES[byte]
            pos += prefix + fixed + (int.from_bytes(data[pos : pos + prefix], "big") if prefix else 0)
        elif byte in _CONTAINERS:
            prefix, per_element = _CONTAINERS[byte]
            count = per_element * int.from_bytes(data[pos : pos + prefix], "big")
            pos += prefix
        else:  # 0xC1 (never used) and every ext type
            raise DecodeError(f"msgpack type 0x{byte:02x} is not accepted")
        if pos > size:
            raise DecodeError("truncated message")
        if count >= 0:
            if len(remaining) > max_depth:
                raise DecodeError(f"message nested deeper than {max_depth} levels")
            if count > size - pos:
                raise DecodeError(f"a container claims {count} elements with {size - pos} bytes left")
            remaining.append(count)
    if pos != size:
        raise DecodeError(f"{size - pos} bytes of trailing data after the message")


def _may_nest_deeper_than(data: bytes, max_depth: int) -> bool:
    """False when ``data`` cannot hold more than ``max_depth`` nested containers: it has no more
    bytes that could be container headers than that (every level of nesting needs a header)."""
    return len(data) > max_depth and len(data.translate(None, _NOT_CONTAINER_HEADERS)) > max_depth


def decode(data: bytes, limits: Limits = COMMAND_LIMITS, maps: Callable[[dict], Any] = map_from_wire) -> Any:
    """Decode one message; any failure is a ``DecodeError`` (never anything else). ``maps``
    turns each decoded map into what it stands for, innermost first (``map_from_wire``'s work,
    and maybe more of its own: ``protocol/legacy/envstate.py``)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    size = len(data)
    if size > limits.max_bytes:
        raise MessageTooLarge(f"message of {size} bytes exceeds the limit of {limits.max_bytes}")
    if limits.prescan:
        data = bytes(data)
        # The walk bounds nesting, and claimed sizes by the bytes left. A message too shallow to
        # break the nesting bound (most requests: a step has three maps) skips it: msgpack bounds
        # each container by the message's size below, and rejects truncated or trailing data and
        # the types the walk refuses (ext types, 0xc1) itself.
        if _may_nest_deeper_than(data, limits.max_depth):
            _prescan(data, limits.max_depth)
    max_container_len = min(limits.max_container_len, size)
    try:
        message = _msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            object_hook=maps,
            ext_hook=_reject_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bytes,
            max_array_len=max_container_len,
            max_map_len=max_container_len,
            max_ext_len=0,
        )
    except DecodeError:
        raise
    except ExtraData as exc:
        raise DecodeError(f"{len(exc.extra)} bytes of trailing data after the message") from None
    except Exception as exc:  # msgpack raises a zoo of types: ValueError, TypeError, StackError, ...
        said = str(exc) or "not msgpack"  # msgpack says nothing of a byte it never uses (0xc1)
        raise DecodeError(f"undecodable message: {type(exc).__name__}: {said}") from exc
    return message


def decode_request(data: bytes, limits: Limits = COMMAND_LIMITS) -> tuple[Any, str]:
    """Decode one request and tell its wire format (``MSGPACK`` or ``PICKLE``): the reply goes
    back in the same. Any failure is a ``DecodeError`` (never anything else)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if safe_pickle.is_pickle(data):
        return safe_pickle.load(bytes(data), limits), PICKLE
    return decode(data, limits), MSGPACK
