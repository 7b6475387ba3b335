"""The leaderboard page: one self-contained HTML document drawn from a leaderboard.json board.

Organisers publish the page wherever they like, often as a single file, so it carries everything
itself: the stylesheet inline, no fonts or images, and one small inline script that sorts the
table. Its Content-Security-Policy allows that script alone (by its hash) and nothing to be
fetched. Every text taken from the board is escaped: participant names, causes and context
fields come from the participants' side.

The table is sortable by any header (a click sorts, a second click reverses) and from the URL:
``#sort=<column>`` puts the better values first (a column's own direction; text alphabetically,
other numbers ascending), ``#sort=-<column>`` the reverse; ``#sort=rank`` is the ranking's own
order. Missing values sort last either way, and the rank numbers stay with their rows.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from html import escape
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.leaderboard.outputs import names_text
from arbiter.server.leaderboard.page_sections import (
    MISSING,
    achievements_section,
    board_mapping,
    board_records,
    counts_line,
    moment_text,
    unranked_section,
)
from arbiter.server.leaderboard.page_style import SORT_SCRIPT, STYLESHEET
from arbiter.server.report.charts import fmt_count, number

DIRECTION_WORDS = {"higher": "higher is better", "lower": "lower is better"}
ARROWS = {"higher": "↑", "lower": "↓"}
POLICY_WORDS = {"best": "each participant's best submission", "latest": "each participant's latest submission"}

SCRIPT_HASH = base64.b64encode(hashlib.sha256(SORT_SCRIPT.encode("utf-8")).digest()).decode("ascii")


@dataclass(frozen=True)
class Header:
    """One sortable column of the table: its sort key, label and how its cells compare."""

    key: str
    label: str
    numeric: bool
    better: str = ""  # "higher" or "lower" when the column has a direction

    def html(self) -> str:
        words = DIRECTION_WORDS.get(self.better, "")
        attributes = f' data-sort="{escape(self.key)}" data-type="{"number" if self.numeric else "text"}"'
        label = escape(self.label)
        if words:
            attributes += f' data-better="{self.better}" title="{label}: {words}"'
            label += (
                f' <span class="arrow" role="img" aria-label="{words}" title="{words}">{ARROWS[self.better]}</span>'
            )
        return f'<th scope="col"{attributes}><button type="button">{label}</button></th>'


# --- reading the board ---------------------------------------------------------------------------


def _columns(board: dict[str, Any]) -> list[dict[str, Any]]:
    columns = board_records(board, "columns")
    for column in columns:
        if not isinstance(column.get("name"), str) or not column["name"]:
            raise ConfigError(f"a leaderboard column needs a name: {column!r}")
    return columns


def _context_fields(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Every context field any row has, in the order they first appear, and whether all its values
    are numbers (a level sorts as a number, a game by name)."""
    fields: dict[str, bool] = {}
    for row in rows:
        for name, value in board_mapping(row.get("context")).items():
            fields[str(name)] = fields.get(str(name), True) and (value is None or number(value) is not None)
    return fields


# --- formatting ----------------------------------------------------------------------------------


def _formatted(value: Any, spec: str, column: str) -> str:
    found = number(value)
    if found is None:
        return MISSING
    if isinstance(value, int):  # a count stored as a whole number formats as one ("d" specs)
        found = value
    try:
        return format(found, spec)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"column {column!r}: {spec!r} is not a format spec for its values ({error})") from None


