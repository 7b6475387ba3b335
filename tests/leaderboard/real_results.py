"""Results folders from real evaluations, laid out as the workers lay them out
(RESULTS_ROOT/<competition>/<submission id>/), and a board recomputed from them by counting.

An evaluation here is ``arbiter run``'s runner (``run_local``) in this process against the
session's redis-server, its agent a real process, named for a participant and a submission time
as a hosted worker names it. The expected board is computed from figures the calling test derived
itself from episodes.jsonl, with no code of server/leaderboard/.
"""

from __future__ import annotations

import datetime
import json
import uuid
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from arbiter.server.cli.progress import Progress
from arbiter.server.cli.runner import run_local
from arbiter.server.core.competition import load_competition, preset_paths

START = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)  # submission times count minutes from here


@dataclass
class Submission:
    """One submission: whose, when (minutes after START), the agent's command, and the
    competition keys it was submitted with (a game, a phase ...)."""

    label: str  # what the test calls it
    participant: str
    minutes: int
    agent: list[str]
    settings: list[str] = field(default_factory=list)
    debug: bool = False
    id: str = ""  # the submission id, given when evaluated

    @property
    def submitted_at(self) -> str:
        when = START + datetime.timedelta(minutes=self.minutes)
        return when.isoformat(timespec="milliseconds")  # as summary.json writes it


def evaluate(
    competition: str, submission: Submission, *, root: Path, tests: str | None, redis_url: str
) -> dict[str, Any]:
    """Evaluate ``submission`` into ROOT/<competition name>/<submission id>/; its summary."""
    spec = load_competition(competition, submission.settings)
    if submission.debug:
        spec = spec.with_debug()  # what `arbiter run --debug` evaluates
    submission.id = f"sub-20261101-{uuid.uuid4().hex[:12]}"  # as the farm names them; unique in the session's Redis
    when = START + datetime.timedelta(minutes=submission.minutes)
    outcome = run_local(
        spec,
        agent_command=submission.agent,
        tests=tests,
        results_dir=str(root / spec.name / submission.id),
        service_id=submission.id,
        redis_url=redis_url,
        progress=Progress(enabled=False, format_name=spec.format),
        participant=submission.participant,
        submitted_at=when.timestamp(),
    )
    return outcome.summary


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def episodes(root: Path, competition: str, submission: Submission) -> list[dict[str, Any]]:
    """The records of the submission's episodes.jsonl, as written (one line per item)."""
    return read_jsonl(root / competition / submission.id / "episodes.jsonl")


def summary(root: Path, competition: str, submission: Submission) -> dict[str, Any]:
    with open(root / competition / submission.id / "summary.json", encoding="utf-8") as handle:
        return json.load(handle)


# -- the board, by counting ---------------------------------------------------------------------


@dataclass
class Scored:
    """A scored submission as the expected board sees it: its figures derived by the test."""

    submission: Submission
    figures: dict[str, float]

    @property
    def participant(self) -> str:
        return self.submission.participant

    @property
    def order(self) -> tuple[int, str]:
        """Submission order: the earlier first (the id settles equal times, never met here)."""
        return (self.submission.minutes, self.submission.id)


