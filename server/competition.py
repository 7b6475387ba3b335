"""Competition specs: a small TOML file naming adapter, tests, budgets, scoring and options.

Presets ship in ``presets/`` (``flatland-neurips2020``, ``flatland-debug``, ``flatland3``); a
path to a .toml file works too. Validated at load: unknown keys and impossible settings are
errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError

from .adapters import ADAPTERS
from .budgets import BudgetPolicy
from .scoring import RULES

PRESETS_DIR = os.path.join(os.path.dirname(__file__), "presets")
DEFAULT_COMPETITION = "flatland-neurips2020"
DEBUG_COMPETITION = "flatland-debug"
DEBUG_EPISODES = 28
DEBUG_OVERALL_S = 48 * 60.0


@dataclass(frozen=True)
class CompetitionSpec:
    name: str
    adapter: str = "flatland"
    scoring: str = "neurips2020"
    tests: str | None = None
    seed: int | None = 1001
    debug: bool = False
    max_episodes: int | None = None
    record_episodes: int = 0  # keep the actions of the first N episodes for `arbiter replay`
    # Pickled requests from FlatlandRemoteClient(use_pickle=True), through a restricted unpickler.
    accept_pickle: bool = True
    budgets: BudgetPolicy = field(default_factory=BudgetPolicy)

    def __post_init__(self) -> None:
        if self.adapter not in ADAPTERS:
            raise ConfigError(f"{self.name}: unknown adapter {self.adapter!r}; known: {', '.join(ADAPTERS)}")
        if self.scoring not in RULES:
            raise ConfigError(f"{self.name}: unknown scoring rule {self.scoring!r}; known: {', '.join(RULES)}")
        if self.max_episodes is not None and (not isinstance(self.max_episodes, int) or self.max_episodes < 1):
            raise ConfigError(f"{self.name}: max_episodes must be a whole number >= 1")
        record = self.record_episodes
        if isinstance(record, bool) or not isinstance(record, int) or record < 0:
            raise ConfigError(f"{self.name}: record_episodes must be a whole number >= 0")
        if not isinstance(self.accept_pickle, bool):
            raise ConfigError(f"{self.name}: accept_pickle must be true or false")
        if self.seed is not None and not isinstance(self.seed, int):
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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TOP_KEYS = {f.name for f in dataclasses.fields(CompetitionSpec)} - {"name"}
_BUDGET_KEYS = {f.name for f in dataclasses.fields(BudgetPolicy)}


def preset_names() -> list[str]:
    return sorted(os.path.splitext(f)[0] for f in os.listdir(PRESETS_DIR) if f.endswith(".toml"))


def load_competition(name_or_path: str = DEFAULT_COMPETITION) -> CompetitionSpec:
    if os.path.isfile(name_or_path):
        path, name = name_or_path, os.path.splitext(os.path.basename(name_or_path))[0]
    else:
        path, name = os.path.join(PRESETS_DIR, f"{name_or_path}.toml"), name_or_path
        if not os.path.isfile(path):
            raise ConfigError(
                f"unknown competition {name_or_path!r}: not a file, and not a preset ({', '.join(preset_names())})"
            )
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return spec_from_dict(name, data, source=path)


def spec_from_dict(name: str, data: dict[str, Any], source: str = "<spec>") -> CompetitionSpec:
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    budgets_data = data.get("budgets", {})
    if not isinstance(budgets_data, dict):
        raise ConfigError(f"{source}: [budgets] must be a table")
    unknown = set(budgets_data) - _BUDGET_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown budget keys {sorted(unknown)}; allowed: {sorted(_BUDGET_KEYS)}")
    try:
        budgets = BudgetPolicy(**budgets_data)
        values = {k: v for k, v in data.items() if k != "budgets"}
        return CompetitionSpec(name=name, budgets=budgets, **values)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
