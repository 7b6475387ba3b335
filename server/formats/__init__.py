"""The registry of competition formats: the one place the core reaches a format through.

A format is a folder of this package exposing ``FORMAT`` (a ``base.Format``): its plan of items,
its scoring rules, its competition keys, its report sections and presets. To add one, add the
folder and one line to ``KNOWN`` below. Formats load on first use, so an evaluation imports only
its own format's dependencies (flatland-rl, gymnasium, diambra-arena ...).
"""

from __future__ import annotations

import importlib

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import Format

# name → module of its folder
KNOWN: dict[str, str] = {
    "flatland": "arbiter.server.formats.flatland",
    "two-phase": "arbiter.server.formats.two_phase",
    "diambra": "arbiter.server.formats.diambra",
    "metalc": "arbiter.server.formats.metalc",
}

_loaded: dict[str, Format] = {}


def format_names() -> list[str]:
    return list(KNOWN)


def get_format(name: str) -> Format:
    if name in _loaded:
        return _loaded[name]
    module_name = KNOWN.get(name)
    if module_name is None:
        raise ConfigError(f"unknown format {name!r}; known: {', '.join(KNOWN)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"format {name!r} cannot be loaded: {exc} (is its extra installed?)") from None
    found = getattr(module, "FORMAT", None)
    if not isinstance(found, Format):
        raise ConfigError(f"format {name!r}: {module_name} defines no FORMAT")
    _loaded[name] = found
    return found


def presets_dirs() -> list[str]:
    """Every format folder's presets/ (a preset names its format inside, so the folder a preset
    sits in needs no import to list it)."""
    import os

    here = os.path.dirname(__file__)
    found = []
    for module_name in KNOWN.values():
        folder = os.path.join(here, module_name.rsplit(".", 1)[1], "presets")
        if os.path.isdir(folder):
            found.append(folder)
    return found
