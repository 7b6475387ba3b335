"""Object graphs as plain, msgpack-safe data, rebuilt only from an allowlist of classes.

The evaluator sends each episode's env state to arbiter's client so the client needs no copy
of the (possibly hidden) test folder. Flatland's env dict holds tuples, sets, enums, namedtuples
and small objects; this module turns them into tagged maps and back. It is pickle's job done
without pickle's power: decoding calls no constructor and no ``__reduce__`` callable, only a
class's own ``__setstate__`` (flatland's Cython classes define one), and only rebuilds classes
whose module is under an allowed package prefix.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError

TAG = "__t__"
_SCALARS = (type(None), bool, int, float, str, bytes, Fraction, np.ndarray, np.generic)
_LEAVES = frozenset((type(None), bool, int, float, str, bytes))  # what msgpack decodes a scalar to


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def to_plain(obj: Any) -> Any:
    """Encode an object graph into maps/lists/scalars the codec can carry."""
    if isinstance(obj, enum.Enum):
        return {TAG: "enum", "cls": _class_path(type(obj)), "v": to_plain(obj.value)}
    if type(obj) in _SCALARS or isinstance(obj, (np.ndarray, np.generic)):
        return obj
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        if hasattr(obj, "_fields"):
            return {TAG: "nt", "cls": _class_path(type(obj)), "v": [to_plain(v) for v in obj]}
        return {TAG: "tuple", "v": [to_plain(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {TAG: type(obj).__name__, "v": [to_plain(v) for v in obj]}
    if isinstance(obj, dict):
        return {TAG: "dict", "v": [[to_plain(k), to_plain(v)] for k, v in obj.items()]}
    state = _attributes(obj)
    if state is not None:
        return {TAG: "obj", "cls": _class_path(type(obj)), "v": to_plain(state)}
    raise TypeError(f"cannot carry {type(obj).__module__}.{type(obj).__qualname__} as env state")


def _own_method(cls: type, name: str) -> bool:
    return getattr(cls, name, None) is not getattr(object, name, None)


def _attributes(obj: Any) -> Any:
    """An object's state: its own ``__getstate__`` (Cython classes), else __dict__/__slots__."""
    if _own_method(type(obj), "__getstate__") and _own_method(type(obj), "__setstate__"):
        return obj.__getstate__()
    slots = [
        name
        for cls in type(obj).__mro__
        for name in getattr(cls, "__slots__", ())
        if name not in ("__dict__", "__weakref__") and hasattr(obj, name)
    ]
    if not slots and not hasattr(obj, "__dict__"):
        return None
    state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    state.update((name, getattr(obj, name)) for name in slots)
    return state


