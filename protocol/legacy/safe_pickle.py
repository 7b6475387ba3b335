"""Pickled requests from flatland's legacy client, decoded without pickle's power.

``FlatlandRemoteClient(use_pickle=True)`` pickles its whole request map and unpickles the replies
and errors-list entries it gets back. A pickle is a program, so a pickled request is loaded in
three stages, each of which can only refuse:

1. ``scan`` (pickle_scan.py) walks the opcodes without running any: protocols 2 to 5 only, and only the opcodes a
   Python pickler writes for plain data and numpy arrays. Extension codes (which can reach an
   object cached by an earlier, unrestricted load), persistent ids, INST/OBJ/NEWOBJ, sets,
   out-of-band buffers and the text opcodes of protocols 0 and 1 are refused, every declared
   length must fit in the bytes left, and every memo index in the pickle's size (the unpickler
   allocates the memo up to the largest index it is given).
2. ``_Unpickler.find_class`` looks a global's (module, name) up in ``_GLOBALS`` before anything is
   imported or looked up. Each entry is an inert constructor of this module that checks its
   arguments and builds plain data or a placeholder: no numpy, fractions or flatland code ever
   runs on wire data, so numpy's own ``__setstate__`` never sees hostile state.
3. ``_Rebuild`` copies the loaded value within the bounds a msgpack request has (nesting,
   container and string lengths, and, since a pickle can reference one object many times, the
   size of the message spelt out), turning placeholders into numpy arrays and scalars of plain
   dtypes and fractions. Any other object is refused.

flatland's enums (``RailEnvActions`` ...) decode to their int values: an action sent as
``RailEnvActions.MOVE_FORWARD`` counts as 2.
"""

from __future__ import annotations

import enum
import io
import math
import pickle
import re
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
from flatland.core.grid.grid4 import Grid4TransitionsEnum
from flatland.envs.rail_env_action import RailEnvActions
from flatland.envs.step_utils.states import TrainState

from arbiter.protocol.errors import DecodeError, MessageTooLarge
from arbiter.protocol.legacy.pickle_scan import _OP, is_pickle, scan  # noqa: F401 - stage 1, used here and by the codec

if TYPE_CHECKING:
    from arbiter.protocol.codec import Limits

_PLAIN_DTYPE_RE = re.compile(r"[biufc]\d{1,2}")
_BYTE_ORDERS = ("<", ">", "|", "=")
_MAX_NDIM = 32
_MAX_INT = 2**64  # the ints a msgpack message can carry: -2**63 <= n < 2**64
_MIN_INT = -(2**63)
_MAX_FRACTION_TERM = 10**300  # as codec's fraction maps
_FRACTION_RE = re.compile(r"(-?\d{1,300})(?:/(\d{1,300}))?")

# --- stage 2: the globals a request may name, as inert constructors -----------------------------


class _Inert:
    """Base of every object a global resolves to. BUILD is refused: the unpickler calls
    ``__setstate__`` when there is one, and then writes no attribute itself."""

    __slots__ = ()
    label = "object"

    def __setstate__(self, state: Any) -> None:
        raise DecodeError(f"pickled BUILD on {self.label} is not accepted")


class _Constructor(_Inert):
    """A global a request may name: callable (REDUCE), never a type (so NEWOBJ refuses it)."""

    __slots__ = ("label", "_build")

    def __init__(self, label: str, build: Callable[..., Any]):
        self.label = label
        self._build = build

    def __call__(self, *args: Any) -> Any:
        return self._build(*args)


class _Marker(_Inert):
    """A global that is only ever an argument (``numpy.ndarray`` for ``_reconstruct``)."""

    __slots__ = ("label",)

    def __init__(self, label: str):
        self.label = label


class _Dtype(_Inert):
    """``numpy.dtype(spec, align, copy)`` then BUILD with its byte order."""

    __slots__ = ("spec", "order")
    label = "numpy dtype"

    def __init__(self, spec: str):
        self.spec = spec
        self.order: str | None = None

    def __setstate__(self, state: Any) -> None:
        # numpy writes (3, byte order, None, None, None, -1, -1, 0) for every plain dtype.
        if (
            self.order is not None
            or type(state) is not tuple
            or len(state) != 8
            or not all(type(x) is int for x in (state[0], *state[5:]))
            or state[0] != 3
            or state[5:] != (-1, -1, 0)
            or state[1] not in _BYTE_ORDERS
            or not all(x is None for x in state[2:5])
        ):
            raise DecodeError("a pickled numpy dtype with unsupported state (only plain dtypes are accepted)")
        self.order = state[1]

    def resolve(self) -> np.dtype:
        if self.order is None:
            raise DecodeError("a pickled numpy dtype without its byte order")
        dtype = np.dtype(self.order + self.spec)
        if dtype.kind not in "biufc":
            raise DecodeError(f"numpy dtype {dtype.str!r} is not accepted (only plain dtypes are)")
        return dtype


