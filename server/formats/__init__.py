"""The registry of competition formats: the one place the core reaches a format through.

A format is a module exposing ``FORMAT`` (a ``base.Format``): its plan of items, its scoring
rules, its competition keys, its report sections and presets. The formats arbiter ships are
folders of this package, listed in ``KNOWN``; they load on first use, so an evaluation imports
only its own format's dependencies (flatland-rl, gymnasium, diambra-arena ...). A format kept
elsewhere joins by an entry point of its installed package in the ``arbiter.formats`` group
(every ``arbiter`` command then knows it), or with ``register_format`` in a program of its own
(docs/adding-a-format.md); ``check_format`` plays any format against the contract the core
relies on.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from types import ModuleType

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import Format
from arbiter.server.formats.check import FormatCheckError, check_format

__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN",
    "FormatCheckError",
    "check_format",
    "format_names",
    "get_format",
    "installed_formats",
    "presets_dirs",
    "register_format",
    "unknown_format",
]

# name → module of its folder
KNOWN: dict[str, str] = {
    "flatland": "arbiter.server.formats.flatland",
    "two-phase": "arbiter.server.formats.two_phase",
    "diambra": "arbiter.server.formats.diambra",
    "metalc": "arbiter.server.formats.metalc",
}

# The entry point group an installed package declares its formats in: NAME = "module" (a module
# defining FORMAT) or NAME = "module:FORMAT".
ENTRY_POINT_GROUP = "arbiter.formats"
JOINING = (
    f"a format kept outside arbiter joins by an {ENTRY_POINT_GROUP!r} entry point of its installed package, "
    "or with register_format"
)

log = logging.getLogger(__name__)

_loaded: dict[str, Format] = {}
_registered: dict[str, Format] = {}  # formats from outside the package, in the order they joined
_installed: dict[str, importlib.metadata.EntryPoint] | None = None  # read once, on first need


def installed_formats() -> dict[str, importlib.metadata.EntryPoint]:
    """The formats installed packages declare (entry points of ``ENTRY_POINT_GROUP``), by name;
    one named like a shipped format is left out, and said."""
    global _installed
    if _installed is None:
        found: dict[str, importlib.metadata.EntryPoint] = {}
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in KNOWN:
                log.warning("format %r (entry point %s) has a name of arbiter's own: left out", entry.name, entry.value)
            else:
                found.setdefault(entry.name, entry)
        _installed = found
    return _installed


def format_names() -> list[str]:
    return [*KNOWN, *_registered, *(name for name in installed_formats() if name not in _registered)]


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
    if module_name is not None:
        _loaded[name] = _format_of(name, module_name)
    elif name in installed_formats():
        _loaded[name] = _installed_format(name, installed_formats()[name])
    else:
        raise ConfigError(unknown_format(name))
    return _loaded[name]


def unknown_format(name: object) -> str:
    """What a name no format has is told, wherever it is found: the formats known, and how a
    format kept outside arbiter joins them."""
    return f"unknown format {name!r}; known: {', '.join(format_names())} ({JOINING})"


def _installed_format(name: str, entry: importlib.metadata.EntryPoint) -> Format:
    where = f"entry point {name} = {entry.value!r} ({ENTRY_POINT_GROUP})"
    try:
        loaded = entry.load()
    except Exception as exc:  # whatever its import raises: said with the entry point to look at
        raise ConfigError(f"format {name!r} cannot be loaded from {where}: {type(exc).__name__}: {exc}") from None
    found = loaded if isinstance(loaded, Format) else getattr(loaded, "FORMAT", None)
    if not isinstance(found, Format):
        raise ConfigError(f"format {name!r}: {where} names neither a Format nor a module defining FORMAT")
    if found.name != name:
        raise ConfigError(f"format {name!r}: {where} gives a Format named {found.name!r}; name the entry point that")
    return found


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
    others = list(_registered.values())
    for name in installed_formats():
        if name in _registered:
            continue
        try:
            others.append(get_format(name))
        except ConfigError as exc:  # a broken package's format: its presets are missing, nothing else
            log.warning("%s", exc)
    found += [f.presets_dir for f in others if f.presets_dir and os.path.isdir(f.presets_dir)]
    return found
