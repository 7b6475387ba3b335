"""A competition's board, built from its results folders and its competition file alone.

``build_board`` reads every results folder of the competition, leaves debug submissions out,
lists the ones that cannot be ranked apart (failed, unscored), keeps each participant's submission
by the policy, ranks them by the ranking, and says what the order cannot tell: neighbours whose
intervals overlap, ties placed by submission time. Baselines are placed as unranked reference
rows, achievements are listed per participant. The result is leaderboard.json's content; the CSV,
the text table and the page (``page.render_page``) are drawn from it.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.core.folder_digest import folder_digest
from arbiter.server.core.rescore import read_summary
from arbiter.server.core.scoring import scoring_rule
from arbiter.server.leaderboard.entries import (
    Entry,
    check_columns,
    read_entry,
    rescored,
    results_folders,
    set_apart_other_test_sets,
)
from arbiter.server.leaderboard.policy import Achievement
from arbiter.server.leaderboard.ranking import BoardColumn, Placed, choose, not_separable, place, position_among


def build_board(
    spec: CompetitionSpec,
    results_root: str,
    *,
    phase: str | None = None,
    ranking: str | None = None,
    policy: str | None = None,
    reveal: bool = False,
    now: datetime.datetime | None = None,
    from_records: bool = False,
) -> dict[str, Any]:
    """The board of ``spec`` over ``results_root/<competition>/`` (leaderboard.json's content);
    ``ranking`` and ``policy`` None: the competition file's. ``from_records``: every figure
    recomputed from the folders' episodes.jsonl, none taken from their summary.json."""
    settings = spec.leaderboard
    ranking = ranking or settings.ranking
    policy = policy or settings.policy
    phase = phase if phase is not None else settings.phase
    _refuse_hidden(spec, phase, reveal)
    rule_name = str(settings.scoring or spec.scoring)
    folder = os.path.join(results_root, spec.name)
    if not os.path.isdir(folder):
        present = sorted(e for e in os.listdir(results_root) if os.path.isdir(os.path.join(results_root, e))) if (
            os.path.isdir(results_root)) else None  # fmt: skip
        where = f"it holds {', '.join(present) or 'no folder'}" if present is not None else (
            "it is a file, not a folder" if os.path.exists(results_root) else "it does not exist")  # fmt: skip
        raise ConfigError(f"no results of competition {spec.name!r} under {results_root} ({where})")
    names = _column_names(spec, rule_name)
    # What every ranked evaluation ran under; a hosted submission may choose its phase, and what
    # the rule reports beside its figures (DIAMBRA's game and difficulty), nothing else.
    free = ("phase", *scoring_rule(spec.format, rule_name, spec.options).context_names)
    conditions = {
        "competition": spec.name,
        "budgets": spec.budgets.as_dict(),
        "options": spec.options_dict() or {},
        "free": free,
        "seed": spec.seed,
        # The competition's test set, when its file names one this machine holds; else the one
        # most of its evaluations played (set_apart_other_test_sets).
        "tests_digest": folder_digest(spec.tests) if spec.tests and os.path.isdir(spec.tests) else None,
    }
    entries = [
        read_entry(
            d,
            results_root,
            format_name=spec.format,
            rule_name=rule_name,
            columns=(),
            from_records=from_records,
            conditions=conditions,
        )  # fmt: skip
        for d in results_folders(folder)
    ]
    folders = len(entries)
    debug_left_out = sum(1 for e in entries if e.debug)
    other_phases = 0  # submissions to another phase than the board's
    entries = [e for e in entries if not e.debug]
    phases = sorted({e.phase for e in entries if e.phase is not None})
    if phase is None and phases and any(e.phase is None for e in entries):
        # Whole evaluations (two-phase's both phases) make the competition's own board: a
        # submission to one phase alone would otherwise turn it into that phase's, ranking every
        # whole evaluation on that phase's column. It is counted apart; --phase ranks it.
        other_phases = sum(1 for e in entries if e.phase is not None)
        entries = [e for e in entries if e.phase is None]
        phases = []
    if phase is None and len(phases) > 1:
        raise ConfigError(f"the results of {spec.name} hold the phases {', '.join(phases)}: choose one with --phase")
    if phase is not None:
        if entries and phase not in phases:
            held = f"the phases {', '.join(phases)}" if phases else "no phase"
            raise ConfigError(f"no results of phase {phase!r} for {spec.name}: its results hold {held}")
        other_phases = sum(1 for e in entries if e.phase != phase)
        entries = [e for e in entries if e.phase == phase]
    elif phases:
        # The one phase the results hold is the board's (it may be hidden), and its evaluations
        # decide its columns.
        phase = phases[0]
        _refuse_hidden(spec, phase, reveal)
    if conditions["tests_digest"] is None:
        set_apart_other_test_sets(entries, spec.name)
    names, left_out = _phase_columns(names, [e for e in entries if e.phase == phase], phase)
    for entry in entries:
        check_columns(entry, names)
    scored = [e for e in entries if e.problem is None]
    described = _described_by_the_rule(scored, rule_name)
    for entry in scored:
        entry.problem = _described_otherwise(entry, described)
    scored = [e for e in scored if e.problem is None]
    columns = _columns(names, scored, described, scoring_rule(spec.format, rule_name, spec.options))
    per = settings.per
    groups = sorted({_group(e, per) for e in scored}, key=str) if per else [None]
    rows: list[dict[str, Any]] = []
    baselines: list[dict[str, Any]] = []
    for group in groups:
        # One ranking per value of the ``per`` field (a game): a participant's submissions to
        # another game neither compete nor count here.
        mine = [e for e in entries if not per or _group(e, per) == group]
        ranked = place(choose([e for e in mine if e.problem is None], columns, ranking, policy), columns, ranking)
        separable = not_separable(ranked, columns[0]) if ranked else {}
        by_participant: dict[str, list[Entry]] = {}
        for entry in mine:
            by_participant.setdefault(entry.participant, []).append(entry)
        rows += [{**_row(p, by_participant, separable, settings.achievements), "group": group} for p in ranked]
        for baseline in settings.baselines:
            shown = _baseline(spec, baseline, results_root, rule_name, names, ranked, columns, ranking)
            if not per or _group_of(shown["context"], per) == group:
                baselines.append({**shown, "group": group})
    unranked = sorted((e for e in entries if e.problem is not None), key=lambda e: e.when)
    return {
        "competition": spec.name,
        "format": spec.format,
        "phase": phase,
        "scoring": rule_name,
        "generated_at": (now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds"),
        "ranking": ranking,
        "policy": policy,
        "per": per,
        "columns": [c.as_dict() for c in columns],
        "columns_left_out": list(left_out),
        "rows": rows,
        "baselines": baselines,
        "unranked": [_unranked(e) for e in unranked],
        "achievements": [a.as_dict() for a in settings.achievements],
        "counts": {
            "folders": folders,
            "ranked": len(rows),
            "unranked": len(unranked),
            "debug_left_out": debug_left_out,
            "other_phases": other_phases,
            "baselines": len(baselines),
        },
    }


def _group_of(context: dict[str, Any], per: str) -> str:
    found = context.get(per)
    return "(none)" if found is None else str(found)


def _group(entry: Entry, per: str) -> str:
    return _group_of({per: entry.described_by(per)}, per)


def _refuse_hidden(spec: CompetitionSpec, phase: str | None, reveal: bool) -> None:
    if phase is not None and phase in spec.leaderboard.hidden_phases and not reveal:
        raise ConfigError(
            f"the {phase!r} board of {spec.name} is hidden until the organiser reveals it: add --reveal to write it"
        )


def _column_names(spec: CompetitionSpec, rule_name: str) -> tuple[str, ...]:
    if spec.leaderboard.columns:
        return spec.leaderboard.columns
    rule = scoring_rule(spec.format, rule_name, spec.options)
    return tuple(getattr(rule, "figure_names", ("primary", "secondary"))[:2])


def _phase_columns(
    names: tuple[str, ...], entries: list[Entry], phase: str | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns of one phase's board, and those left out: a column that no evaluation of the
    phase has a figure for is not that phase's (a two-phase competition's phase 1 computes no
    convergence). Every column stays on a board of all phases, and while nothing is scored."""
    if phase is None:
        return names, ()
    scored = [e for e in entries if e.problem is None]
    kept = tuple(c for c in names if any(e.value(c) is not None for e in scored))
    if not kept:
        return names, ()
    return kept, tuple(c for c in names if c not in kept)


Description = tuple[str, str, str]  # a figure's title, direction and format spec


def _described_by_the_rule(scored: list[Entry], rule_name: str) -> dict[str, Description]:
    """How the rule itself titles, directs and formats each figure, from the first folder whose
    records it can score: a folder's own summary.json may have been edited."""
    for entry in scored:
        try:
            figures, _ = rescored(entry.results_dir, read_summary(entry.results_dir), rule_name)
        except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        return {f["name"]: (str(f["title"]), f["direction"], f["spec"]) for f in figures}
    return {}


def _described_otherwise(entry: Entry, described: dict[str, Description]) -> str | None:
    """Why the entry's figures cannot be ranked with the rule's: its summary describes one as the
    rule does not (a column ranked the other way, say); None when they agree."""
    for name, figure in entry.figures.items():
        found = (figure["title"], figure["direction"], figure["spec"])
        if name in described and found != described[name]:
            return (
                f"its summary.json gives the figure {name!r} (title, direction, format) as {found}, the rule as "
                f"{described[name]}: edited or damaged (`arbiter rescore` names what differs)"
            )
    return None


def _columns(
    names: tuple[str, ...], scored: list[Entry], described: dict[str, Description], rule: Any
) -> list[BoardColumn]:
    """The board's columns, titled and directed as the rule says (else as the first figure says;
    with no figure yet, as the rule says of the column alone)."""
    columns = []
    for name in names:
        figure = next((e.figures[name] for e in scored if name in e.figures), None)
        if name in described:
            columns.append(BoardColumn(name, *described[name]))
        elif figure is None:
            columns.append(BoardColumn(name, *rule.unscored_column(name)))
        else:
            columns.append(BoardColumn(name, figure["title"], figure["direction"], figure["spec"]))
    return columns


def _row(
    placed: Placed, by_participant: dict[str, list[Entry]], separable: dict[str, list[str]], achievements: Any
) -> dict[str, Any]:
    entry = placed.entry
    own = by_participant[entry.participant]
    timed = [e for e in own if e.submitted_at]
    return {
        "rank": placed.rank,
        "participant": entry.participant,
        "submission": entry.submission,
        "submitted_at": entry.submitted_at,
        "results": entry.results,
        "figures": {
            name: {k: figure[k] for k in ("value", "ci95", "std", "n")} for name, figure in entry.figures.items()
        },
        "rank_score": placed.rank_score,
        "submissions": len(own),
        "last_submission_at": max(timed, key=lambda e: e.when).submitted_at if timed else None,
        "context": entry.context,
        "achievements": unlocked(own, achievements),
        "not_separable_from": separable.get(entry.participant, []),
        "tie_broken_by_time": bool(placed.tied_with),
        "tied_with": [t.participant for t in placed.tied_with],
        "rescored": entry.rescored,
    }


def unlocked(own: list[Entry], achievements: tuple[Achievement, ...]) -> list[dict[str, Any]]:
    """The achievements a participant's scored submissions unlocked, each with the earliest
    submission that did."""
    scored = sorted((e for e in own if e.problem is None), key=lambda e: e.when)
    found = []
    for achievement in achievements:
        for number, entry in enumerate(scored):
            if achievement.unlocked_by(entry.fields(), first=number == 0):
                found.append({"name": achievement.name, "submission": entry.submission})
                break
    return found


def _baseline(
    spec: CompetitionSpec,
    baseline: Any,
    results_root: str,
    rule_name: str,
    names: tuple[str, ...],
    ranked: list[Placed],
    columns: list[BoardColumn],
    ranking: str,
) -> dict[str, Any]:
    folder = baseline.results if os.path.isabs(baseline.results) else os.path.join(results_root, baseline.results)
    if not os.path.isfile(os.path.join(folder, "summary.json")):
        raise ConfigError(f"baseline {baseline.name!r}: {folder} is not a results folder (it holds no summary.json)")
    entry = read_entry(folder, results_root, format_name=spec.format, rule_name=rule_name, columns=names)
    if entry.problem is not None:
        raise ConfigError(f"baseline {baseline.name!r} ({folder}) cannot be shown: {entry.problem}")
    return {
        "name": baseline.name,
        "results": entry.results,
        "shown_before_rank": position_among(ranked, entry, columns, ranking) if ranked else None,
        "figures": {
            name: {k: figure[k] for k in ("value", "ci95", "std", "n")} for name, figure in entry.figures.items()
        },
        "context": entry.context,
        "rescored": entry.rescored,
    }


def _unranked(entry: Entry) -> dict[str, Any]:
    return {
        "participant": entry.participant,
        "submission": entry.submission,
        "state": entry.state,
        "cause": entry.problem,
        "submitted_at": entry.submitted_at,
        "results": entry.results,
    }
