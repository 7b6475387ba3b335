"""Competition specs: a small TOML file naming the format, its data, budgets, scoring and options.

Presets ship in each format's folder (``formats/<name>/presets/``: ``flatland-neurips2020``,
``flatland-debug``, ``flatland3``, ``two-phase-cartpole`` ...); a path to a .toml file works too.
The core keys are this module's; every other top-level key or table belongs to the format and is
checked by the format's options class. ``--set KEY=VALUE`` overrides any key (dotted for tables,
``phase2.max_steps=20000``; VALUE is read as TOML, else as a string) and is validated exactly
like the file: unknown keys and impossible settings are errors, never silently ignored.

The seed an evaluation resets with, and how it is kept for a resume, is seeds.py's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.formats import format_names, get_format, presets_dirs, unknown_format
from arbiter.server.formats.base import options_from_dict
from arbiter.server.leaderboard.policy import LeaderboardPolicy, check_columns, check_fields, leaderboard_policy

DEFAULT_COMPETITION = "flatland-neurips2020"
DEBUG_COMPETITION = "flatland-debug"
DEBUG_EPISODES = 28
DEBUG_OVERALL_S = 48 * 60.0


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def size_bytes(text: str | int, what: str) -> int:
    """A size as the competition file writes it (``15g``, ``512MiB``, ``256mb``, a whole number
    of bytes), in bytes; units are binary (``1g`` is 1024³ bytes), as podman and docker read them."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"{what} must be more than 0 bytes, got {text}")
        return text
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(f"{what} must be a size such as 15g, 512m or 1048576, got {text!r}")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value < 1:
        raise ConfigError(f"{what} must be more than 0 bytes, got {text!r}")
    return int(value)


# A container image reference as podman and docker read one: [registry[:port]/]path[:tag][@digest],
# its path lowercase; or rootfs:PATH, the worker machine's own files (podman).
_REGISTRY = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_REGISTRY}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::\w[\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def is_image_reference(image: str) -> bool:
    """Whether ``image`` names a container image (an engine could pull it) or ``rootfs:PATH``."""
    if image.startswith("rootfs:"):
        return len(image) > len("rootfs:") and not any(character.isspace() for character in image)
    return _IMAGE.fullmatch(image) is not None


@dataclass(frozen=True)
class HostingPolicy:
    """The ``[hosting]`` table: limits of a competition hosted on a farm (``arbiter submit``).
    A quota left out is no quota; the agent's resources default to the Flatland NeurIPS 2020
    promise (4 CPUs, 15 GB), for the backends that isolate it (podman, docker, kubernetes)."""

    daily_submissions: int | None = None  # official submissions per participant per UTC day
    debug_daily_submissions: int | None = None  # debug submissions (--debug), counted apart
    cpus: float = 4.0  # CPUs the agent's container may use
    memory: str = "15g"  # memory the agent's container may use, swap included (``memory_bytes``)
    pids: int = 4096  # processes and threads in the agent's container
    gpus: int = 0  # GPUs granted to the agent (nvidia.com/gpu on Kubernetes)
    image: str | None = None  # the agent's image when a submission names none (arbiter submit --image)
    # The memory of the evaluation's own Redis: an agent that floods it fills its own, no one else's.
    redis_memory: str = "256m"

    def __post_init__(self) -> None:
        for name in ("daily_submissions", "debug_daily_submissions"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"[hosting] {name} must be a whole number >= 0, got {value!r}")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float)) or not self.cpus > 0:
            raise ConfigError(f"[hosting] cpus must be a number > 0, got {self.cpus!r}")
        object.__setattr__(self, "cpus", float(self.cpus))
        for name, least in (("pids", 1), ("gpus", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"[hosting] {name} must be a whole number >= {least}, got {value!r}")
        if self.image is not None and not (isinstance(self.image, str) and is_image_reference(self.image)):
            raise ConfigError(f"[hosting] image must be an image name such as docker.io/me/agent:1, got {self.image!r}")
        self.memory_bytes  # noqa: B018 - validated now, not when a worker first needs it
        self.redis_memory_bytes  # noqa: B018

    @property
    def memory_bytes(self) -> int:
        return size_bytes(self.memory, "[hosting] memory")

    @property
    def redis_memory_bytes(self) -> int:
        return size_bytes(self.redis_memory, "[hosting] redis_memory")


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
    hosting: HostingPolicy = field(default_factory=HostingPolicy)
    leaderboard: LeaderboardPolicy = field(default_factory=LeaderboardPolicy)  # the [leaderboard] table
    options: Any = None  # the format's own keys (its options dataclass), None for a format with none
    # True: the seed is chosen (the organiser's competition file, --set seed=, --seed; or settled
    # by persisted_seed); False: it is a shipped preset's or the default, public, and a hosted
    # evaluation draws its own.
    seed_fixed: bool = False

    def __post_init__(self) -> None:
        if self.format not in format_names():
            raise ConfigError(f"{self.name}: {unknown_format(self.format)}")
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
        if record and get_format(self.format).recorder is None:
            raise ConfigError(f"{self.name}: record_episodes (replays): format {self.format!r} has no recorder")
        if not isinstance(self.accept_pickle, bool):
            raise ConfigError(f"{self.name}: accept_pickle must be true or false")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"{self.name}: seed must be a whole number")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"{self.name}: seed must be a whole number >= 0, got {self.seed}")
        if not isinstance(self.seed_fixed, bool):
            raise ConfigError(f"{self.name}: seed_fixed must be true or false")

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
        options = self.options
        if dataclasses.is_dataclass(options) and not isinstance(options, type):
            return dataclasses.asdict(options)
        return None

    def as_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["options"] = self.options_dict()
        return found