def _plain_number(value: float) -> str:
    """An average rank or a point count: as few decimals as it needs, at most two."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _cell(text: str, value: Any = None, css: str = "", inner: str | None = None, title: str = "") -> str:
    """A table cell; ``value`` is what the sorting script compares (None: missing, sorts last)."""
    attributes = f' class="{css}"' if css else ""
    if value is not None:
        attributes += f' data-value="{escape(str(value))}"'
    if title:
        attributes += f' title="{escape(title)}"'
    return f"<td{attributes}>{inner if inner is not None else escape(text)}</td>"


def _time_cell(text: Any) -> str:
    shown, seconds = moment_text(text)
    if seconds is None:
        return _cell(shown)
    return _cell(shown, repr(seconds), inner=f'<time datetime="{escape(str(text))}">{escape(shown)}</time>')


def _figure_cell(figures: Any, column: dict[str, Any]) -> str:
    name, spec = column["name"], str(column.get("spec") or ".4f")
    figure = board_mapping(board_mapping(figures).get(name))
    value = number(figure.get("value"))
    if value is None:
        return _cell(MISSING, css="figure")
    inner = f'<span class="value">{escape(_formatted(figure["value"], spec, name))}</span>'
    interval = figure.get("ci95")
    if isinstance(interval, list) and len(interval) == 2 and all(number(bound) is not None for bound in interval):
        low, high = (_formatted(bound, spec, name) for bound in interval)
        inner += f' <span class="ci" title="95 % interval">[{escape(low)}, {escape(high)}]</span>'
    spread = [f"std {_formatted(figure['std'], spec, name)}"] if number(figure.get("std")) is not None else []
    spread += [f"n = {fmt_count(figure['n'])}"] if number(figure.get("n")) is not None else []
    return _cell("", repr(value), "figure", inner, " · ".join(spread))


# --- the ranking table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What the table shows beyond the figures: it follows the board."""

    columns: list[dict[str, Any]]
    rank_score: str  # the rank score's header ("" when the ranking has none)
    rank_score_better: str
    context: dict[str, bool]  # context field: whether it sorts as a number

    def headers(self) -> list[Header]:
        taken = {"rank", "participant", "rank_score", "submissions", "last_submission", "achievements"}

        def own(key: str) -> str:  # a context field named like another column sorts under a longer key
            return key if key not in taken else f"context.{key}"

        figures = [
            Header(c["name"], str(c.get("title") or c["name"]), True, str(c.get("direction") or ""))
            for c in self.columns
        ]
        taken |= {c["name"] for c in self.columns}
        score = [Header("rank_score", self.rank_score, True, self.rank_score_better)] if self.rank_score else []
        context = [Header(own(field), field, numeric) for field, numeric in self.context.items()]
        return [
            Header("rank", "rank", True),
            Header("participant", "participant", False),
            *figures,
            *score,
            *context,
            Header("submissions", "submissions", True),
            Header("last_submission", "last submission", True),
            Header("achievements", "achievements", True),
        ]


def _layout(board: dict[str, Any], rows: list[dict[str, Any]]) -> Layout:
    ranking = board.get("ranking")
    has_score = any(number(row.get("rank_score")) is not None for row in rows)
    if ranking == "average-rank":
        score, better = "average rank", "lower"
    elif ranking == "borda":
        score, better = "Borda points", "higher"
    else:
        score, better = ("rank score" if has_score else ""), ""
    return Layout(_columns(board), score, better, _context_fields(rows))


def _tags(row: dict[str, Any]) -> str:
    tags = []
    neighbours = [str(name) for name in row.get("not_separable_from") or []]
    if neighbours:
        tags.append(("not-separable", f"not separable from {', '.join(neighbours)}"))
    if row.get("tie_broken_by_time"):
        tied = [str(name) for name in row.get("tied_with") or []]
        tags.append(("tie", "tie broken by submission time" + (f" (tied with {names_text(tied)})" if tied else "")))
    if row.get("rescored"):
        tags.append(("rescored", "rescored"))
    spans = "".join(f'<span class="tag {css}">{escape(text)}</span>' for css, text in tags)
    return f'<div class="tags">{spans}</div>' if spans else ""


def _achievements_cell(row: dict[str, Any], described: dict[str, str]) -> str:
    unlocked = [item for item in row.get("achievements") or [] if isinstance(item, dict) and item.get("name")]
    badges = []
    for item in unlocked:
        name = str(item["name"])
        about = [described[name]] if described.get(name) else []
        about += [f"unlocked by {item['submission']}"] if item.get("submission") else []
        badges.append(f'<span class="achievement" title="{escape(" · ".join(about))}">{escape(name)}</span>')
    inner = f'<div class="achievements">{"".join(badges)}</div>' if badges else ""
    return _cell("", len(unlocked), inner=inner)


