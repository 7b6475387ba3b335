"""A competition file's ``[leaderboard]`` table: what its board shows and how it ranks.

    [leaderboard]
    columns = ["phase1", "convergence", "eval"]   # figures of the scoring rule, in ranking order
    ranking = "average-rank"                      # lexicographic | average-rank | borda
    policy = "best"                               # a participant's best, or latest, submission
    scoring = "two-phase"                         # the rule the board scores with (default: the competition's)
    phase = "dev"                                 # the phase shown when the command names none
    per = "game"                                  # one ranking per value of a context field
    hidden_phases = ["final"]                     # boards written only with --reveal
    baselines = [{ name = "random agent", results = "baselines/random" }]

    [[leaderboard.achievements]]
    name = "Won at Hard"
    description = "a winning episode at Hard difficulty"
    when = ["difficulty == 'hard'", "reward > 0"]

Every key is checked when the competition file is loaded, like the file's other tables: a column
the rule does not compute, a condition that does not parse, an unknown key are errors then, not
when the board is built.
"""

from __future__ import annotations

import math
import operator
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError

RANKINGS = ("lexicographic", "average-rank", "borda")
POLICIES = ("best", "latest")
_KEYS = {"columns", "ranking", "policy", "scoring", "phase", "hidden_phases", "baselines", "achievements", "per"}
_ACHIEVEMENT_KEYS = {"name", "description", "when", "first"}
_OPERATORS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_CONDITION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|>=|<=|>|<)\s*(.+?)\s*")


@dataclass(frozen=True)
class Condition:
    """``field op value``: a figure's value or a context field of a submission, against a constant
    (a number, a quoted text, true or false)."""

    field: str
    op: str
    value: Any
    text: str

    @classmethod
    def parse(cls, text: Any, where: str) -> Condition:
        match = _CONDITION.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(
                f'{where}: {text!r} is not a condition; write FIELD OP VALUE, e.g. "reward > 0" or '
                "\"difficulty == 'hard'\" (OP one of == != > >= < <=)"
            )
        name, op, raw = match.groups()
        try:
            value = tomllib.loads(f"value = {raw}")["value"]  # 'hard' is a TOML literal text
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{where}: in {text!r}, {raw!r} is not a number, a quoted text, true or false") from None
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: in {text!r}, compare with a number, a quoted text, true or false")
        if op not in ("==", "!=") and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise ConfigError(f"{where}: in {text!r}, {op} compares numbers; {raw!r} is not one")
        return cls(name, op, value, text.strip())

    def holds(self, fields: dict[str, Any]) -> bool:
        """True when the submission's ``fields`` satisfy it; a field it lacks, or of another kind
        than the constant, never does."""
        found = fields.get(self.field)
        if found is None:
            return False
        number = isinstance(self.value, (int, float)) and not isinstance(self.value, bool)
        if number != (isinstance(found, (int, float)) and not isinstance(found, bool)):
            return False
        if number and not math.isfinite(found):
            return False
        return bool(_OPERATORS[self.op](found, self.value))


@dataclass(frozen=True)
class Achievement:
    name: str
    description: str = ""
    conditions: tuple[Condition, ...] = ()
    first: bool = False  # unlocked by the participant's first scored submission

    def unlocked_by(self, fields: dict[str, Any], *, first: bool) -> bool:
        if self.first and not first:
            return False
        return all(condition.holds(fields) for condition in self.conditions)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description or self.explained()}

    def explained(self) -> str:
        parts = (["the participant's first scored submission"] if self.first else []) + [
            c.text for c in self.conditions
        ]
        return " and ".join(parts)


@dataclass(frozen=True)
class Baseline:
    name: str
    results: str  # a results folder: absolute, or under the results root


@dataclass(frozen=True)
class LeaderboardPolicy:
    """The ``[leaderboard]`` table. ``columns`` None: the scoring rule's first two figures."""

    columns: tuple[str, ...] | None = None
    ranking: str = "lexicographic"
    policy: str = "best"
    scoring: str | None = None
    phase: str | None = None
    hidden_phases: tuple[str, ...] = ()
    per: str | None = None  # a context field: one ranking per value of it (DIAMBRA's game)
    baselines: tuple[Baseline, ...] = ()
    achievements: tuple[Achievement, ...] = field(default_factory=tuple)