# seed_fixed is where the seed came from, never a key of a file.
_CORE_KEYS = {f.name for f in dataclasses.fields(CompetitionSpec)} - {"name", "options", "seed_fixed"}
_BUDGET_KEYS = {f.name for f in dataclasses.fields(BudgetPolicy)}
_HOSTING_KEYS = {f.name for f in dataclasses.fields(HostingPolicy)}


def _policy_table(core: dict[str, Any], table: str, noun: str, policy: type, allowed: set[str], source: str) -> Any:
    """The ``[table]`` of a competition file (taken out of ``core``) as its policy dataclass;
    unknown keys and bad values are errors naming the file."""
    data = core.pop(table, {})
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: [{table}] must be a table")
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{source}: unknown {noun} keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    try:
        return policy(**data)
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def preset_paths() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in presets_dirs():
        for entry in sorted(os.listdir(folder)):
            if entry.endswith(".toml"):
                found[os.path.splitext(entry)[0]] = os.path.join(folder, entry)
    return found


def preset_names() -> list[str]:
    return sorted(preset_paths())


def _is_shipped_preset(path: str) -> bool:
    return os.path.realpath(path) in {os.path.realpath(p) for p in preset_paths().values()}


def phase_value(text: str) -> int | str:
    """A ``--phase`` as a competition file holds it: a whole number (two-phase's 1, 2), else the
    word (MetaLC's dev, final). The format says whether it has such a phase."""
    stripped = text.strip()
    return int(stripped) if stripped.isdigit() else stripped