class Rebuilder:
    """Decodes ``to_plain`` output, rebuilding only classes defined in ``allowed_packages``.

    A package name allows that module and everything below it (``"flatland"`` allows
    ``flatland.envs.agent_utils`` but not ``flatlandish``). The check is made on the class found,
    not only on the path given, so ``allowed.module:os.system``-style paths are refused.
    """

    def __init__(self, allowed_packages: Iterable[str]):
        self.allowed_packages = tuple(allowed_packages)
        self._classes: dict[str, type] = {}
        # An obj map's class and whether it has its own __setstate__ (Any: a class known only as
        # a type has no __new__ that mypy lets be called on itself).
        self._object_classes: dict[str, tuple[Any, bool]] = {}

    def _allowed(self, module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in self.allowed_packages)

    def _cls(self, path: object) -> type:
        if not isinstance(path, str) or path not in self._classes:
            if not isinstance(path, str) or ":" not in path:
                raise DecodeError(f"bad class reference {path!r} in env state")
            module, _, qualname = path.partition(":")
            if not self._allowed(module):
                raise DecodeError(f"class {path} is not allowed in env state")
            try:
                found: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    found = getattr(found, part)
            except (ImportError, AttributeError) as exc:
                raise DecodeError(f"unknown class {path} in env state") from exc
            if not isinstance(found, type) or not self._allowed(getattr(found, "__module__", "") or ""):
                raise DecodeError(f"{path} is not a class of an allowed package")
            self._classes[path] = found
        return self._classes[path]

    def rebuild(self, data: Any) -> Any:
        """``to_plain`` output already decoded, rebuilt. Any malformed input is a ``DecodeError``,
        whatever the step that trips over it."""
        try:
            return self._rebuild(data)
        except DecodeError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
            raise DecodeError(f"malformed env state: {type(exc).__name__}: {exc}") from exc

    def map_from_wire(self, data: dict) -> Any:
        """What ``codec.decode`` makes of each map as it decodes (its ``maps``): the env state is
        rebuilt while the message is read, with no second walk over it. msgpack hands maps over
        innermost first, so a tagged map's contents are rebuilt already. An untagged map is
        ``codec.map_from_wire``'s: an array, a fraction, or a map of the message around the env
        state (a reply's own fields), which goes through as it is."""
        tag = data.get(TAG)
        if tag is None:
            return codec.map_from_wire(data)
        return self._tagged(tag, data.get("v"), data)

    def _rebuild(self, data: Any) -> Any:
        # The walk over decoded data: each map's contents first, then the map, as when decoding.
        if isinstance(data, list):
            return self._list(data)
        if not isinstance(data, dict):
            return data
        tag = data.get(TAG)
        values = data.get("v")
        return self._tagged(tag, values if type(values) in _LEAVES else self._rebuild(values), data)

    def _tagged(self, tag: Any, values: Any, data: dict) -> Any:
        """The object a tagged map stands for, ``values`` (its ``"v"``) rebuilt already. The
        tags go by how often an env state holds them."""
        if tag == "tuple":
            return tuple(values if type(values) is list else self._items(values))
        if tag == "dict":
            return self._dict(values)
        if tag == "obj":
            cls, restores_itself = self._object_class(data.get("cls"))
            instance = cls.__new__(cls)
            if restores_itself:
                instance.__setstate__(values)
                return instance
            if not isinstance(values, dict):
                raise DecodeError(f"bad state for {data.get('cls')}")
            for name, value in values.items():
                if not isinstance(name, str) or name.startswith("__"):
                    raise DecodeError(f"bad attribute name {name!r} in state of {data.get('cls')}")
                object.__setattr__(instance, name, value)
            return instance
        if tag == "enum":
            cls = self._cls(data.get("cls"))
            if not issubclass(cls, enum.Enum):
                raise DecodeError(f"{data.get('cls')} is not an enum")
            return cls(values)  # an enum lookup by value, not a constructor call
        if tag == "nt":
            cls = self._cls(data.get("cls"))
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise DecodeError(f"{data.get('cls')} is not a namedtuple")
            return cls._make(self._items(values))  # type: ignore[attr-defined]  # a namedtuple
        if tag in ("set", "frozenset"):
            items = (self._hashable(v) for v in self._items(values))
            return set(items) if tag == "set" else frozenset(items)
        raise DecodeError(f"unknown env state tag {tag!r}")

    def _object_class(self, path: object) -> tuple[Any, bool]:
        """The class an ``obj`` map names, and whether it restores itself from its state with a
        ``__setstate__`` of its own (flatland's Cython classes) or gets its attributes set."""
        try:
            return self._object_classes[path]  # type: ignore[index]  # a path from the wire
        except (KeyError, TypeError):  # not seen yet, or unhashable: _cls says what is wrong
            cls = self._cls(path)
            if issubclass(cls, (enum.Enum, tuple, type)):
                raise DecodeError(f"{path} cannot be rebuilt from attributes") from None
            self._object_classes[path] = found = (cls, _own_method(cls, "__setstate__"))  # type: ignore[index]
            return found

    def _list(self, values: list) -> list:
        # Most of an env state's values are numbers and text, which are already what they are:
        # kept as they come, without a call each.
        return [v if type(v) in _LEAVES else self._rebuild(v) for v in values]

    @staticmethod
    def _items(values: Any) -> list:
        if not isinstance(values, list):
            raise DecodeError("malformed env state: a tagged container without a list of values")
        return values

    def _dict(self, values: Any) -> dict:
        rebuilt = {}
        for pair in self._items(values):
            if type(pair) is not list or len(pair) != 2:
                raise DecodeError("malformed env state: a dict entry that is not a [key, value] pair")
            key, value = pair
            rebuilt[key if type(key) in _LEAVES else self._hashable(key)] = value
        return rebuilt

    @staticmethod
    def _hashable(value: Any) -> Any:
        try:
            hash(value)
        except TypeError as exc:
            raise DecodeError(f"unhashable key {type(value).__name__} in env state") from exc
        return value