class _Array(_Inert):
    """``_reconstruct(ndarray, (0,), b'b')`` then BUILD with (1, shape, dtype, fortran, data),
    or ``_frombuffer(data, dtype, shape, order)`` (protocol 5)."""

    __slots__ = ("shape", "dtype", "fortran", "data")
    label = "numpy array"

    def __init__(self) -> None:
        self.data: bytes | None = None

    def __setstate__(self, state: Any) -> None:
        if type(state) is not tuple or len(state) != 5 or type(state[0]) is not int or state[0] != 1:
            raise DecodeError("a pickled numpy array with unsupported state")
        self.set(state[1], state[2], state[3], state[4])

    def set(self, shape: Any, dtype: Any, fortran: Any, data: Any) -> None:
        if self.data is not None:
            raise DecodeError("a pickled numpy array built twice")
        if type(shape) is not tuple or len(shape) > _MAX_NDIM or not all(type(n) is int and n >= 0 for n in shape):
            raise DecodeError("a pickled numpy array with a bad shape")
        if type(dtype) is not _Dtype or type(fortran) is not bool or type(data) not in (bytes, bytearray):
            raise DecodeError("a pickled numpy array of unsupported dtype or data (only plain dtypes are accepted)")
        self.shape, self.dtype, self.fortran, self.data = shape, dtype, fortran, bytes(data)

    def resolve(self, rebuild: _Rebuild) -> np.ndarray:
        if self.data is None:
            raise DecodeError("a pickled numpy array without its data")
        dtype = self.dtype.resolve()
        if math.prod(self.shape) * dtype.itemsize != len(self.data):
            raise DecodeError("pickled numpy data does not match its shape and dtype")
        rebuild.charge(len(self.data))
        flat = np.frombuffer(self.data, dtype=dtype)
        return flat.reshape(self.shape, order="F" if self.fortran else "C").copy()


class _Scalar(_Inert):
    __slots__ = ("dtype", "data")
    label = "numpy scalar"

    def __init__(self, dtype: _Dtype, data: bytes):
        self.dtype, self.data = dtype, data

    def resolve(self, rebuild: _Rebuild) -> np.generic:
        dtype = self.dtype.resolve()
        if len(self.data) != dtype.itemsize:
            raise DecodeError("a pickled numpy scalar of the wrong size")
        return np.frombuffer(self.data, dtype=dtype)[0]


class _Fraction(_Inert):
    __slots__ = ("numerator", "denominator")
    label = "fraction"

    def __init__(self, numerator: int, denominator: int):
        self.numerator, self.denominator = numerator, denominator


def _args_error(what: str) -> DecodeError:
    return DecodeError(f"a pickled {what} with unsupported arguments")


def _reconstruct(*args: Any) -> _Array:
    if len(args) != 3 or args[0] is not _NDARRAY or type(args[1]) is not tuple or type(args[2]) is not bytes:
        raise _args_error("numpy array")
    if args[1] != (0,) or args[2] != b"b":
        raise _args_error("numpy array")
    return _Array()


def _frombuffer(*args: Any) -> _Array:
    if len(args) != 4 or type(args[3]) is not str or args[3] not in ("C", "F"):
        raise _args_error("numpy array")
    array = _Array()
    array.set(args[2], args[1], args[3] == "F", args[0])
    return array


def _dtype(*args: Any) -> _Dtype:
    if len(args) != 3 or type(args[0]) is not str or type(args[1]) is not bool or type(args[2]) is not bool:
        raise _args_error("numpy dtype")
    if not _PLAIN_DTYPE_RE.fullmatch(args[0]):
        raise DecodeError(f"numpy dtype {args[0][:40]!r} is not accepted (only plain dtypes are)")
    return _Dtype(args[0])


def _scalar(*args: Any) -> _Scalar:
    if len(args) != 2 or type(args[0]) is not _Dtype or type(args[1]) is not bytes:
        raise _args_error("numpy scalar")
    return _Scalar(args[0], args[1])