def _ranked_row(row: dict[str, Any], layout: Layout, described: dict[str, str], order: int) -> str:
    participant = str(row.get("participant") or "")
    rank = number(row.get("rank"))
    score = number(row.get("rank_score"))
    context = board_mapping(row.get("context"))
    about = [f"submission {row['submission']}"] if row.get("submission") else []
    about += [f"results {row['results']}"] if row.get("results") else []
    title = " · ".join(about)
    cells = [
        _cell(fmt_count(rank), rank, "rank"),
        _cell("", participant, "participant", f'<span class="name">{escape(participant)}</span>{_tags(row)}', title),
        *(_figure_cell(row.get("figures"), column) for column in layout.columns),
        *([_cell(MISSING if score is None else _plain_number(score), score)] if layout.rank_score else []),
        *(_cell(str(context[f]) if context.get(f) is not None else MISSING, context.get(f)) for f in layout.context),
        _cell(fmt_count(row.get("submissions")), number(row.get("submissions"))),
        _time_cell(row.get("last_submission_at") or row.get("submitted_at")),
        _achievements_cell(row, described),
    ]
    return f'<tr data-participant="{escape(participant)}" data-order="{order}">{"".join(cells)}</tr>'


def _baseline_row(baseline: dict[str, Any], layout: Layout, order: int) -> str:
    name = str(baseline.get("name") or "baseline")
    blanks = (1 if layout.rank_score else 0) + len(layout.context) + 3
    cells = [
        _cell("", css="rank", inner='<span class="tag baseline">baseline</span>'),
        _cell("", name, "participant", f'<span class="name">{escape(name)}</span>', str(baseline.get("results") or "")),
        *(_figure_cell(baseline.get("figures"), column) for column in layout.columns),
        *(_cell("") for _ in range(blanks)),
    ]
    return (
        f'<tr class="baseline" data-participant="{escape(name)}" data-baseline="{escape(name)}" '
        f'data-order="{order}">{"".join(cells)}</tr>'
    )