def load_competition(
    name_or_path: str = DEFAULT_COMPETITION, overrides: list[str] | None = None, *, phase: Any = None
) -> CompetitionSpec:
    """The competition file or preset ``name_or_path``, with ``--set`` ``overrides`` and the
    ``--phase`` asked for (``phase``: the format's own ``phase`` key, which not every format has)."""
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
    except UnicodeDecodeError as exc:  # TOML is UTF-8
        raise ConfigError(f"{path} is not UTF-8 text, as a TOML file must be: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    # A shipped preset's seed is public; the organiser's own file or a --set chooses one.
    seed_fixed = "seed" in data and not _is_shipped_preset(path)
    tests = data.get("tests")
    if isinstance(tests, str) and tests and not os.path.isabs(tests):
        # Where the file is, not where a command runs: a worker started in another folder reads
        # the same test data (a --set tests=... is a path given on the command line, left as is).
        data["tests"] = os.path.join(os.path.dirname(os.path.abspath(path)), tests)
    if phase is not None:
        found = get_format(str(data.get("format", "")))
        fields = {f.name for f in dataclasses.fields(found.options)} if found.options is not None else set()
        if "phase" not in fields:
            raise ConfigError(f"--phase: competition {name!r} ({found.name}) has no phases to choose from")
        overrides = [*(overrides or []), f"phase={phase}"]
    for assignment in overrides or []:
        apply_override(data, assignment)
        seed_fixed = seed_fixed or assignment.partition("=")[0].strip() == "seed"
    source = path if not overrides else f"{path} with --set {' '.join(overrides)}"
    return dataclasses.replace(spec_from_dict(name, data, source=source), seed_fixed=seed_fixed)


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
        raise ConfigError(f"{source}: {unknown_format(format_name)}")
    found = get_format(format_name)
    core = {k: v for k, v in data.items() if k in _CORE_KEYS}
    own = {k: v for k, v in data.items() if k not in _CORE_KEYS}
    own_keys = {f.name for f in dataclasses.fields(found.options)} if found.options is not None else set()
    if set(own) - own_keys:  # a typo of a core key or of the format's: every key a file may hold is listed
        raise ConfigError(
            f"{source}: unknown keys {sorted(set(own) - own_keys)}; allowed: {sorted(_CORE_KEYS | own_keys)}"
        )
    budgets = _policy_table(core, "budgets", "budget", BudgetPolicy, _BUDGET_KEYS, source)
    hosting = _policy_table(core, "hosting", "hosting", HostingPolicy, _HOSTING_KEYS, source)
    board = leaderboard_policy(core.pop("leaderboard", {}), source)
    options = options_from_dict(found.options, own, source) if found.options is not None else None
    try:
        spec = CompetitionSpec(
            name=name,
            budgets=budgets,
            hosting=hosting,
            leaderboard=board,
            options=options,
            seed_fixed="seed" in core,
            **core,
        )
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if spec.tests is not None and not found.takes_tests:
        raise ConfigError(f"{source}: key 'tests': format {format_name!r} reads no test folder")
    _check_leaderboard(spec, source)
    return spec


def _check_leaderboard(spec: CompetitionSpec, source: str) -> None:
    """The board's rule is one of the format's, and its columns are figures that rule computes."""
    rules = get_format(spec.format).rules
    rule = spec.leaderboard.scoring or spec.scoring
    if rule not in rules:
        raise ConfigError(
            f"{source}: [leaderboard] scoring {rule!r} is not a rule of format {spec.format!r}; "
            f"known: {', '.join(rules)}"
        )
    from arbiter.server.core.scoring import scoring_rule  # the rule as evaluations make it

    made = scoring_rule(spec.format, rule, spec.options)
    check_columns(spec.leaderboard, tuple(made.figure_names), str(rule), source)
    check_fields(spec.leaderboard, tuple(made.figure_names), tuple(made.context_names), str(rule), source)


def setting_differences(wanted: dict[str, Any], recorded: dict[str, Any], at: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, the value wanted, the value recorded) for every key both hold that differs,
    tables compared key by key: what a board or a resume says of settings that are not the same."""
    found = []
    for name, value in wanted.items():
        if name not in recorded:
            continue
        if isinstance(value, dict) and isinstance(recorded[name], dict):
            found.extend(setting_differences(value, recorded[name], f"{at}{name}."))
        elif recorded[name] != value:
            found.append((f"{at}{name}", value, recorded[name]))
    return found
