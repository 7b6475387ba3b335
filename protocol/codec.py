"""The only module that touches the wire format (msgpack).

Compatible with flatland-rl's msgpack_numpy-patched peers: numpy arrays and scalars travel as
maps with bytes keys ``{b'nd', b'type', b'kind', b'shape', b'data'}``, fractions as
``{'__fraction__': True, 'as_str': '(1, 4)'}``. Unlike msgpack_numpy, arrays are rebuilt only for
plain dtypes (bool, int, uint, float, complex): the object-dtype path, which msgpack_numpy hands
to ``pickle.loads``, is rejected. Sizes and nesting are bounded before anything is built.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import msgpack
import numpy as np

from .errors import DecodeError, MessageTooLarge


@dataclass(frozen=True)
class Limits:
    """Bounds checked while decoding, so hostile input costs little to reject."""

    max_bytes: int
    max_depth: int
    max_container_len: int
    max_str_len: int


# A request from an agent: small by nature (the biggest is an action dict of a few hundred agents).
COMMAND_LIMITS = Limits(max_bytes=64 * 1024, max_depth=16, max_container_len=10_000, max_str_len=4096)
# A reply from the evaluator carries the env's state: large, but from the trusted side.
REPLY_LIMITS = Limits(
    max_bytes=256 * 1024 * 1024, max_depth=64, max_container_len=50_000_000, max_str_len=64 * 1024 * 1024
)

_PLAIN_DTYPE_RE = re.compile(r"^[<>|=]?[biufc]\d{1,2}$")
_FRACTION_RE = re.compile(r"^\(\s*(-?\d{1,30})\s*,\s*(-?\d{1,30})\s*\)$")
_MAX_NDIM = 32


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc":
            raise TypeError(f"cannot encode numpy array of dtype {obj.dtype}")
        return {
            b"nd": True,
            b"type": obj.dtype.str,
            b"kind": b"",
            b"shape": list(obj.shape),
            b"data": np.ascontiguousarray(obj).tobytes(),
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
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(message: Any) -> bytes:
    try:
        return msgpack.packb(message, use_bin_type=True, default=_default)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DecodeError(f"cannot encode message: {exc}") from exc


def _numpy_from_map(obj: dict) -> Any:
    dtype_str = obj.get(b"type")
    if isinstance(dtype_str, bytes):
        dtype_str = dtype_str.decode("ascii", "replace")
    if obj.get(b"kind", b"") not in (b"", "") or not isinstance(dtype_str, str) or not _PLAIN_DTYPE_RE.match(dtype_str):
        raise DecodeError(f"numpy payload of unsupported dtype {dtype_str!r} (only plain dtypes are accepted)")
    try:
        dtype = np.dtype(dtype_str)
    except TypeError as exc:
        raise DecodeError(f"bad numpy dtype {dtype_str!r}") from exc
    data = obj.get(b"data")
    if not isinstance(data, bytes):
        raise DecodeError("numpy payload without bytes data")
    if obj[b"nd"] is True:
        shape = obj.get(b"shape")
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) > _MAX_NDIM
            or not all(isinstance(n, int) and 0 <= n for n in shape)
        ):
            raise DecodeError(f"bad numpy shape {shape!r}")
        if math.prod(shape) * dtype.itemsize != len(data):
            raise DecodeError("numpy payload size does not match its shape and dtype")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    if len(data) != dtype.itemsize:
        raise DecodeError("numpy scalar payload of the wrong size")
    return np.frombuffer(data, dtype=dtype)[0]


def _object_hook(obj: dict) -> Any:
    if b"nd" in obj:
        return _numpy_from_map(obj)
    if obj.get("__fraction__") is True:
        match = _FRACTION_RE.match(str(obj.get("as_str", "")))
        if not match or int(match.group(2)) == 0:
            raise DecodeError(f"bad fraction {obj.get('as_str')!r}")
        return Fraction(int(match.group(1)), int(match.group(2)))
    return obj


def _reject_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"msgpack extension type {code} is not accepted")


def _check_depth(message: Any, max_depth: int) -> None:
    stack = [(message, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise DecodeError(f"message nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def decode(data: bytes, limits: Limits = COMMAND_LIMITS) -> Any:
    """Decode one message; any failure is a ``DecodeError`` (never anything else)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_bytes:
        raise MessageTooLarge(f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}")
    try:
        message = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            object_hook=_object_hook,
            ext_hook=_reject_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bytes,
            max_array_len=limits.max_container_len,
            max_map_len=limits.max_container_len,
            max_ext_len=0,
        )
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types: ValueError, TypeError, StackError, ...
        raise DecodeError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    _check_depth(message, limits.max_depth)
    return message