def _in_ranking_order(rows: list[dict[str, Any]], baselines: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """The ranked rows, each baseline placed just before the first row ranked at or after its
    ``shown_before_rank`` (after the last row when it has none, or no row is ranked that low)."""
    placed: list[tuple[str, dict]] = [("row", row) for row in rows]
    for baseline in baselines:
        before = number(baseline.get("shown_before_rank"))
        at = len(placed)
        if before is not None:
            later = (
                i for i, (kind, row) in enumerate(placed) if kind == "row" and (number(row.get("rank")) or 0) >= before
            )
            at = next(later, at)
        placed.insert(at, ("baseline", baseline))
    return placed


def _notes(rows: list[dict[str, Any]], columns: list[dict[str, Any]], scoring: str) -> str:
    notes = []
    if any(row.get("not_separable_from") for row in rows) and columns:
        first = str(columns[0].get("title") or columns[0]["name"])
        notes.append(f"not separable: the 95 % intervals of {first} of the two participants overlap")
    if any(row.get("tie_broken_by_time") for row in rows):
        notes.append("tie broken by submission time: equal on every column; the earlier submission is placed first")
    if any(row.get("rescored") for row in rows):
        rule = f"the {scoring} rule" if scoring else "this board's rule"
        notes.append(f"rescored: figures recomputed from the episodes under {rule}, not the rule its evaluation used")
    return f'<ul class="notes">{"".join(f"<li>{escape(note)}</li>" for note in notes)}</ul>' if notes else ""


def _ranking_tables(board: dict[str, Any], rows: list[dict[str, Any]], baselines: list[dict[str, Any]]) -> str:
    """One table, or one per value of the board's ``per`` field (a game), each ranked apart."""
    per = board.get("per")
    if not per:
        return _ranking_table(board, rows, baselines)
    groups = list(dict.fromkeys(str(item.get("group")) for item in rows + baselines))
    return "".join(
        f"<h2>{escape(str(per))} {escape(group)}</h2>"
        + _ranking_table(
            board,
            [r for r in rows if str(r.get("group")) == group],
            [b for b in baselines if str(b.get("group")) == group],
            table_id=f"ranking-{number}",
        )
        for number, group in enumerate(groups, start=1)
    ) or _ranking_table(board, [], [])


def _ranking_table(
    board: dict[str, Any], rows: list[dict[str, Any]], baselines: list[dict[str, Any]], table_id: str = "ranking"
) -> str:
    layout = _layout(board, rows)
    described = {
        str(item.get("name")): str(item.get("description") or "") for item in board_records(board, "achievements")
    }
    body = [
        _ranked_row(item, layout, described, order) if kind == "row" else _baseline_row(item, layout, order)
        for order, (kind, item) in enumerate(_in_ranking_order(rows, baselines))
    ]
    head = "".join(header.html() for header in layout.headers())
    empty = '<p class="empty">No submission is ranked yet.</p>' if not rows else ""
    table = (
        f'<div class="scroll"><table id="{table_id}" class="board"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        if body
        else ""
    )
    return f"<section>{empty}{table}{_notes(rows, layout.columns, str(board.get('scoring') or ''))}</section>"


# --- the rest of the page ------------------------------------------------------------------------


def _rule_line(board: dict[str, Any]) -> str:
    columns = _columns(board)
    words = [DIRECTION_WORDS.get(str(c.get("direction")), "no direction") for c in columns]
    titles = [f"{c.get('title') or c['name']} ({said})" for c, said in zip(columns, words, strict=True)]
    over = f"{len(columns)} column{'s' if len(columns) != 1 else ''}"
    ranking = board.get("ranking")
    if ranking == "average-rank":
        rule = f"ranked by average rank over {over} (mean of per-column ranks, ties sharing the mean; lowest first)"
    elif ranking == "borda":
        rule = f"ranked by Borda points over {over} (N − place in each column, ties sharing the best place; most first)"
    elif titles:
        rule = "ranked by " + titles[0] + "".join(f", then {title}" for title in titles[1:])
    else:
        rule = f"ranked by {ranking}" if ranking else "no ranking rule"
    policy = board.get("policy")
    rule += f"; {POLICY_WORDS.get(str(policy), f'submission policy: {policy}')}" if policy else ""
    rule += "; participants still tied are placed by the earlier submission"
    built = f" Built {moment_text(board['generated_at'])[0]}." if board.get("generated_at") else ""
    return f'<p class="rule-line">{escape(rule[0].upper() + rule[1:] + "." + built)}</p>'


def render_page(board: dict[str, Any]) -> str:
    """The leaderboard page of ``board`` (a leaderboard.json object) as one HTML document."""
    if not isinstance(board, dict):
        raise ConfigError(f"a leaderboard is a JSON object, not {type(board).__name__}")
    try:
        arbiter_version = version("arbiter")
    except PackageNotFoundError:
        arbiter_version = "unknown"
    competition = str(board.get("competition") or "competition")
    phase = board.get("phase")
    phase_html = f' <span class="phase">· phase {escape(str(phase))}</span>' if phase not in (None, "") else ""
    scoring = f" · scoring {board['scoring']}" if board.get("scoring") else ""
    rows = board_records(board, "rows")
    body = (
        f'<header><p class="eyebrow">arbiter leaderboard{escape(scoring)}</p>'
        f"<h1>{escape(competition)}{phase_html}</h1>{_rule_line(board)}</header>"
        + _ranking_tables(board, rows, board_records(board, "baselines"))
        + achievements_section(board, rows)
        + unranked_section(board)
        + f"<footer>{escape(counts_line(board))}<br>Written by arbiter {escape(arbiter_version)}</footer>"
    )
    title = competition + (f" (phase {phase})" if phase not in (None, "") else "")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # Nothing may be fetched, and no script runs but the sorting one below.
        '<meta http-equiv="Content-Security-Policy" '
        f"content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Leaderboard: {escape(title)}</title><style>{STYLESHEET}</style></head>"
        f"<body><main>{body}</main><script>{SORT_SCRIPT}</script></body></html>\n"
    )
