"""What a competition format supplies to the core: base classes with working defaults, so a
format writes only what is its own.

The core (evaluation, service, budgets, client gate, results, events, resume, the report's frame)
plays a format's **plan**: an ordered list of items, each an episode or a stage of several
episodes (a training run). It opens one item at a time through the plan and drives the opened
item with the requests it gets:

    ENV_CREATE  → plan.open(item).create_payload()    (or item.next_reset() for a stage that
                                                      spans resets, such as a training run)
    ENV_STEP    → item.sanitize(action) → item.step(clean) → item.step_reply(...)
    item over, timed out, abandoned → item.records(...) → results, then item.close()
    evaluation ended before an item → plan.unplayed(item) → results

The core owns every budget, timeout and ending (``core/summary.py``: the ``ended`` vocabulary);
an item owns its env and the record fields of its format. The records an item returns are plain
dicts written to ``episodes.jsonl`` and are all a scoring rule ever sees, so scores recompute
offline. A format's columns (``columns.Column``) give results.csv, the progress line and the
table at the end. ``gym_episode`` has the item and plan of a format around a Gymnasium env;
``check.check_format`` plays a format against this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.core.scoring import figure
from arbiter.server.core.summary import NOT_PLAYED, ending
from arbiter.server.formats import columns as output
from arbiter.server.formats.columns import Column
from arbiter.server.formats.options import options_from_dict
from arbiter.server.formats.reset_seeds import reset_seed  # noqa: F401 (one of the helpers formats share)
from arbiter.server.formats.step_values import finite, plain, step_reply  # noqa: F401 (the others)

__all__ = [
    "Column",
    "Format",
    "Item",
    "OpenItem",
    "Plan",
    "Rule",
    "finite",
    "options_from_dict",
    "plain",
    "reset_seed",
    "step_reply",
]


@dataclass(frozen=True)
class Item:
    """One unit of an evaluation's plan."""

    index: int
    # Its identity across restarts, carried by its records as "unit": --resume checks the results
    # folder against it.
    unit: str
    fields: dict[str, Any] = field(default_factory=dict)  # carried by every record of the item
    budgets: BudgetPolicy | None = None  # this item's budgets, where they differ from the spec's
    # Items of one group depend on the agent's state from the group's first item on (a training
    # run and its evaluation episodes; a MetaLC fold): when that agent is gone (the evaluator
    # restarted mid-group), the whole group is played again from its first item. None: the item
    # stands alone.
    group: str | None = None


class OpenItem(ABC):
    """An item being played (see the module docstring for the call order). A format writes
    ``create_payload``, ``step`` and ``record``; the rest has defaults."""

    spans_resets: bool = False  # True: an ENV_CREATE during the item starts its next episode
    stage_budget_s: float | None = None  # wall-clock budget of the whole item from its opening, or None
    # True once the format's own cap (a step limit) ended the item: it ends ``step_limit``, not
    # ``finished``.
    limit_reached: bool = False
    steps: int = 0  # steps applied so far (step() counts them)
    over: bool = False  # the item has ended (step() says so)

    def __init__(self, item: Item):
        self.item = item

    @abstractmethod
    def create_payload(self) -> dict[str, Any]:
        """The ENV_CREATE reply's body: the first observation, for a server-side format."""

    def next_reset(self) -> dict[str, Any]:
        """The next episode's create payload, for an item that spans resets."""
        raise TypeError(f"{type(self).__name__}.next_reset: this item does not span resets (spans_resets is False)")

    def sanitize(self, action: Any) -> tuple[Any, int]:
        """The action to apply and how many invalid entries were replaced; raises
        ``InvalidAction`` to refuse the step (nothing is applied). By default: as sent."""
        return action, 0

    @abstractmethod
    def step(self, action: Any) -> bool:
        """Apply one step; True when the item is over."""

    def step_reply(self, invalid: int) -> dict[str, Any]:
        """The ENV_STEP reply's body; by default where the item stands."""
        return {
            "done": self.over,
            "step": self.steps,
            "invalid_actions": invalid,
            EXTENSION_KEY: {"stage_over": self.over},
        }

    def record(self, ended: str) -> dict[str, Any]:
        """The format's fields of the item's record, once it ended ``ended`` (core/summary.py's
        vocabulary); by default the item's fields alone."""
        return dict(self.item.fields)

    def records_for(self, ended: str) -> list[dict[str, Any]]:
        """The item's records: one, unless the item is a stage of several episodes."""
        return [self.record(ended)]

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        """What the core asks when the item ends: its records, each saying how it ended."""
        ended = ending(finished=finished, timeout=timeout, abandoned=abandoned, limit_reached=self.limit_reached)
        return [{**record, "ended": ended} for record in self.records_for(ended)]

    def close(self) -> None:  # noqa: B027 - optional: an item holding nothing of its own needs none
        """The item is recorded: let go of what it holds."""


