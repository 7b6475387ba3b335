"""The submissions a board is built from: every results folder of a competition, read once.

A results folder is any folder holding a summary.json (``arbiter worker`` lays them out as
``RESULTS_ROOT/<competition>/<submission id>/``; a local run's folder counts too). Its figures
are the ones its summary.json recorded when the board's rule is the rule its evaluation was
scored with; under another rule they are recomputed from its episodes.jsonl (``rescored``), so a
changed rule rebuilds the board from the records, never from a stored ranking.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import setting_differences
from arbiter.server.core.folder_digest import short
from arbiter.server.core.rescore import (
    ABS_TOLERANCE,
    EPISODES_FILE,
    EVENTS_FILE,
    SUMMARY_FILE,
    read_summary,
    summary_rule,
)
from arbiter.server.core.seeds import read_persisted_seed
from arbiter.server.formats import get_format
from arbiter.server.service.events import submission_recorded
from arbiter.server.service.records_file import read_items

SCORED_STATE = "SUCCESS"  # an evaluation that completed: the only one a board ranks
RUNNING_STATE = "RUNNING"


@dataclass
class Entry:
    """One results folder as a board sees it."""

    results_dir: str
    results: str  # the folder, relative to the results root (what the board prints)
    participant: str
    submission: str  # the submission id (the folder's name when the summary names none)
    submitted_at: str | None  # ISO-8601
    debug: bool
    phase: str | None
    state: str
    cause: str | None  # why the evaluation ended as it did (its termination cause)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → value, direction, spread ...
    context: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # the evaluation's options, as recorded
    rescored: bool = False  # figures recomputed from its records (another rule, or none recorded, or asked)
    tests_digest: str | None = None  # the test set it played (core/folder_digest.py); None: none recorded
    problem: str | None = None  # why it cannot be ranked (None: it can)

    @property
    def when(self) -> tuple[float, str]:
        """Submission order: earlier first; a folder without a time after every timed one."""
        return (_timestamp(self.submitted_at), self.submission)

    def value(self, column: str) -> float | None:
        figure = self.figures.get(column)
        return None if figure is None else figure.get("value")

    def described_by(self, field_name: str) -> Any:
        """A context field's value; for an evaluation that reported none (it failed), the option
        of that name it ran with (a DIAMBRA evaluation's game)."""
        found = self.context.get(field_name)
        return self.options.get(field_name) if found is None else found

    def fields(self) -> dict[str, Any]:
        """What an achievement's conditions read: the context, then every figure's value."""
        return {**self.context, **{name: figure.get("value") for name, figure in self.figures.items()}}


def _timestamp(text: str | None) -> float:
    if not text:
        return float("inf")
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return float("inf")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def results_folders(root: str) -> list[str]:
    """Every folder under ``root`` holding a summary.json, or the events of an evaluation that
    started and has written none yet, in name order (a results folder's own subfolders, its
    replays, are not looked into)."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders.sort()
        if SUMMARY_FILE in files or EVENTS_FILE in files:
            found.append(folder)
            subfolders[:] = []
    return found


def _without_summary(results_dir: str, relative: str) -> Entry:
    """A folder whose evaluation started and wrote no summary.json: running, or stopped before
    its end (a killed evaluator, a lost worker); said as such, debug runs left out as ever."""
    started: dict[str, Any] = {}
    try:
        with open(os.path.join(results_dir, EVENTS_FILE), encoding="utf-8") as handle:
            first = json.loads(handle.readline() or "{}")
            started = first if isinstance(first, dict) else {}
    except (OSError, ValueError):
        pass
    name = os.path.basename(results_dir)
    # Whose it is: the evaluation names its participant in an event of its own right after it
    # starts, so that a folder without a summary is still listed under its submitter.
    identity = submission_recorded(os.path.join(results_dir, EVENTS_FILE)) or {}
    cause = (
        "no summary.json yet: the evaluation is running, or stopped before its end (a killed evaluator; "
        "on a farm, `arbiter submissions` says what became of it)"
    )
    return Entry(results_dir, relative, str(identity.get("participant") or name), str(identity.get("id") or name),
                 _submitted_at(identity, {"started_at": started.get("time")}),
                 started.get("debug") is True or identity.get("debug") is True, None, RUNNING_STATE, None,
                 problem=cause)  # fmt: skip


def read_entry(
    results_dir: str,
    root: str,
    *,
    format_name: str,
    rule_name: str,
    columns: tuple[str, ...],
    from_records: bool = False,
    conditions: dict[str, Any] | None = None,
) -> Entry:
    """The folder as an entry of a board scored by ``rule_name``; a folder that cannot be ranked
    carries its ``problem``, never an exception (one bad folder does not hide the others).
    ``from_records``: its figures recomputed from its episodes.jsonl even under its own rule.
    ``conditions``: the ``competition`` name and ``budgets`` the board's evaluations ran under, and
    the keys a submission may set (``free``); a folder evaluated under others (another
    competition's, budgets set apart, a hosted submission's ``--set`` of another key) is not ranked."""
    relative = os.path.relpath(results_dir, root)
    if not os.path.exists(os.path.join(results_dir, SUMMARY_FILE)):
        return _without_summary(results_dir, relative)
    try:
        summary = read_summary(results_dir)
    except ConfigError as exc:
        return Entry(results_dir, relative, os.path.basename(results_dir), os.path.basename(results_dir),
                     None, False, None, "UNREADABLE", None, problem=str(exc))  # fmt: skip
    identity = summary.get("submission") if isinstance(summary.get("submission"), dict) else {}
    options = summary.get("options") if isinstance(summary.get("options"), dict) else {}
    phase = identity.get("phase") if identity.get("phase") is not None else options.get("phase")
    entry = Entry(
        results_dir=results_dir,
        results=relative,
        participant=str(identity.get("participant") or os.path.basename(results_dir)),
        submission=str(identity.get("id") or summary.get("service_id") or os.path.basename(results_dir)),
        submitted_at=_submitted_at(identity, summary),
        debug=identity.get("debug") is True or summary.get("debug") is True,
        phase=None if phase is None else str(phase),
        state=str(summary.get("state")),
        cause=summary.get("termination_cause"),
        options=options,
        tests_digest=summary["tests_digest"] if isinstance(summary.get("tests_digest"), str) else None,
    )
    if summary.get("format") not in (None, format_name):
        entry.problem = f"an evaluation of format {summary.get('format')!r}, not {format_name!r}"
        return entry
    other = _other_conditions(summary, conditions, results_dir) if conditions else None
    if other:
        entry.problem = f"evaluated under other conditions than the competition's: {other}"
        return entry
    if identity.get("cancelled"):  # cancelled on the farm, even after its evaluation ended
        entry.problem = f"the submission was cancelled: {identity['cancelled']}"
        return entry
    if entry.state == RUNNING_STATE:  # a summary written before the end (a checkpoint)
        entry.problem = "the evaluation has not ended yet"
        return entry
    if entry.state != SCORED_STATE:
        entry.problem = f"the evaluation ended {entry.state}" + (f": {entry.cause}" if entry.cause else "")
        return entry
    try:
        _score(entry, summary, rule_name, from_records)
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        entry.problem = f"cannot be scored under {rule_name!r}: {exc}"
        return entry
    check_columns(entry, columns)
    return entry


def _other_conditions(summary: dict[str, Any], conditions: dict[str, Any], results_dir: str) -> str | None:
    """What the evaluation ran under that the board's evaluations do not, in words; None: the same."""
    said = []
    if summary.get("competition") not in (None, conditions["competition"]):
        said.append(f"competition {summary.get('competition')!r}, not {conditions['competition']!r}")
    reference, played = conditions.get("tests_digest"), summary.get("tests_digest")
    if reference and isinstance(played, str) and played != reference:
        said.append(f"test set {short(played)} (the competition's tests: {short(reference)})")
    seed = _chosen_seed(summary, results_dir)
    if seed is not None and "seed" in conditions and seed != conditions["seed"]:
        said.append(f"seed {seed!r} (the competition's: {conditions['seed']!r})")
    budgets = summary.get("budgets") if isinstance(summary.get("budgets"), dict) else {}
    for name, value in conditions["budgets"].items():
        if name in budgets and budgets[name] != value:
            said.append(f"{name} {budgets[name]!r} (the competition's: {value!r})")
    # The format's own keys (its env, its episodes, a training run's limits): a local run's
    # --set of any of them, as a hosted one's below.
    options = summary.get("options") if isinstance(summary.get("options"), dict) else {}
    for name, value, recorded in setting_differences(conditions.get("options") or {}, options):
        if name.split(".", 1)[0] not in conditions.get("free", ()):
            said.append(f"{name} {recorded!r} (the competition's: {value!r})")
    identity = summary.get("submission") if isinstance(summary.get("submission"), dict) else {}
    sets = identity.get("sets") if isinstance(identity.get("sets"), list) else []
    for assignment in sets:  # a hosted submission's --set overrides
        key = str(assignment).partition("=")[0].strip().split(".", 1)[0]
        if key not in conditions.get("free", ()) and key != "budgets":  # budgets: compared above
            said.append(f"--set {assignment}")
    return "; ".join(said) or None


def _chosen_seed(summary: dict[str, Any], results_dir: str) -> int | None:
    """The competition seed the evaluation's resets derived from when it was chosen rather than
    drawn (a local run's --seed, a worker's fixed one); None when it was drawn (a hosted
    evaluation's secret seed, another for each) or when the format seeds its plan its own way
    (MetaLC: the summary records the challenge's seed, not seed.json's)."""
    try:
        found = read_persisted_seed(results_dir)
    except ConfigError:
        return None
    if not found or found.get("drawn") is not False or found.get("seed") != summary.get("seed"):
        return None
    return found["seed"]


def set_apart_other_test_sets(entries: list[Entry], competition_name: str) -> None:
    """With no test folder of the competition's to compare against (its file names none, or it
    is not on this machine), the rankable evaluations played on a test set other than the one
    most of them played are not ranked: each test set is another competition. As many on two
    sets: refused, naming them. Evaluations that recorded none (a format that reads no tests, a
    folder from before the digest) are not compared."""
    played: dict[str, int] = {}
    for entry in entries:
        if entry.problem is None and entry.tests_digest:
            played[entry.tests_digest] = played.get(entry.tests_digest, 0) + 1
    if len(played) < 2:
        return
    ordered = sorted(played.items(), key=lambda item: -item[1])
    if ordered[0][1] == ordered[1][1]:
        counts = ", ".join(f"{short(digest)}: {count}" for digest, count in ordered)
        raise ConfigError(
            f"the results of {competition_name} were played on {len(played)} test sets, as many on two of them "
            f"({counts}): give the competition file its tests key, the test set it is ranked on"
        )
    most = ordered[0][0]
    for entry in entries:
        if entry.problem is None and entry.tests_digest and entry.tests_digest != most:
            entry.problem = (
                f"played another test set ({short(entry.tests_digest)}) than most evaluations here "
                f"({short(most)}); the competition file's tests key names the competition's"
            )


def check_columns(entry: Entry, columns: tuple[str, ...]) -> None:
    """A scored entry without a figure of one of ``columns`` cannot be ranked: its problem says so."""
    missing = [c for c in columns if entry.value(c) is None]
    if entry.problem is None and missing:
        entry.problem = f"no {', '.join(missing)} figure (the evaluation computed none)"


def _submitted_at(identity: dict[str, Any], summary: dict[str, Any]) -> str | None:
    found = identity.get("submitted_at")
    if isinstance(found, (int, float)) and not isinstance(found, bool):  # a Unix time
        return datetime.datetime.fromtimestamp(found, datetime.UTC).isoformat(timespec="seconds")
    return str(found or summary.get("started_at") or "") or None


def _score(entry: Entry, summary: dict[str, Any], rule_name: str, from_records: bool = False) -> None:
    """The entry's figures: as recorded under the evaluation's own rule, else (or ``from_records``)
    recomputed from its records."""
    recorded = summary.get("leaderboard") if isinstance(summary.get("leaderboard"), dict) else {}
    if not from_records and summary.get("scoring") == rule_name and recorded.get("figures"):
        entry.figures = {f["name"]: _figure(f) for f in recorded["figures"]}
        entry.context = dict(recorded.get("context") or {})
        _check_plain(entry)
        return
    figures, context = rescored(entry.results_dir, summary, rule_name)
    entry.figures = {f["name"]: _figure(f) for f in figures}
    entry.context = context
    entry.rescored = True
    _check_plain(entry)
    if summary.get("scoring") == rule_name and recorded.get("figures"):
        # The audit's point: under its own rule, records and summary that disagree were edited or
        # damaged, and nothing here says which one is true; ranking either would be a silent guess.
        differ = _disagreements(recorded["figures"], entry.figures)
        if differ:
            entry.problem = (
                f"its episodes.jsonl and its summary.json disagree: {'; '.join(differ)}: one of them was edited or "
                "damaged (`arbiter rescore` names what differs)"
            )


def _disagreements(recorded: list[Any], figures: dict[str, dict[str, Any]]) -> list[str]:
    """Each figure whose value recomputed from the records is not the one its summary recorded,
    in words; to the tolerance of `arbiter rescore`, as additions in another order differ."""
    found = []
    for figure in recorded:
        name = figure.get("name") if isinstance(figure, dict) else None
        if name not in figures:
            continue
        got, want = figures[name]["value"], figure.get("value")
        same = got == want or (
            _finite(got) and _finite(want) and math.isclose(got, want, rel_tol=0, abs_tol=ABS_TOLERANCE)
        )
        if not same:
            found.append(f"{name} {got!r} from the records, {_shown(want)} in the summary")
    return found


def rescored(results_dir: str, summary: dict[str, Any], rule_name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The figures and context of ``rule_name`` for the folder, from its episodes.jsonl: every
    item its summary says was recorded, whole and undamaged, or a ValueError that says why not."""
    spec, rule = summary_rule(results_dir, summary, rule_name)
    stored = read_items(os.path.join(results_dir, EPISODES_FILE))
    if stored.damage is not None:
        raise ValueError(f"{EPISODES_FILE} is damaged after its {len(stored.items)} whole items ({stored.damage})")
    recorded = (summary.get("items") or {}).get("recorded") if isinstance(summary.get("items"), dict) else None
    if isinstance(recorded, int) and recorded != len(stored.items):
        raise ValueError(f"{EPISODES_FILE} holds {len(stored.items)} whole items, its summary.json {recorded}")
    hook = get_format(spec.format).rescore
    scored = hook(rule, stored.records) if hook is not None else stored.records
    if not scored:
        raise ValueError(f"{EPISODES_FILE} holds no records")
    score = json.loads(json.dumps(rule.aggregate(scored)))  # as summary.json would hold it
    return rule.figures(scored, score), dict(rule.context(scored, score))


def _check_plain(entry: Entry) -> None:
    """A summary edited by hand, or damaged, may hold what no evaluation computes (NaN, text where
    a figure belongs): such a folder is not ranked, and the board of the others is written."""
    try:
        json.dumps([entry.figures, entry.context], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"its figures are not plain JSON ({exc})") from None


def _figure(figure: dict[str, Any]) -> dict[str, Any]:
    """One figure of a summary's leaderboard block, checked: a summary edited by hand or damaged
    is a ValueError that names what is wrong, never a figure that breaks the board."""
    name = figure.get("name")
    value = figure.get("value")
    if value is not None and not _finite(value):
        raise ValueError(f"figure {name!r} is {str(value)[:40]!r}, not a finite number")
    direction, spec = figure.get("direction", "higher"), figure.get("spec") or ".4f"
    if direction not in ("higher", "lower"):
        raise ValueError(f"figure {name!r} is ranked {_shown(direction)}, neither 'higher' nor 'lower'")
    try:
        format(1.0, spec)
    except (TypeError, ValueError):
        raise ValueError(f"figure {name!r} has the format spec {_shown(spec)}, which formats no number") from None
    spread = figure.get("spread") if isinstance(figure.get("spread"), dict) else {}
    ci95, std, n = spread.get("ci95"), spread.get("std"), spread.get("n")
    if ci95 is not None and not (
        isinstance(ci95, list) and len(ci95) == 2 and all(_finite(bound) for bound in ci95) and ci95[0] <= ci95[1]
    ):
        raise ValueError(f"figure {name!r} has the interval {_shown(ci95)}, not [low, high]")
    if std is not None and not (_finite(std) and std >= 0):
        raise ValueError(f"figure {name!r} has the standard deviation {_shown(std)}")
    if n is not None and not (type(n) is int and n >= 0):
        raise ValueError(f"figure {name!r} has the count {_shown(n)}")
    return {
        "value": value,
        "title": str(figure.get("title") or name),
        "direction": direction,
        "spec": spec,
        "ci95": ci95,
        "std": std,
        "n": n,
    }


def _shown(value: Any) -> str:
    return repr(value)[:40]


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)