def _latin1_bytes(*args: Any) -> bytes:
    """``_codecs.encode(text, 'latin1')``: how protocol 2 writes a non-empty bytes object."""
    if len(args) != 2 or type(args[0]) is not str or type(args[1]) is not str or args[1] not in ("latin1", "latin-1"):
        raise _args_error("bytes object")
    try:
        return args[0].encode("latin-1")
    except UnicodeEncodeError:
        raise _args_error("bytes object") from None


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``: how protocol 2 writes an empty bytes object."""
    if args:
        raise _args_error("bytes object")
    return b""


def _fraction(*args: Any) -> _Fraction:
    if len(args) == 1 and type(args[0]) is str and (match := _FRACTION_RE.fullmatch(args[0])):
        args = (int(match.group(1)), int(match.group(2) or 1))
    if len(args) != 2 or not all(type(x) is int and abs(x) < _MAX_FRACTION_TERM for x in args) or args[1] == 0:
        raise _args_error("fraction")
    return _Fraction(args[0], args[1])


def _enum_member(enum_class: type[enum.Enum]) -> Callable[..., int]:
    values = frozenset(member.value for member in enum_class)

    def build(*args: Any) -> int:
        if len(args) != 1 or type(args[0]) is not int or args[0] not in values:
            raise _args_error(enum_class.__name__)
        return args[0]

    return build


_NDARRAY = _Marker("numpy.ndarray")
_GLOBALS: dict[tuple[str, str], _Inert] = {("numpy", "ndarray"): _NDARRAY}
# numpy 1.x and 2.x name the module of their pickling functions differently.
for _core in ("numpy.core", "numpy._core"):
    _GLOBALS[(f"{_core}.multiarray", "_reconstruct")] = _Constructor("numpy array", _reconstruct)
    _GLOBALS[(f"{_core}.multiarray", "scalar")] = _Constructor("numpy scalar", _scalar)
    _GLOBALS[(f"{_core}.numeric", "_frombuffer")] = _Constructor("numpy array", _frombuffer)
_GLOBALS[("numpy", "dtype")] = _Constructor("numpy dtype", _dtype)
_GLOBALS[("_codecs", "encode")] = _Constructor("bytes object", _latin1_bytes)
for _builtins in ("builtins", "__builtin__"):
    _GLOBALS[(_builtins, "bytes")] = _Constructor("bytes object", _empty_bytes)
_GLOBALS[("fractions", "Fraction")] = _Constructor("fraction", _fraction)
# RailEnvActions lived in flatland.envs.rail_env before flatland-rl 4.
for _module, _enum in (
    ("flatland.envs.rail_env_action", RailEnvActions),
    ("flatland.envs.rail_env", RailEnvActions),
    ("flatland.core.grid.grid4", Grid4TransitionsEnum),
    ("flatland.envs.step_utils.states", TrainState),
):
    _GLOBALS[(_module, _enum.__name__)] = _Constructor(_enum.__name__, _enum_member(_enum))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise DecodeError(f"pickled global {str(module)[:80]}.{str(name)[:80]} is not accepted")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise DecodeError("pickled persistent ids are not accepted")


# --- stage 3: the copy within a request's bounds --------------------------------------------------


class _Rebuild:
    def __init__(self, limits: Limits):
        self.limits = limits
        # A msgpack request spends at least a byte per value and per byte of its strings: the same
        # budgets, counted on the value spelt out, bound what a pickle's shared references can build.
        self.nodes_left = limits.max_bytes
        self.bytes_left = limits.max_bytes

    def charge(self, size: int) -> None:
        self.bytes_left -= size
        if self.bytes_left < 0:
            raise DecodeError(f"pickled message larger than {self.limits.max_bytes} bytes once spelt out")

    def value(self, obj: Any, depth: int) -> Any:
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise DecodeError(f"pickled message of more than {self.limits.max_bytes} values once spelt out")
        kind = type(obj)
        if obj is None or kind is bool or kind is float:
            return obj
        if kind is int:
            if not _MIN_INT <= obj < _MAX_INT:
                raise DecodeError("a pickled int out of the 64-bit range")
            return obj
        if kind is str or kind is bytes:
            if len(obj) > (self.limits.max_str_len if kind is str else self.limits.max_bytes):
                raise DecodeError(f"a pickled {kind.__name__} of {len(obj)} characters is too long")
            self.charge(len(obj))
            return obj
        if kind is list or kind is tuple or kind is dict:
            if depth >= self.limits.max_depth:
                raise DecodeError(f"pickled message nested deeper than {self.limits.max_depth} levels")
            if len(obj) > self.limits.max_container_len:
                raise DecodeError(f"a pickled {kind.__name__} of {len(obj)} elements is too long")
            if kind is dict:
                return {self.value(k, depth + 1): self.value(v, depth + 1) for k, v in obj.items()}
            items = [self.value(x, depth + 1) for x in obj]
            return items if kind is list else tuple(items)
        if kind is _Array or kind is _Scalar:
            return obj.resolve(self)
        if kind is _Fraction:
            return Fraction(obj.numerator, obj.denominator)
        label = obj.label if isinstance(obj, _Inert) else kind.__name__
        raise DecodeError(f"a pickled {label} is not accepted here")


def load(data: bytes, limits: Limits) -> Any:
    """Decode one pickled request; any failure is a ``DecodeError`` (never anything else)."""
    if len(data) > limits.max_bytes:
        raise MessageTooLarge(f"message of {len(data)} bytes exceeds the limit of {limits.max_bytes}")
    scan(data)
    try:
        loaded = _Unpickler(io.BytesIO(data)).load()
        return _Rebuild(limits).value(loaded, 0)
    except DecodeError:
        raise
    except Exception as exc:  # the unpickler's own refusals, unhashable keys, ...
        raise DecodeError(f"undecodable pickle: {type(exc).__name__}: {str(exc)[:200]}") from None