def leaderboard_policy(data: Any, source: str) -> LeaderboardPolicy:
    """The ``[leaderboard]`` table of a competition file, checked (the format's own figures are
    checked by ``check_columns`` once the rule is known)."""
    where = f"{source}: [leaderboard]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    columns = data.get("columns")
    if columns is not None:
        columns = tuple(_names(columns, f"{where} columns", 'figure names such as ["normalized_return"]'))
        if not columns:
            raise ConfigError(f"{where} columns: name at least one figure")
    ranking = data.get("ranking", "lexicographic")
    if ranking not in RANKINGS:
        raise ConfigError(f"{where} ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}")
    policy = data.get("policy", "best")
    if policy not in POLICIES:
        raise ConfigError(f"{where} policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    scoring = data.get("scoring")
    if scoring is not None and (not isinstance(scoring, str) or not scoring):
        raise ConfigError(f"{where} scoring must be the name of a scoring rule, got {scoring!r}")
    phase = data.get("phase")
    if phase is not None and not isinstance(phase, (str, int)):
        raise ConfigError(f"{where} phase must be a phase's name, got {phase!r}")
    per = data.get("per")
    if per is not None and (not isinstance(per, str) or not per):
        raise ConfigError(f'{where} per must name a context field of the format\'s figures, such as "game"')
    hidden = tuple(_names(data.get("hidden_phases", []), f"{where} hidden_phases", 'phase names such as ["final"]'))
    return LeaderboardPolicy(
        columns=columns,
        ranking=ranking,
        policy=policy,
        scoring=scoring,
        phase=None if phase is None else str(phase),
        hidden_phases=hidden,
        per=per,
        baselines=tuple(_baselines(data.get("baselines", []), f"{where} baselines")),
        achievements=tuple(_achievements(data.get("achievements", []), f"{where} achievements")),
    )


def check_columns(policy: LeaderboardPolicy, figure_names: tuple[str, ...], rule: str, source: str) -> None:
    """Every column of the board is a figure the scoring rule computes."""
    unknown = [c for c in policy.columns or () if c not in figure_names]
    if unknown:
        raise ConfigError(
            f"{source}: [leaderboard] columns {unknown} are not figures of the scoring rule {rule!r}; "
            f"its figures: {', '.join(figure_names)}"
        )


def check_fields(
    policy: LeaderboardPolicy, figure_names: tuple[str, ...], context_names: tuple[str, ...], rule: str, source: str
) -> None:
    """Every field an achievement's condition reads is a figure or a context field of the rule,
    and ``per`` a context field: a typo would be an achievement nobody unlocks, or one group."""
    known = (*figure_names, *context_names)
    for achievement in policy.achievements:
        for condition in achievement.conditions:
            if condition.field not in known:
                raise ConfigError(
                    f"{source}: [[leaderboard.achievements]] {achievement.name!r}: {condition.text!r} reads "
                    f"{condition.field!r}, which rule {rule!r} does not report; it reports {', '.join(known)}"
                )
    if policy.per is not None and policy.per not in context_names:
        fields = ", ".join(context_names) if context_names else "none"
        raise ConfigError(
            f"{source}: [leaderboard] per {policy.per!r} is not a context field of rule {rule!r} (its fields: {fields})"
        )


def _names(value: Any, where: str, example: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and str(v) for v in value):
        raise ConfigError(f"{where} must be a list of {example}, got {value!r}")
    names = [str(v) for v in value]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{where}: {repeated} named twice")
    return names


def _baselines(value: Any, where: str) -> list[Baseline]:
    if not isinstance(value, list):
        raise ConfigError(f'{where} must be a list of tables such as {{ name = "random", results = "DIR" }}')
    found = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"name", "results"}:
            raise ConfigError(f'{where}: each baseline is {{ name = "...", results = "RESULTS_DIR" }}, got {entry!r}')
        if not all(isinstance(entry[k], str) and entry[k].strip() for k in ("name", "results")):
            raise ConfigError(f"{where}: a baseline's name and results are non-empty texts, got {entry!r}")
        found.append(Baseline(entry["name"], entry["results"]))
    names = [b.name for b in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two baselines share a name ({names})")
    return found


def _achievements(value: Any, where: str) -> list[Achievement]:
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be [[leaderboard.achievements]] tables")
    found = []
    for number, entry in enumerate(value, start=1):
        at = f"{where} #{number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be a table with a name and conditions (when = [...]) or first = true")
        unknown = set(entry) - _ACHIEVEMENT_KEYS
        if unknown:
            raise ConfigError(f"{at}: unknown keys {sorted(unknown)}; allowed: {sorted(_ACHIEVEMENT_KEYS)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}: name must be a non-empty text")
        when = entry.get("when", [])
        if not isinstance(when, list):
            raise ConfigError(f'{at} ({name}): when must be a list of conditions such as ["reward > 0"]')
        first = entry.get("first", False)
        if not isinstance(first, bool):
            raise ConfigError(f"{at} ({name}): first must be true or false")
        if not when and not first:
            raise ConfigError(f"{at} ({name}): give conditions (when = [...]) or first = true; else everyone has it")
        description = entry.get("description", "")
        if not isinstance(description, str):
            raise ConfigError(f"{at} ({name}): description must be a text")
        conditions = tuple(Condition.parse(text, f"{at} ({name})") for text in when)
        found.append(Achievement(name.strip(), description, conditions, first))
    names = [a.name for a in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two achievements share a name ({names})")
    return found
