"""The registry of competition formats: the one place the core reaches a format through.

A format is a module exposing ``FORMAT`` (a ``base.Format``): its plan of items, its scoring
rules, its competition keys, its report sections and presets. The formats arbiter ships are
folders of this package, listed in ``KNOWN``; they load on first use, so an evaluation imports
only its own format's dependencies (flatland-rl, gymnasium, diambra-arena ...). A format kept
elsewhere joins with ``register_format`` (docs/adding-a-format.md), and ``check_format`` plays
any format against the contract the core relies on.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import Format
from arbiter.server.formats.check import FormatCheckError, check_format

__all__ = [
    "KNOWN",
    "FormatCheckError",
    "check_format",
    "format_names",
    "get_format",
    "presets_dirs",
    "register_format",
]

# name → module of its folder
KNOWN: dict[str, str] = {
    "flatland": "arbiter.server.formats.flatland",
    "two-phase": "arbiter.server.formats.two_phase",
    "diambra": "arbiter.server.formats.diambra",
    "metalc": "arbiter.server.formats.metalc",
}

_loaded: dict[str, Format] = {}
_registered: dict[str, Format] = {}  # formats from outside the package, in the order they joined


def format_names() -> list[str]:
    return [*KNOWN, *_registered]


def register_format(name: str, module_or_format: str | ModuleType | Format) -> Format:
    """Make a format kept outside arbiter known under ``name``: a ``Format``, a module defining
    ``FORMAT``, or such a module's import name. Returns the format; ``name`` must be the one its
    ``Format`` declares (summary.json and competition files name it), and not a shipped format's."""
    found = module_or_format if isinstance(module_or_format, Format) else _format_of(name, module_or_format)
    if found.name != name:
        raise ConfigError(f"format {name!r}: its FORMAT is named {found.name!r}; register it under that name")
    if name in KNOWN:
        raise ConfigError(f"format {name!r} is one of arbiter's own; choose another name")
    _registered[name] = found
    return found


def get_format(name: str) -> Format:
    if name in _registered:
        return _registered[name]
    if name in _loaded:
        return _loaded[name]
    module_name = KNOWN.get(name)
    if module_name is None:
        raise ConfigError(f"unknown format {name!r}; known: {', '.join(format_names())}")
    _loaded[name] = _format_of(name, module_name)
    return _loaded[name]


def _format_of(name: str, module: str | ModuleType) -> Format:
    if isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"format {name!r} cannot be loaded: {exc} (is its extra installed?)") from None
    found = getattr(module, "FORMAT", None)  # a module's FORMAT is how a format folder declares itself
    if not isinstance(found, Format):
        raise ConfigError(f"format {name!r}: {module.__name__} defines no FORMAT (a base.Format)")
    return found


def presets_dirs() -> list[str]:
    """Every format folder's presets/ (a preset names its format inside, so the folder a preset
    sits in needs no import to list it), then the registered formats' own."""
    here = os.path.dirname(__file__)
    found = []
    for module_name in KNOWN.values():
        folder = os.path.join(here, module_name.rsplit(".", 1)[1], "presets")
        if os.path.isdir(folder):
            found.append(folder)
    found += [f.presets_dir for f in _registered.values() if f.presets_dir and os.path.isdir(f.presets_dir)]
    return found
