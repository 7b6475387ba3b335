"""Competition specs: a small TOML file naming the format, its data, budgets, scoring and options.

Presets ship in each format's folder (``formats/<name>/presets/``: ``flatland-neurips2020``,
``flatland-debug``, ``flatland3``, ``two-phase-cartpole`` ...); a path to a .toml file works too.
The core keys are this module's; every other top-level key or table belongs to the format and is
checked by the format's options class. ``--set KEY=VALUE`` overrides any key (dotted for tables,
``phase2.max_steps=20000``; VALUE is read as TOML, else as a string) and is validated exactly
like the file: unknown keys and impossible settings are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError

from .budgets import BudgetPolicy
from .formats import format_names, get_format, presets_dirs
from .formats.base import options_from_dict

DEFAULT_COMPETITION = "flatland-neurips2020"
DEBUG_COMPETITION = "flatland-debug"
DEBUG_EPISODES = 28
DEBUG_OVERALL_S = 48 * 60.0


@dataclass(frozen=True)
class CompetitionSpec:
    name: str
    format: str = "flatland"
    scoring: str | None = None  # None: the format's first rule
    tests: str | None = None
    seed: int | None = 1001
    debug: bool = False
    max_episodes: int | None = None
    record_episodes: int = 0  # keep the actions of the first N episodes for `arbiter replay`
    # Pickled requests from FlatlandRemoteClient(use_pickle=True), through a restricted unpickler.
    accept_pickle: bool = True
    budgets: BudgetPolicy = field(default_factory=BudgetPolicy)
    options: Any = None  # the format's own keys (its options dataclass), None for a format with none

    def __post_init__(self) -> None:
        if self.format not in format_names():
            raise ConfigError(f"{self.name}: unknown format {self.format!r}; known: {', '.join(format_names())}")
        rules = get_format(self.format).rules
        if self.scoring is None:
            object.__setattr__(self, "scoring", next(iter(rules)))
        elif self.scoring not in rules:
            raise ConfigError(
                f"{self.name}: unknown scoring rule {self.scoring!r} for format {self.format!r}; "
                f"known: {', '.join(rules)}"
            )
        if self.max_episodes is not None and (not isinstance(self.max_episodes, int) or self.max_episodes < 1):
            raise ConfigError(f"{self.name}: max_episodes must be a whole number >= 1")
        record = self.record_episodes
        if isinstance(record, bool) or not isinstance(record, int) or record < 0:
            raise ConfigError(f"{self.name}: record_episodes must be a whole number >= 0")
        if record and self.format != "flatland":
            raise ConfigError(f"{self.name}: record_episodes (replays) exists for the flatland format only")
        if not isinstance(self.accept_pickle, bool):
            raise ConfigError(f"{self.name}: accept_pickle must be true or false")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"{self.name}: seed must be a whole number")

    def with_debug(self) -> CompetitionSpec:
        """Debug mode: the first 28 episodes, an overall limit of 48 minutes."""
        episodes = min(self.max_episodes or DEBUG_EPISODES, DEBUG_EPISODES)
        overall = min(self.budgets.overall_s, DEBUG_OVERALL_S)
        budgets = dataclasses.replace(self.budgets, overall_s=overall)
        return dataclasses.replace(self, debug=True, max_episodes=episodes, budgets=budgets)

    def with_budgets(self, **overrides: Any) -> CompetitionSpec:
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, budgets=dataclasses.replace(self.budgets, **given)) if given else self

    def options_dict(self) -> dict[str, Any] | None:
        return dataclasses.asdict(self.options) if dataclasses.is_dataclass(self.options) else None

    def as_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["options"] = self.options_dict()
        return found


_CORE_KEYS = {f.name for f in dataclasses.fields(CompetitionSpec)} - {"name", "options"}
_BUDGET_KEYS = {f.name for f in dataclasses.fields(BudgetPolicy)}


def preset_paths() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in presets_dirs():
        for entry in sorted(os.listdir(folder)):
            if entry.endswith(".toml"):
                found[os.path.splitext(entry)[0]] = os.path.join(folder, entry)
    return found


def preset_names() -> list[str]:
    return sorted(preset_paths())


def load_competition(name_or_path: str = DEFAULT_COMPETITION, overrides: list[str] | None = None) -> CompetitionSpec:
    if os.path.isfile(name_or_path):
        path, name = name_or_path, os.path.splitext(os.path.basename(name_or_path))[0]
    else:
        path, name = preset_paths().get(name_or_path, ""), name_or_path
        if not path:
            raise ConfigError(
                f"unknown competition {name_or_path!r}: not a file, and not a preset ({', '.join(preset_names())})"
            )
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for assignment in overrides or []:
        apply_override(data, assignment)
    source = path if not overrides else f"{path} with --set {' '.join(overrides)}"
    return spec_from_dict(name, data, source=source)


def parse_value(text: str) -> Any:
    """A --set value: TOML (``20000``, ``1.5``, ``true``, ``"a b"``, ``[1, 2]``, ``{k = 1}``), else
    the text itself as a string (``--set env_id=CartPole-v1``)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict[str, Any], assignment: str) -> None:
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE (dotted KEY for a table, e.g. phase2.max_steps=1)")
    *tables, leaf = key.split(".")
    target = data
    for part in tables:
        nested = target.setdefault(part, {})
        if not isinstance(nested, dict):
            raise ConfigError(f"--set {key}: {part!r} is a value, not a table")
        target = nested
    target[leaf] = parse_value(text.strip())


def spec_from_dict(name: str, data: dict[str, Any], source: str = "<spec>") -> CompetitionSpec:
    data = dict(data)
    if "adapter" in data and "format" not in data:  # the key's name before formats were folders
        data["format"] = data.pop("adapter")
    format_name = data.get("format", "flatland")
    if not isinstance(format_name, str) or format_name not in format_names():
        raise ConfigError(f"{source}: unknown format {format_name!r}; known: {', '.join(format_names())}")
    found = get_format(format_name)
    core = {k: v for k, v in data.items() if k in _CORE_KEYS}
    own = {k: v for k, v in data.items() if k not in _CORE_KEYS}
    if own and found.options is None:
        raise ConfigError(f"{source}: unknown keys {sorted(own)}; allowed: {sorted(_CORE_KEYS)}")
    budgets_data = core.pop("budgets", {})
    if not isinstance(budgets_data, dict):
        raise ConfigError(f"{source}: [budgets] must be a table")
    unknown = set(budgets_data) - _BUDGET_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown budget keys {sorted(unknown)}; allowed: {sorted(_BUDGET_KEYS)}")
    try:
        budgets = BudgetPolicy(**budgets_data)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    options = options_from_dict(found.options, own, source) if found.options is not None else None
    try:
        return CompetitionSpec(name=name, budgets=budgets, options=options, **core)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