def _beats(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "lower" else a > b


def rule_key(entry: Scored, rivals: list[Scored], columns: dict[str, str], ranking: str) -> tuple[Any, ...]:
    """What ``ranking`` orders ``entry`` by among ``rivals`` (itself included; smaller first):
    the signed figures in column order, or the places counted in each column, how many entries
    beat it and how many equal it."""
    n = len(rivals)
    beaten_by = {c: sum(1 for o in rivals if _beats(o.figures[c], entry.figures[c], d)) for c, d in columns.items()}
    equal = {c: sum(1 for o in rivals if o.figures[c] == entry.figures[c]) for c in columns}
    if ranking == "lexicographic":
        return tuple(entry.figures[c] if d == "lower" else -entry.figures[c] for c, d in columns.items())
    if ranking == "average-rank":  # tied entries share the mean of the places they span
        places = [Fraction(2 * beaten_by[c] + 1 + equal[c], 2) for c in columns]
        return (sum(places) / len(columns),)
    if ranking == "borda":  # N minus the best place of the block an entry shares
        return (-sum(n - (beaten_by[c] + 1) for c in columns),)
    raise ValueError(ranking)


def rank_score(key: tuple[Any, ...], ranking: str) -> float | int | None:
    if ranking == "average-rank":
        return float(key[0])
    if ranking == "borda":
        return -key[0]
    return None


@dataclass
class ExpectedRow:
    rank: int
    entry: Scored
    rank_score: float | int | None
    tied_with: list[str]  # participants tied under the rule, placed by submission time


def expected_rows(scored: list[Scored], columns: dict[str, str], ranking: str, policy: str) -> list[ExpectedRow]:
    """Each participant's submission by ``policy`` (``best``: the first of theirs when every
    scored submission is ranked together; ``latest``), ranked among the chosen by ``ranking``,
    ties under the rule placed by submission time."""

    def ranked(entries: list[Scored]) -> list[tuple[Scored, tuple[Any, ...]]]:
        keyed = [(e, rule_key(e, entries, columns, ranking)) for e in entries]
        return sorted(keyed, key=lambda pair: (pair[1], pair[0].order))

    chosen: dict[str, Scored] = {}
    if policy == "latest":
        for entry in sorted(scored, key=lambda e: e.order):
            chosen[entry.participant] = entry
    else:
        for entry, _ in ranked(scored):
            chosen.setdefault(entry.participant, entry)
    board = ranked(list(chosen.values()))
    rows = []
    for rank, (entry, key) in enumerate(board, start=1):
        tied = [other.participant for other, its in board if its == key and other is not entry]
        rows.append(ExpectedRow(rank, entry, rank_score(key, ranking), tied))
    return rows


def assert_rows(rows: list[dict[str, Any]], expected: list[ExpectedRow], columns: dict[str, str]) -> None:
    """The board's rows are the expected ones: order, submission, rank, rank score, ties, and each
    column's figure exactly the test's own."""
    got = [(r["rank"], r["participant"], r["submission"], r["rank_score"], r["tied_with"]) for r in rows]
    want = [(e.rank, e.entry.participant, e.entry.submission.id, e.rank_score, e.tied_with) for e in expected]
    assert got == want
    for row, e in zip(rows, expected, strict=True):
        assert row["tie_broken_by_time"] == bool(e.tied_with)
        assert row["submitted_at"] == e.entry.submission.submitted_at
        for column in columns:
            assert row["figures"][column]["value"] == e.entry.figures[column], (row["participant"], column)


def assert_unranked(board: dict[str, Any], failed: list[Submission], state: str = "FAILED") -> None:
    """The failed submissions, and only they, are listed apart, earliest first, with the state
    their evaluation ended in."""
    assert [(u["participant"], u["submission"], u["state"]) for u in board["unranked"]] == [
        (s.participant, s.id, state) for s in sorted(failed, key=lambda s: s.minutes)
    ]
    assert all(u["cause"].startswith(f"the evaluation ended {state}") for u in board["unranked"])


def assert_no_debug(board: dict[str, Any], debug: list[Submission]) -> None:
    """Debug submissions appear nowhere on the board, and are counted as left out."""
    text = json.dumps(board)
    assert debug and all(s.id not in text for s in debug)
    assert board["counts"]["debug_left_out"] == len(debug)


def preset_leaderboard(preset: str) -> str:
    """The [leaderboard] table of a shipped preset, as its file writes it (to the file's end)."""
    text = Path(preset_paths()[preset]).read_text(encoding="utf-8")
    start = text.index("\n[leaderboard]")
    return text[start + 1 :]


def competition_file(path: Path, head: str, leaderboard: str) -> str:
    """A competition file of ``head``'s keys and tables (small settings) and the ``leaderboard``
    table text (a preset's, as ``preset_leaderboard`` gives it, or a test's own)."""
    path.write_text(head.strip() + "\n\n" + leaderboard)
    return str(path)
