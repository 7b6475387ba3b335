"""The three rankings, a participant's submission by policy, and what the order cannot tell.

- **lexicographic**: the first column decides, each later column breaks the ties the columns
  before it left; each column in its own direction.
- **average-rank**: each column ranks the entries (tied entries share the mean of the places
  they span: two tied for 2nd both rank 2.5), and an entry's score is the mean of its ranks over
  the columns; the lowest mean ranks first. Computed in exact fractions, so equal means are equal.
- **borda**: each column gives an entry N − r points, r its competition rank there (tied
  entries share the best place they span: 1, 2, 2, 4) and N the number of entries; the most
  points rank first.

A figure an entry lacks ranks after every figure in that column. Entries the rule leaves tied
are placed by their submission time, earlier first, and say so (``tied_with``). Every place is a
distinct rank: a board shows who is ahead, and where the rule could not tell, why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from arbiter.server.leaderboard.entries import Entry

LOWER = "lower"  # a column's direction when a lower value is better


@dataclass(frozen=True)
class BoardColumn:
    name: str
    title: str
    direction: str  # "higher" or "lower": which is better
    spec: str = ".4f"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "direction": self.direction, "spec": self.spec}


@dataclass
class Placed:
    entry: Entry
    rank: int
    rank_score: float | None  # average rank or Borda points (None under lexicographic)
    tied_with: list[Entry] = field(default_factory=list)  # tied under the rule, placed by time


def _better_key(value: Any, direction: str) -> tuple[int, float]:
    """Sorts better values first; a missing value after all."""
    if value is None:
        return (1, 0.0)
    return (0, float(value) if direction == LOWER else -float(value))


def _column_places(entries: Sequence[Entry], column: BoardColumn) -> list[tuple[int, int]]:
    """(first place, last place) of every entry in the column, 1-based, ties spanning their block."""
    keys = [_better_key(e.value(column.name), column.direction) for e in entries]
    order = sorted(range(len(entries)), key=keys.__getitem__)
    places = [(0, 0)] * len(entries)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and keys[order[end + 1]] == keys[order[start]]:
            end += 1
        for position in range(start, end + 1):
            places[order[position]] = (start + 1, end + 1)
        start = end + 1
    return places


def average_ranks(entries: Sequence[Entry], columns: Sequence[BoardColumn]) -> list[Fraction]:
    """Each entry's mean over the columns of its fractional rank (ties share the mean place)."""
    totals = [Fraction(0)] * len(entries)
    for column in columns:
        for i, (first, last) in enumerate(_column_places(entries, column)):
            totals[i] += Fraction(first + last, 2)
    return [total / len(columns) for total in totals]


def borda_points(entries: Sequence[Entry], columns: Sequence[BoardColumn]) -> list[int]:
    """Each entry's points: N − r summed over the columns, r its competition rank (ties share the best)."""
    n = len(entries)
    points = [0] * n
    for column in columns:
        for i, (first, _last) in enumerate(_column_places(entries, column)):
            points[i] += n - first
    return points


def rule_keys(entries: Sequence[Entry], columns: Sequence[BoardColumn], ranking: str) -> tuple[list[Any], list[Any]]:
    """(sort key under the rule, rank score to show) of every entry: equal keys are a tie."""
    if ranking == "lexicographic":
        keys = [tuple(_better_key(e.value(c.name), c.direction) for c in columns) for e in entries]
        return keys, [None] * len(entries)
    if ranking == "average-rank":
        means = average_ranks(entries, columns)
        return [(m,) for m in means], [float(m) for m in means]
    if ranking == "borda":
        points = borda_points(entries, columns)
        return [(-p,) for p in points], list(points)
    raise ValueError(f"unknown ranking {ranking!r}")


def place(entries: Sequence[Entry], columns: Sequence[BoardColumn], ranking: str) -> list[Placed]:
    """The entries in ranked order, ranks 1..N, ties under the rule placed by submission time."""
    keys, scores = rule_keys(entries, columns, ranking)
    order = sorted(range(len(entries)), key=lambda i: (keys[i], entries[i].when))
    alike: dict[Any, list[int]] = {}  # key → its entries in ranked order: ties found in one pass, not N²
    for i in order:
        alike.setdefault(keys[i], []).append(i)
    placed = []
    for rank, i in enumerate(order, start=1):
        tied = [entries[j] for j in alike[keys[i]] if j != i]
        placed.append(Placed(entries[i], rank, scores[i], tied))
    return placed


def choose(entries: Sequence[Entry], columns: Sequence[BoardColumn], ranking: str, policy: str) -> list[Entry]:
    """Each participant's one submission on the board: the best under the ranking among all
    scored submissions (``best``), or the latest scored one (``latest``)."""
    chosen: dict[str, Entry] = {}
    if policy == "latest":
        for entry in sorted(entries, key=lambda e: e.when):
            chosen[entry.participant] = entry
        return list(chosen.values())
    if policy != "best":
        raise ValueError(f"unknown policy {policy!r}")
    for placed in place(entries, columns, ranking):
        chosen.setdefault(placed.entry.participant, placed.entry)
    return list(chosen.values())


def position_among(board: Sequence[Placed], extra: Entry, columns: Sequence[BoardColumn], ranking: str) -> int | None:
    """The rank of the first row ``extra`` (a baseline) would be shown before: it is ranked with
    the board's entries as if it were one, and placed after those it ties with. None: after the
    last row."""
    entries = [p.entry for p in board] + [extra]
    keys, _ = rule_keys(entries, columns, ranking)
    mine = keys[-1]
    for placed, key in zip(board, keys, strict=False):
        if key > mine:
            return placed.rank
    return None


def not_separable(board: Sequence[Placed], column: BoardColumn) -> dict[str, list[str]]:
    """Participant → the neighbours (row above, row below) whose 95 % interval of ``column``
    overlaps theirs. Rows without an interval (too few values for one) are never marked."""
    found: dict[str, list[str]] = {p.entry.participant: [] for p in board}
    interval: Callable[[Placed], Any] = lambda p: (p.entry.figures.get(column.name) or {}).get("ci95")  # noqa: E731
    for upper, lower in zip(board, board[1:], strict=False):
        a, b = interval(upper), interval(lower)
        if a and b and a[0] <= b[1] and b[0] <= a[1]:
            found[upper.entry.participant].append(lower.entry.participant)
            found[lower.entry.participant].append(upper.entry.participant)
    return found
