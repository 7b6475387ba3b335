"""A board written out: leaderboard.json (the board as built), leaderboard.csv (one line per row,
baselines and unranked submissions included, each saying which it is), leaderboard.html (the page),
the table ``arbiter leaderboard`` prints, and who moved since an earlier leaderboard.json."""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

from arbiter.protocol.errors import ConfigError

JSON_FILE, CSV_FILE, HTML_FILE = "leaderboard.json", "leaderboard.csv", "leaderboard.html"
ARROWS = {"higher": "↑", "lower": "↓"}


def _write(path: str, text: str) -> None:
    """Through a renamed temporary file: a reader never sees half a board."""
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    os.replace(temporary, path)


def write_board(board: dict[str, Any], out_dir: str) -> list[str]:
    """leaderboard.json, .csv and .html in ``out_dir`` (made if missing); their paths."""
    from arbiter.server.leaderboard.page import render_page

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, text in (
        (JSON_FILE, json.dumps(board, indent=2, allow_nan=False) + "\n"),
        (CSV_FILE, board_csv(board)),
        (HTML_FILE, render_page(board)),
    ):
        path = os.path.join(out_dir, name)
        _write(path, text)
        written.append(path)
    return written


def _value_text(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


class _InertCsv:
    """A CSV writer whose text cells a spreadsheet never runs as formulas: one that starts as a
    formula would (a participant named ``=HYPERLINK(...)``) starts with a ``'`` instead."""

    FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

    def __init__(self, writer: Any):
        self.writer = writer

    def writerow(self, cells: list[Any]) -> None:
        formula = self.FORMULA_STARTS
        self.writer.writerow([f"'{c}" if isinstance(c, str) and c.startswith(formula) else c for c in cells])


def board_csv(board: dict[str, Any]) -> str:
    columns = board["columns"]
    header = ["kind", "rank", "participant", "submission", "submitted_at"]
    for column in columns:
        header += [column["name"], f"{column['name']}_ci95_low", f"{column['name']}_ci95_high"]
    header += ["rank_score", "submissions", "last_submission_at", "achievements", "not_separable_from",
               "tie_broken_by_time", "rescored", "state", "cause", "results"]  # fmt: skip
    out = io.StringIO()
    writer = _InertCsv(csv.writer(out, lineterminator="\n"))
    writer.writerow(header)

    def figures(row: dict[str, Any]) -> list[Any]:
        cells: list[Any] = []
        for column in columns:
            figure = (row.get("figures") or {}).get(column["name"]) or {}
            interval = figure.get("ci95") or [None, None]
            cells += [figure.get("value"), interval[0], interval[1]]
        return cells

    for row in board["rows"]:
        writer.writerow(
            ["ranked", row["rank"], row["participant"], row["submission"], row["submitted_at"], *figures(row),
             row["rank_score"], row["submissions"], row["last_submission_at"],
             "; ".join(a["name"] for a in row["achievements"]), "; ".join(row["not_separable_from"]),
             row["tie_broken_by_time"], row["rescored"], "SUCCESS", "", row["results"]]
        )  # fmt: skip
    for baseline in board["baselines"]:
        writer.writerow(
            ["baseline", "", baseline["name"], "", "", *figures(baseline), "", "", "", "", "", "",
             baseline["rescored"], "SUCCESS", "", baseline["results"]]
        )  # fmt: skip
    for entry in board["unranked"]:
        writer.writerow(
            ["unranked", "", entry["participant"], entry["submission"], entry["submitted_at"],
             *[""] * (3 * len(columns)), "", "", "", "", "", "", "", entry["state"], entry["cause"], entry["results"]]
        )  # fmt: skip
    return out.getvalue()


SHOWN_NAMES = 3  # a tie of many (an unchanged starter kit submitted by all) names a few, counts the rest


def names_text(names: list[str]) -> str:
    """``a, b, c and 12 others``: the first few names of a long list, the rest counted."""
    if len(names) <= SHOWN_NAMES + 1:
        return ", ".join(names)
    return f"{', '.join(names[:SHOWN_NAMES])} and {len(names) - SHOWN_NAMES} others"


def board_text(board: dict[str, Any]) -> str:
    """The board as the command prints it: one line per row, baselines where they stand."""
    columns = board["columns"]
    heads = ["rank", "participant"] + [f"{c['name']} {ARROWS.get(c['direction'], '')}" for c in columns]
    score_head = {"average-rank": "avg rank", "borda": "points"}.get(board["ranking"])
    # The fields that describe the rows (a game's difficulty), but the one the board ranks per.
    shown = [
        k for k in dict.fromkeys(k for row in board["rows"] for k in row.get("context") or {}) if k != board.get("per")
    ]
    heads += ([score_head] if score_head else []) + shown + ["subs", "notes"]
    lines: list[list[str]] = []

    def cells(row: dict[str, Any]) -> list[str]:
        return [_value_text(((row.get("figures") or {}).get(c["name"]) or {}).get("value"), c["spec"]) for c in columns]

    def described(row: dict[str, Any]) -> list[str]:
        return [_value_text((row.get("context") or {}).get(k), "") for k in shown]

    baselines: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for baseline in board["baselines"]:
        baselines.setdefault((baseline.get("group"), baseline["shown_before_rank"]), []).append(baseline)

    def baseline_lines(group: Any, before: int | None) -> None:
        for baseline in baselines.get((group, before), []):
            blank = [""] if score_head else []
            lines.append(["-", baseline["name"], *cells(baseline), *blank, *described(baseline), "", "baseline"])

    group: Any = None
    for number, row in enumerate(board["rows"]):
        if board.get("per") and (number == 0 or row.get("group") != group):
            if number:
                baseline_lines(group, None)
            group = row.get("group")
            lines.append([f"{board['per']} {group}:"])  # one ranking per value: its heading
        baseline_lines(group, row["rank"])
        notes = []
        if row["not_separable_from"]:
            notes.append("not separable from " + ", ".join(row["not_separable_from"]))
        if row["tie_broken_by_time"]:
            notes.append("tied with " + names_text(row["tied_with"]) + ", placed by submission time")
        if row["rescored"]:
            notes.append(f"rescored under {board['scoring']}")
        if row["achievements"]:
            notes.append("achievements: " + ", ".join(a["name"] for a in row["achievements"]))
        score = [] if not score_head else [_value_text(row["rank_score"], ".4g")]
        lines.append([str(row["rank"]), row["participant"], *cells(row), *score, *described(row),
                      str(row["submissions"]), "; ".join(notes)])  # fmt: skip
    baseline_lines(group, None)
    table = [line for line in lines if len(line) > 1]
    widths = [max(len(h), *(len(line[i]) for line in table)) if table else len(h) for i, h in enumerate(heads)]
    title = f"{board['competition']}" + (f", phase {board['phase']}" if board.get("phase") else "")
    out = [f"{title}: {board['ranking']} ranking, each participant's {board['policy']} submission"]
    out.append("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    out += [
        line[0] if len(line) == 1 else "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    if not board["rows"]:
        out.append("(no submission can be ranked yet)")
    if board.get("columns_left_out"):
        out.append(
            f"columns with no figure in phase {board['phase']}, left out: {', '.join(board['columns_left_out'])}"
        )
    for entry in board["unranked"]:
        out.append(f"not ranked: {entry['participant']} {entry['submission']}: {entry['cause']}")
    counts = board["counts"]
    out.append(
        f"{counts['folders']} results folders: {counts['ranked']} ranked, {counts['unranked']} not ranked, "
        f"{counts['debug_left_out']} debug left out"
        + (f", {counts['other_phases']} of other phases" if counts.get("other_phases") else "")
    )
    return "\n".join(out)


def read_board(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            board = json.load(handle)
    except FileNotFoundError:
        raise ConfigError(
            f"--diff {path}: no such file (a board's first build has no earlier one to compare with: leave --diff out)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--diff {path}: not a leaderboard.json ({exc})") from None
    if not isinstance(board, dict) or not isinstance(board.get("rows"), list):
        raise ConfigError(f"--diff {path}: not a leaderboard.json (it has no rows)")
    for row in board["rows"]:
        if not (isinstance(row, dict) and isinstance(row.get("participant"), str) and type(row.get("rank")) is int):
            raise ConfigError(f"--diff {path}: not a leaderboard.json (a row without its participant and rank)")
    return board


def check_comparable(old: dict[str, Any], new: dict[str, Any], path: str) -> None:
    """``--diff`` compares two boards of one competition and phase: any other pair is refused."""
    for key in ("competition", "phase"):
        if old.get(key) != new.get(key):
            raise ConfigError(
                f"--diff {path}: a board of {key} {old.get(key)!r}, this one's is {new.get(key)!r}: "
                "who moved is said between two boards of one competition and phase"
            )


def moves(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Who moved between two boards: a line per participant whose rank changed, who arrived and
    who left (per value of the board's ``per`` field, where it ranks per game); an empty list
    when nobody moved."""

    def ranks(board: dict[str, Any]) -> dict[tuple[Any, str], int]:
        return {(row.get("group"), row["participant"]): row["rank"] for row in board["rows"]}

    def who(key: tuple[Any, str]) -> str:
        return key[1] if key[0] is None else f"{key[1]} ({key[0]})"

    before, after = ranks(old), ranks(new)
    lines = []
    for key, rank in sorted(after.items(), key=lambda item: (str(item[0][0]), item[1])):
        was = before.get(key)
        if was is None:
            lines.append(f"{who(key)}: new at {rank}")
        elif was != rank:
            way = "up" if rank < was else "down"
            lines.append(f"{who(key)}: {was} → {rank} ({way} {abs(was - rank)})")
    for key, was in sorted(before.items(), key=lambda item: (str(item[0][0]), item[1])):
        if key not in after:
            lines.append(f"{who(key)}: left the board (was {was})")
    return lines
