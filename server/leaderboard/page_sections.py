"""The leaderboard page's parts below the ranking (the achievements, the submissions not ranked,
the counts) and the readers of a board's values they share with the ranking table."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.report.charts import fmt_count, number

MISSING = "–"
COUNT_LABELS = {"folders": "results folders read", "ranked": "ranked", "unranked": "not ranked",
                "debug_left_out": "debug runs left out", "other_phases": "of other phases",
                "baselines": "baselines"}  # fmt: skip


def board_records(board: dict[str, Any], key: str) -> list[dict[str, Any]]:
    found = board.get(key) or []
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise ConfigError(f"the leaderboard's {key!r} must be a list of objects, not {type(found).__name__}")
    return found


def board_mapping(value: Any) -> dict[str, Any]:
    """An object of the board, or an empty one where the board has something else."""
    return value if isinstance(value, dict) else {}


def moment_text(text: Any) -> tuple[str, float | None]:
    """An ISO-8601 time as read on the page (in UTC when it has a zone) and its epoch seconds."""
    if not isinstance(text, str) or not text:
        return MISSING, None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text, None
    if moment.tzinfo is None:
        return moment.strftime("%Y-%m-%d %H:%M"), None
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC"), moment.timestamp()


def unranked_section(board: dict[str, Any]) -> str:
    unranked = board_records(board, "unranked")
    if not unranked:
        return ""
    lines = []
    for item in unranked:
        state = str(item.get("state") or "UNKNOWN")
        shown, _ = moment_text(item.get("submitted_at"))
        lines.append(
            f"<tr><td>{escape(str(item.get('participant') or MISSING))}</td>"
            f'<td class="source">{escape(str(item.get("submission") or MISSING))}</td>'
            f'<td><span class="badge state {escape(state.lower())}">{escape(state)}</span></td>'
            f"<td>{escape(str(item.get('cause') or MISSING))}</td><td>{escape(shown)}</td></tr>"
        )
    head = "".join(
        f'<th scope="col">{label}</th>' for label in ("participant", "submission", "state", "cause", "submitted")
    )
    return (
        '<section><h2>Not ranked</h2><p class="note">Submissions that cannot be ranked: their evaluation '
        "failed, has not ended, or lacks a figure the board needs.</p>"
        f'<div class="scroll"><table class="unranked"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(lines)}</tbody></table></div></section>"
    )


def achievements_section(board: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    listed = [item for item in board_records(board, "achievements") if item.get("name")]
    if not listed:
        return ""
    holders: dict[str, list[str]] = {}
    for row in rows:
        # A board ranked per game counts each game's achievements apart: a participant who
        # unlocked one in two games holds it twice, each game named.
        holder = str(row.get("participant") or "")
        holder += f" ({row['group']})" if row.get("group") is not None else ""
        for item in row.get("achievements") or []:
            if isinstance(item, dict):
                holders.setdefault(str(item.get("name")), []).append(holder)
    items = "".join(
        f"<tr><td>{escape(str(item['name']))}</td><td>{escape(str(item.get('description') or ''))}</td>"
        f"<td>{escape(', '.join(holders.get(str(item['name']), [])) or 'nobody yet')}</td></tr>"
        for item in listed
    )
    head = "".join(f'<th scope="col">{label}</th>' for label in ("achievement", "what it takes", "unlocked by"))
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{items}</tbody></table>"
    return f"<section><h2>Achievements</h2>{table}</section>"


def counts_line(board: dict[str, Any]) -> str:
    counts = board_mapping(board.get("counts"))
    shown = [(label, counts.get(key)) for key, label in COUNT_LABELS.items() if number(counts.get(key)) is not None]
    return " · ".join(f"{label}: {fmt_count(count)}" for label, count in shown)
