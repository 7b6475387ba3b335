"""The large arrays of an observation: those an observation space declares (``large_arrays``),
each named by its path (the keys of Dict spaces and indices of Tuple spaces on the way to it),
and an observation's members reached and replaced by such a path. Shared frames
(protocol/shared_frames.py) move these arrays out of the replies that carry them."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

LARGE_ARRAY_BYTES = 16 * 1024  # smaller arrays travel inline (a 128×128 frame is 16 KiB: shared)
SHAREABLE_KINDS = "biufc"  # numbers and booleans: what a placeholder's dtype may name


class LargeArray(NamedTuple):
    """One array of ``LARGE_ARRAY_BYTES`` or more that an observation space declares: where it
    sits in an observation (the keys of Dict spaces and indices of Tuple spaces on the way to
    it) and what it holds."""

    path: tuple[Any, ...]
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def large_arrays(space: Any, path: tuple[Any, ...] = ()) -> list[LargeArray]:
    """The large arrays of one observation of ``space``, in the order of its members."""
    kind = type(space).__name__
    if kind == "Dict":
        return [array for key, member in space.spaces.items() for array in large_arrays(member, (*path, key))]
    if kind == "Tuple":
        return [array for index, member in enumerate(space.spaces) for array in large_arrays(member, (*path, index))]
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if not shape or dtype is None or np.dtype(dtype).kind not in SHAREABLE_KINDS:
        return []
    array = LargeArray(path, np.dtype(dtype), tuple(shape))
    return [array] if array.nbytes >= LARGE_ARRAY_BYTES else []


def member_at(value: Any, path: tuple[Any, ...]) -> Any:
    """The member of ``value`` at ``path``; None when there is none."""
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def replaced_at(container: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``container`` with the member at ``path`` replaced by ``value``: the containers on the way
    are copied (dicts as dicts, lists and tuples as lists), the env's own are left as they are."""
    if not path:
        return value
    copy = dict(container) if isinstance(container, dict) else list(container)
    copy[path[0]] = replaced_at(container[path[0]], path[1:], value)
    return copy
