"""Gymnasium spaces (and an env's registration, its ``spec``) as plain data, so they travel at the
handshake through the one codec.

Supported: Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple of those (nested). A
space travels as a map ``{"type": ..., ...}`` of ints, strings, lists and numpy arrays (which the
codec carries for plain dtypes only); nothing is pickled, and an unknown or malformed map is a
``DecodeError``. gymnasium is imported only to build spaces, never to describe them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arbiter.protocol.errors import DecodeError

_MAX_NESTING = 8
_MAX_MEMBERS = 1024


def space_to_wire(space: Any) -> dict[str, Any]:
    """The plain-data description of a gymnasium space."""
    kind = type(space).__name__
    if kind == "Box":
        low, high = space.low, space.high
        if low.size and np.all(low == low.flat[0]) and np.all(high == high.flat[0]):
            # A uniform Box (an image's 0..255) travels as two numbers and a shape, not as two
            # full arrays: a 480×512×3 frame's bounds would be 1.5 MB of handshake.
            return {"type": "Box", "low": low.flat[0].item(), "high": high.flat[0].item(),
                    "shape": list(space.shape), "dtype": space.dtype.str}  # fmt: skip
        return {"type": "Box", "low": low, "high": high, "dtype": space.dtype.str}
    if kind == "Discrete":
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if kind == "MultiDiscrete":
        return {"type": "MultiDiscrete", "nvec": space.nvec, "start": space.start}
    if kind == "MultiBinary":
        n = space.n
        return {"type": "MultiBinary", "n": [int(x) for x in np.atleast_1d(n)]}
    if kind == "Dict":
        return {"type": "Dict", "spaces": {str(k): space_to_wire(s) for k, s in space.spaces.items()}}
    if kind == "Tuple":
        return {"type": "Tuple", "spaces": [space_to_wire(s) for s in space.spaces]}
    supported = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"
    raise TypeError(f"arbiter cannot send a {kind} space; supported: {supported}")


def _array(data: dict[str, Any], key: str, kind: str) -> np.ndarray:
    value = data.get(key)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kind:
        raise DecodeError(f"space field {key!r} must be a numpy array of kind {kind!r}")
    return value


def _uniform_box(data: dict[str, Any]) -> Any:
    from gymnasium import spaces

    shape, low, high = data["shape"], data.get("low"), data.get("high")
    if not isinstance(shape, list) or len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape):
        raise DecodeError("Box shape must be a list of whole numbers")
    numbers = (int, float)
    if not isinstance(low, numbers) or not isinstance(high, numbers) or isinstance(low, bool) or isinstance(high, bool):
        raise DecodeError("a uniform Box needs numbers low and high")
    return spaces.Box(low=low, high=high, shape=tuple(shape), dtype=np.dtype(str(data.get("dtype"))))


def space_from_wire(data: Any, _depth: int = 0) -> Any:
    """Rebuild a gymnasium space from ``space_to_wire``'s description."""
    from gymnasium import spaces

    if _depth > _MAX_NESTING:
        raise DecodeError(f"space nested deeper than {_MAX_NESTING} levels")
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise DecodeError("a space must be a map with a 'type'")
    kind = data["type"]
    try:
        if kind == "Box" and "shape" in data:
            return _uniform_box(data)
        if kind == "Box":
            low, high = _array(data, "low", "biuf"), _array(data, "high", "biuf")
            dtype = np.dtype(str(data.get("dtype")))
            if low.shape != high.shape:
                raise DecodeError("Box low and high differ in shape")
            return spaces.Box(low=low, high=high, shape=low.shape, dtype=dtype)
        if kind == "Discrete":
            n, start = data.get("n"), data.get("start", 0)
            if type(n) is not int or type(start) is not int or n < 1:
                raise DecodeError("Discrete needs whole numbers n >= 1 and start")
            return spaces.Discrete(n, start=start)
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(_array(data, "nvec", "iu"), start=_array(data, "start", "iu"))
        if kind == "MultiBinary":
            n = data.get("n")
            if not isinstance(n, list) or not n or not all(type(x) is int and x > 0 for x in n):
                raise DecodeError("MultiBinary needs a list of positive whole numbers")
            return spaces.MultiBinary(n[0] if len(n) == 1 else n)
        if kind == "Dict":
            members = data.get("spaces")
            if not isinstance(members, dict) or len(members) > _MAX_MEMBERS:
                raise DecodeError("Dict needs a map of spaces")
            return spaces.Dict({str(k): space_from_wire(v, _depth + 1) for k, v in members.items()})
        if kind == "Tuple":
            members = data.get("spaces")
            if not isinstance(members, list) or len(members) > _MAX_MEMBERS:
                raise DecodeError("Tuple needs a list of spaces")
            return spaces.Tuple([space_from_wire(v, _depth + 1) for v in members])
    except DecodeError:
        raise
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"bad {kind} space: {exc}") from exc
    raise DecodeError(f"unknown space type {kind[:40]!r}")