class Plan(ABC):
    """A format's plan for one evaluation, made from the competition spec by ``Format.make_plan``
    (``(spec, rule, *, tests)``). A format writes its items (``make_items``), ``open`` and its
    ``columns``; the rest has defaults."""

    server_side: bool = True  # True: every step is answered with the observation (the env is the server's)
    prepare_ahead: bool = False  # True: the next item may be opened while the current one runs
    packages: tuple[str, ...] = ()  # distributions whose versions the summary records
    columns: tuple[Column, ...] = ()  # the record fields results.csv, the progress line and the table show
    # What is evaluated on (a test folder, an env id), for the summary; by default the test folder.
    source: str | None = None
    # How the items an evaluation ended before count in its score, as its ending says it.
    unplayed_count: str = "as unfinished"

    def __init__(self, spec: Any, rule: Any, *, tests: str | None = None):
        self.spec = spec
        self.rule = rule
        self.options = spec.options
        self.tests = tests
        if self.source is None:  # the test folder it reads, unless make_items names what it plays more closely
            self.source = tests
        self.seed: int | None = spec.seed
        output.check_columns(self.columns, type(self).__name__)
        self.items: list[Item] = self.make_items()

    @abstractmethod
    def make_items(self) -> list[Item]:
        """The plan's items in the order they are played (``spec.max_episodes``, a debug run's
        cap, is the format's to apply: the first that many items, unless the format declares
        ``plays_whole_plan``)."""

    @abstractmethod
    def open(self, item: Item) -> OpenItem: ...

    @property
    def item_nouns(self) -> tuple[str, str]:
        """What its items are called: its format's ``item_nouns``, unless it holds one kind only."""
        from arbiter.server.formats import get_format  # the registry imports this module

        return get_format(self.spec.format).item_nouns

    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        """The format's fields of an item never played; by default the item's fields."""
        return [dict(item.fields)]

    def unplayed(self, item: Item) -> list[dict[str, Any]]:
        """Records of an item never played (an evaluation that ended early)."""
        return [{**record, "ended": NOT_PLAYED} for record in self.unplayed_records(item)]

    def stop_before(self, item: Item, records: list[dict[str, Any]]) -> str | None:
        """Why the evaluation stops before ``item`` is handed out (its rule's own limit, given the
        records so far), or None to go on: ENV_CREATE then answers that no item is left, and the
        items not played count as unfinished."""
        return None

    def handshake(self) -> dict[str, Any]:
        """Fields the format adds to PONG's extension (spaces, the plan's stages ...)."""
        return {}

    def submit_fields(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Fields the format adds to the ENV_SUBMIT reply (Flatland's legacy figures)."""
        return {}

    @property
    def csv_columns(self) -> list[str]:
        return output.csv_columns(self.columns)

    def csv_row(self, record: dict[str, Any]) -> dict[str, Any]:
        return output.csv_row(self.columns, record)

    def progress_text(self, record: dict[str, Any]) -> str | None:
        """One progress line's text for a record; None for a record that is not its item's last
        (an item is announced once, when it ends)."""
        return output.progress_text(self.columns, record) if record.get("last_of_item", True) else None

    def table_header(self) -> str:
        return output.table_header(self.columns)

    def table_row(self, record: dict[str, Any]) -> str | None:
        """The record's row of the results table printed at the end (None: left out; by default
        every record but its item's last)."""
        return output.table_row(self.columns, record) if record.get("last_of_item", True) else None

    def close(self) -> None:  # noqa: B027 - optional: a plan holding no env needs none
        """The evaluation is over: let go of the plan's envs."""


class Rule(ABC):
    """A scoring rule: leaderboard figures from records alone (``episodes.jsonl``), so a score
    recomputes offline. The class is its own factory: ``Format.rules`` maps a name to it, and it
    is made with the format's options."""

    name: str = ""  # the name the format registers it under (summary.json's ``scoring``)
    higher_is_better: bool = True
    # The names of the figures ``figures`` reports: what a competition file's [leaderboard]
    # columns may name, checked when the file is loaded.
    figure_names: tuple[str, ...] = ("primary", "secondary")
    # Per figure name: its title, whether higher is better and its format spec, whatever the
    # records (``figure_of``): a board shows such a column alike before its first score and after.
    described: dict[str, tuple[str, bool, str]] = {}
    # The fields ``context`` reports: what an achievement's condition and [leaderboard] per may name.
    context_names: tuple[str, ...] = ()

    def __init__(self, options: Any = None):
        self.options = options

    @abstractmethod
    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """At least primary, secondary, primary_name, secondary_name and spread; summary.json's
        ``score`` is this map as it is."""

    def primary(self, records: list[dict[str, Any]]) -> float | None:
        """The primary figure alone, shown after every item as the score so far. By default
        ``aggregate``'s; a rule whose aggregate is slow (a bootstrap) computes it apart."""
        return self.aggregate(records)["primary"] if records else None

    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        """Every figure a leaderboard column may show (summary.json → ``leaderboard.figures``),
        from ``score``, what ``aggregate`` gave for ``records``: each made by
        ``core.scoring.figure``, its value the score's own. By default the score's primary and
        secondary, as ``primary`` and ``secondary``; a format names its own."""
        spreads = score.get("spread") or {}
        primary_higher = score.get("primary_higher_is_better")
        found = [
            figure(
                "primary",
                score.get("primary_name") or "primary",
                score.get("primary"),
                higher_is_better=self.higher_is_better if primary_higher is None else bool(primary_higher),
                spread_map=spreads.get("primary"),
            )
        ]
        if score.get("secondary") is not None or score.get("secondary_name") is not None:
            found.append(
                figure(
                    "secondary",
                    score.get("secondary_name") or "secondary",
                    score.get("secondary"),
                    higher_is_better=self.higher_is_better,
                    spread_map=spreads.get("secondary"),
                )
            )
        return found

    def context(self, records: list[dict[str, Any]], score: dict[str, Any]) -> dict[str, Any]:
        """Fields that describe the evaluation on a leaderboard without ranking it (a game, a
        phase); by default none."""
        return {}

    def figure_of(self, name: str, value: float | None, spread_map: Any = None) -> dict[str, Any]:
        """The figure ``name`` as ``described`` says it, with ``value`` and its spread."""
        title, higher_is_better, spec = self.described[name]
        return figure(name, title, value, higher_is_better=higher_is_better, spec=spec, spread_map=spread_map)

    def unscored_column(self, name: str) -> tuple[str, str, str]:
        """Title, direction and format spec of the column ``name`` on a board with no figure of it
        yet: as ``described`` says, else its name, in the rule's direction."""
        if name in self.described:
            title, higher_is_better, spec = self.described[name]
            return title, "higher" if higher_is_better else "lower", spec
        return name, "higher" if self.higher_is_better else "lower", ".4f"


@dataclass(frozen=True)
class Format:
    """One competition format, as the registry (``formats/__init__.py``) knows it."""

    name: str
    rules: dict[str, Callable[[Any], Any]]  # scoring rule name → factory taking the options
    make_plan: Callable[..., Plan]  # (spec, rule, *, tests) → Plan
    options: type | None = None  # frozen dataclass of the format's own competition keys
    report_sections: Callable[[dict[str, Any], list[dict[str, Any]]], str] | None = None
    # The figures at the top of the report (report_charts.HeadlineFigure), from summary.json;
    # None: the score's primary and secondary.
    report_headline: Callable[[dict[str, Any]], list[Any]] | None = None
    presets_dir: str | None = None
    requires_tests: bool = False  # True: the evaluation needs a test folder (--tests)
    # True: the evaluation reads a test folder when given one (--tests, the competition's `tests`);
    # False: it reads none, and one given is refused. requires_tests implies it.
    reads_tests: bool = False
    clients: str = ""  # how its agents connect, named when a client of another format connects
    # What one item is called in the lines people read (singular, plural).
    item_nouns: tuple[str, str] = ("episode", "episodes")
    # The environment variable naming the test data where the community's own tools set one
    # (read by `arbiter run` and `serve` after --tests and the competition's `tests`).
    tests_variable: str | None = None
    # True: its agents may use a client that knows only TCP (flatland-rl's own), so a local run
    # names the TCP address beside the unix socket arbiter's own clients use.
    tcp_clients: bool = False
    # True: a hosted evaluation draws a secret seed unless the competition fixes one (the seeds
    # of its resets are revealed only as each episode ends); False: the protocol hands every
    # reset's seed to the client anyway, or the community seeds its runs its own way.
    secret_seed: bool = False
    # True: the plan is played whole whatever spec.max_episodes says (a competition's cap, a
    # debug run's), because its items depend on each other (two-phase's phases and training
    # runs, scored together); False: make_items plays the first max_episodes items only.
    plays_whole_plan: bool = False
    # Hooks the command line and the service reach a format through; None: the format has none.
    # `arbiter generate`: (out_dir, the command's options by name, None where not given) → writes
    # the format's test data there and returns a line saying what it wrote.
    generate: Callable[[str, dict[str, Any]], str] | None = None
    # `arbiter run` without test data: () → a small test set's folder (generated once, cached).
    default_tests: Callable[[], str] | None = None
    # `arbiter replay`: (results_dir, item index, the command's options by name, progress stream)
    # → (lines to print, differences from the item's record: none when the replay matches).
    replay: Callable[[str, int, dict[str, Any], Any], tuple[list[str], list[str]]] | None = None
    # `arbiter rescore`: (rule, records read from episodes.jsonl) → the records with the figures
    # the format derives from raw fields recomputed; None: the records are scored as stored.
    rescore: Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]] | None = None
    # `--record N`: (plan, results store, N) → the plan recording its first N items, with an
    # ``episode_ended(record, evaluation)`` to call after each item's record is stored.
    recorder: Callable[[Any, Any, int], Any] | None = None

    @property
    def takes_tests(self) -> bool:
        """Whether the evaluation reads a test folder at all."""
        return self.reads_tests or self.requires_tests

    @property
    def default_rule(self) -> str:
        return next(iter(self.rules))
