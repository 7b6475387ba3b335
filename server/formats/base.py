"""What a competition format supplies to the core, and the small helpers formats share.

The core (evaluation, service, budgets, client gate, results, events, resume, the report's frame)
plays a format's **plan**: an ordered list of items, each an episode or a stage of several
episodes (a training run). It opens one item at a time through the plan and drives the opened
item with the requests it gets:

    ENV_CREATE  → plan.open(item).create_payload()    (or item.next_reset() for a stage that
                                                      spans resets, such as a training run)
    ENV_STEP    → item.sanitize(action) → item.step(clean) → item.step_reply(...)
    item over, timed out, abandoned → item.records(...) → results, then item.close()

The core owns every budget, timeout and ending; an item owns its env and the record fields of its
format. The records an item returns are plain dicts written to ``episodes.jsonl`` and are all a
scoring rule ever sees, so scores recompute offline.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from arbiter.protocol.errors import ConfigError
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.core.budgets import BudgetPolicy


@dataclass(frozen=True)
class Item:
    """One unit of an evaluation's plan."""

    index: int
    key: str  # its identity across restarts: --resume checks the results folder against it
    fields: dict[str, Any] = field(default_factory=dict)  # carried by every record of the item
    budgets: BudgetPolicy | None = None  # this item's budgets, where they differ from the spec's
    # Items of one group depend on the agent's state from the group's first item on (a training
    # run and its evaluation episodes; a MetaLC fold): when that agent is gone (the evaluator
    # restarted mid-group), the whole group is played again from its first item. None: the item
    # stands alone.
    group: str | None = None


class OpenItem(Protocol):
    """An item being played (see the module docstring for the call order)."""

    item: Item
    spans_resets: bool  # True: an ENV_CREATE during the item starts its next episode
    stage_budget_s: float | None  # wall-clock budget of the whole item from its opening, or None

    def create_payload(self) -> dict[str, Any]: ...

    def next_reset(self) -> dict[str, Any]: ...

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """The action to apply and how many invalid entries were dropped; raises
        ``InvalidAction`` to refuse the step (nothing is applied)."""

    def step(self, action: Any) -> bool:
        """Apply one step; True when the item is over."""

    def step_reply(self, invalid: int) -> dict[str, Any]: ...

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class Plan(Protocol):
    """A format's plan for one evaluation (built from the competition spec)."""

    items: list[Item]
    seed: int | None
    source: str | None  # what is evaluated on (a test folder, an env id), for the summary
    csv_columns: list[str]
    server_side: bool  # True: every step is answered with the observation (the env is the server's)
    prepare_ahead: bool  # True: the next item may be opened while the current one runs

    def open(self, item: Item) -> OpenItem: ...

    def unplayed(self, item: Item) -> list[dict[str, Any]]:
        """Records of an item never played (an evaluation that ended early)."""

    def handshake(self) -> dict[str, Any]:
        """Fields the format adds to PONG's extension (spaces, the plan's stages ...)."""

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Fields the format adds to the ENV_SUBMIT reply (flatland's legacy figures)."""

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]: ...

    def progress_text(self, record: dict[str, Any]) -> str | None:
        """One progress line's text for a record (None: not shown, e.g. a training episode that
        is not its run's last; the core puts item-wide figures such as ``wall_s`` on an item's
        last record only)."""

    def table_header(self) -> str: ...

    def table_row(self, record: dict[str, Any]) -> str | None:
        """The record's row of the results table printed at the end (None: left out)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Format:
    """One competition format, as the registry (``formats/__init__.py``) knows it."""

    name: str
    description: str
    rules: dict[str, Callable[[Any], Any]]  # scoring rule name → factory taking the options
    make_plan: Callable[..., Plan]  # (spec, rule, *, tests) → Plan
    options: type | None = None  # frozen dataclass of the format's own competition keys
    report_sections: Callable[[dict[str, Any], list[dict[str, Any]]], str] | None = None
    # The figures at the top of the report (report_charts.HeadlineFigure), from summary.json;
    # None: the score's primary and secondary.
    report_headline: Callable[[dict[str, Any]], list[Any]] | None = None
    presets_dir: str | None = None
    requires_tests: bool = False  # True: the evaluation needs a test folder (--tests)
    clients: str = ""  # how its agents connect, named when a client of another format connects

    @property
    def default_rule(self) -> str:
        return next(iter(self.rules))


# -- helpers shared by formats --------------------------------------------------------------------


def reset_seed(base: int | None, *path: int) -> int | None:
    """The seed of one reset, derived from the competition seed and the reset's place in the
    plan (phase, run, episode ...): independent streams, reproducible, and recorded."""
    if base is None:
        return None
    return int(np.random.SeedSequence([base, *path]).generate_state(1, dtype=np.uint32)[0])


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def plain(value: Any, _depth: int = 0) -> Any:
    """A value made of what the wire carries (maps, lists, scalars, plain numpy), so an env's
    ``info`` never breaks a reply: anything else travels as its ``repr``."""
    if type(value) is dict and not value:  # most envs' info on most steps
        return {}
    if isinstance(value, _PLAIN_SCALARS) or _depth > 16:
        return value if isinstance(value, _PLAIN_SCALARS) else repr(value)
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biufc" else value.tolist()
    if isinstance(value, (np.bool_, np.number)):
        return value.item()
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int)) else str(k): plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, _depth + 1) for v in value]
    return repr(value)


def step_reply(
    last: tuple[Any, float, bool, bool, Any], *, done: bool, step: int, invalid: int, info: Any = None, **ext: Any
) -> dict[str, Any]:
    """An ENV_STEP_RESPONSE body of a server-side format from a Gymnasium step's 5-tuple: the
    step's results, where the item stands (``done``, ``step``), and the format's extension
    fields (``stage_over`` at least). ``info`` replaces the env's info (already plain data)."""
    observation, reward, terminated, truncated, env_info = last
    return {
        "observation": observation,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "info": plain(env_info) if info is None else info,
        "done": done,
        "step": step,
        "invalid_actions": invalid,
        EXTENSION_KEY: ext,
    }


def finite(value: float) -> float | None:
    """JSON has no inf or NaN: such a figure is recorded as null."""
    return value if math.isfinite(value) else None


# -- competition keys of a format, validated like the file -----------------------------------------

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