def data_bytes(space: Any) -> int:
    """The bytes of array data in one element of ``space``: about what an observation of it
    takes on the wire."""
    kind = type(space).__name__
    if kind == "Dict":
        return sum(data_bytes(member) for member in space.spaces.values())
    if kind == "Tuple":
        return sum(data_bytes(member) for member in space.spaces)
    dtype = getattr(space, "dtype", None)
    itemsize = dtype.itemsize if dtype is not None else 8
    return int(np.prod(getattr(space, "shape", None) or (), dtype=np.int64)) * itemsize


def holds_tuple(space: Any) -> bool:
    """Whether an element of ``space`` holds a Tuple anywhere: msgpack brings its tuples back as
    lists, which ``as_element`` turns back."""
    kind = type(space).__name__
    if kind == "Tuple":
        return True
    if kind == "Dict":
        return any(holds_tuple(member) for member in space.spaces.values())
    return False


def as_element(space: Any, value: Any) -> Any:
    """``value`` decoded from the wire, with each Tuple of ``space`` a tuple again, as the env
    made it (an agent may use a Tuple observation as a key); anything else as it came."""
    kind = type(space).__name__
    if kind == "Tuple" and isinstance(value, (list, tuple)) and len(value) == len(space.spaces):
        return tuple(as_element(member, v) for member, v in zip(space.spaces, value, strict=True))
    if kind == "Dict" and isinstance(value, dict):
        return {k: as_element(space.spaces[k], v) if k in space.spaces else v for k, v in value.items()}
    return value


def action_for(space: Any, action: Any) -> Any:
    """The action as the space holds it (numpy scalars and lists made exact), or None when it is
    not an element of the space. Used by the evaluator to refuse actions outside the space."""
    kind = type(space).__name__
    try:
        if kind == "Discrete":
            if type(action) is int:  # what msgpack decodes an integer to: checked without numpy (a step's path)
                start = int(space.start)
                return action if start <= action < start + int(space.n) else None
            if isinstance(action, (bool, np.bool_)):
                return None
            if isinstance(action, np.ndarray) and action.shape == ():
                action = action.item()
            if isinstance(action, (int, np.integer)):
                value = np.int64(action)
                return int(value) if space.contains(value) else None
            return None
        if kind == "MultiDiscrete" and type(action) is list and space.nvec.ndim == 1:
            fast = _multi_discrete_from_ints(space, action)
            if fast is not _NOT_PLAIN:
                return fast
        if kind == "Dict":
            if not isinstance(action, dict) or set(action) != set(space.spaces):
                return None
            members = {k: action_for(space.spaces[k], v) for k, v in action.items()}
            return None if any(v is None for v in members.values()) else members
        if kind == "Tuple":
            if not isinstance(action, (list, tuple)) or len(action) != len(space.spaces):
                return None
            elements = [action_for(s, v) for s, v in zip(space.spaces, action, strict=True)]
            return None if any(v is None for v in elements) else tuple(elements)
        array = np.asarray(action)
        if array.dtype.kind not in "biuf" or array.shape != space.shape:
            return None
        if array.dtype.kind == "f" and space.dtype.kind in "iub" and not np.all(np.mod(array, 1) == 0):
            return None
        with np.errstate(over="ignore", invalid="ignore"):  # an out-of-range value fails below
            cast = array.astype(space.dtype)
        # An integer that does not fit the space's integer dtype wraps around in the cast (257 as
        # int8 is 1): such an action is refused, not read as another.
        if space.dtype.kind in "iub" and not np.array_equal(cast, array):
            return None
        return cast if space.contains(cast) else None
    except (TypeError, ValueError, OverflowError):
        return None


_NOT_PLAIN = object()


def _multi_discrete_from_ints(space: Any, action: list) -> Any:
    """A list of Python ints (what msgpack decodes a DIAMBRA action to) checked without numpy's
    per-call overhead (a step's path: 1.5 µs against 12); ``_NOT_PLAIN`` for anything else, which
    takes the general path."""
    if not all(type(v) is int for v in action):
        return _NOT_PLAIN
    counts = space.nvec.tolist()
    if len(action) != len(counts):
        return None
    starts = space.start.tolist()
    for value, start, count in zip(action, starts, counts, strict=True):
        if not start <= value < start + count:
            return None
    return np.array(action, dtype=space.dtype)


# An EnvSpec's fields that travel: plain values only (its wrappers' specs and a callable entry
# point stay on the evaluator).
SPEC_FIELDS = ("id", "entry_point", "reward_threshold", "nondeterministic", "max_episode_steps",
                "order_enforce", "disable_env_checker", "kwargs", "vector_entry_point")  # fmt: skip


def spec_from_wire(data: Any) -> Any:
    """The ``EnvSpec`` that ``SPEC_FIELDS`` of an env's spec describe (those this gymnasium
    knows), or None."""
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    import dataclasses

    from gymnasium.envs.registration import EnvSpec

    known = {f.name for f in dataclasses.fields(EnvSpec) if f.init}
    try:
        return EnvSpec(**{k: v for k, v in data.items() if k in known and k in SPEC_FIELDS})
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"bad env spec: {exc}") from exc
