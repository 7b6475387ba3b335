"""A format's own competition keys (its options dataclass), read from the competition file's
table and checked like the file: unknown keys, wrong types and nested tables here, values by the
dataclass's own ``__post_init__``."""

from __future__ import annotations

import dataclasses
from typing import Any

from arbiter.protocol.errors import ConfigError

_SCALAR_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def options_from_dict(cls: type, data: dict[str, Any], source: str, prefix: str = "") -> Any:
    """Build a format's options dataclass from a TOML table: unknown keys, wrong types and nested
    tables are checked here; values are checked by the dataclass's own ``__post_init__``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'the format options'} must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        names = sorted(prefix + k for k in unknown)
        raise ConfigError(f"{source}: unknown keys {names}; allowed here: {sorted(prefix + k for k in fields)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        kind = fields[name].type if isinstance(fields[name].type, str) else getattr(fields[name].type, "__name__", "")
        nested = _nested_options(cls, name)
        if nested is not None:
            values[name] = options_from_dict(nested, value, source, prefix=f"{prefix}{name}.")
            continue
        values[name] = _checked(value, kind, f"{prefix}{name}", source)
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _nested_options(cls: type, name: str) -> type | None:
    default = next(f for f in dataclasses.fields(cls) if f.name == name)
    if default.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        made = default.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(made):
            return type(made)
    return None


def _checked(value: Any, kind: str, name: str, source: str) -> Any:
    """The annotation's scalar type, as TOML gives it (an int is a fine float)."""
    wanted = [t.strip() for t in kind.replace("Optional[", "").rstrip("]").split("|")]
    if value is None and "None" in wanted:
        return None
    for type_name in wanted:
        if type_name == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if type_name == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if type_name in ("str", "bool") and type(value) is _SCALAR_TYPES[type_name]:
            return value
        if type_name.startswith(("dict", "list", "tuple")) and isinstance(value, (dict, list, tuple)):
            return value
    raise ConfigError(f"{source}: {name} must be {' or '.join(wanted)}, got {value!r}")
