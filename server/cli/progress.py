"""What a person watching ``arbiter run`` / ``arbiter serve`` sees: a line per episode, a table at the end."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from arbiter.server.core.words import count_items, item_noun, plural  # noqa: F401 (used here and by watch)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def bank_note(record: dict[str, Any]) -> str:
    """What an episode drew from its time bank, when it drew anything."""
    used = record.get("time_bank_used_s")
    return f"  bank used {used:.3f} s" if isinstance(used, (int, float)) and used > 0 else ""


def _fmt(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool = True, format_name: str | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.format_name = format_name  # names the items in the start line

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):
            # What shows the lines went away (`arbiter run ... 2>&1 | head`, a closed terminal):
            # the evaluation goes on without them, its results folder says everything.
            self.enabled = False

    def started(
        self,
        *,
        service_id: str,
        tests: str | None,
        episodes: int,
        competition: str,
        debug: bool,
        redis: str,
        nouns: tuple[str, str] | None = None,
        on_record: int = 0,
        agent: bool = True,
    ) -> None:
        """``agent`` False: no agent is waited for (a resume with every item on record whose agent
        is not started), and the line does not say one is."""
        label = " [DEBUG run: shortened, not an official score]" if debug else ""
        of_source = f" of {tests}" if tests else ""  # a plan that names no source (Plan.source) is said without
        # A resumed evaluation says what it goes on from: the items its folder holds are not played again.
        kept = f", {on_record} already on record" if on_record else ""
        self.note(
            f"arbiter: evaluating {count_items(episodes, self.format_name, nouns)}{of_source}{kept} ({competition})"
            f"{label}\n"
            f"arbiter: service id {service_id!r} on {redis}{'; waiting for the agent' if agent else ''}"
        )

    def episode(self, record: dict[str, Any], evaluation: Any) -> None:
        done = record["index"] + 1  # items are played in order; an item may hold many records
        note = bank_note(record)
        if record["timed_out"]:
            note += f"  TIMEOUT ({record['timeout']})"
        elif record["abandoned"]:
            note += "  ABANDONED"
        elif record["skipped"]:
            note += "  NOT PLAYED"
        elif record.get("ended") == "step_limit":
            note += "  STEP LIMIT"
        text = evaluation.plan.progress_text(record)
        if text is None:  # the format shows this record with its item's last one
            return
        tag = "[DEBUG] " if evaluation.debug else ""
        self.note(
            f"{tag}[{done}/{evaluation.total}] {text}{note}  | "
            f"score so far {_fmt(evaluation.running_score())}  | "
            f"time left {_duration(evaluation.time_left_s(time.monotonic()))}"
        )

    def finished(self, summary: dict[str, Any], evaluation: Any, results_dir: str) -> None:
        self.note(results_table(summary, evaluation.records, results_dir, evaluation.plan))


def results_table(summary: dict[str, Any], records: list[dict[str, Any]], results_dir: str, plan: Any) -> str:
    """The format's columns per record (``plan.table_header``/``table_row``; a row of None is
    left out; no table at all without a row), then the scores."""
    rows = []
    for r in records:
        row = plan.table_row(r)
        if row is None:
            continue
        note = "timeout " + r["timeout"] if r["timed_out"] else ("abandoned" if r["abandoned"] else "")
        note = "not played" if r["skipped"] else "step limit" if r.get("ended") == "step_limit" else note
        rows.append(f"{r['index']:>3}  {row}  {note}".rstrip())
    lines = ["", f"{'#':>3}  {plan.table_header()}  note", *rows] if rows else []
    score = summary["score"]
    debug = " (DEBUG run: not an official score)" if summary["debug"] else ""
    lines.append("")
    lines.append(f"state: {summary['state']}{debug} - {summary['termination_cause']}")
    if score["primary"] is not None:
        lines.append(f"primary   ({score['primary_name']}): {score['primary']:.6f}")
        if score["secondary"] is not None:  # a format may have one figure only (two-phase's phase 1 alone)
            lines.append(f"secondary ({score['secondary_name']}): {score['secondary']:.6f}")
    else:
        lines.append("no score")
    lines.append(f"evaluation time: {summary['timing']['evaluation_s']:.2f} s; results in {results_dir}")
    return "\n".join(lines)
