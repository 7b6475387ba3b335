"""A format's record fields as arbiter's outputs show them, declared once.

A format lists its columns (``Plan.columns``); results.csv, the progress line after each item
and the results table printed at the end are all drawn from that one list:

    columns = (
        Column("episode"),
        Column("seed", progress=False),
        Column("steps", ">5"),
        Column("return", ".2f"),
        Column("ended", progress=False, table=False),
    )

A column is a record field, or a figure computed from the record (``value``): the CSV holds the
raw value, the progress line ``label value`` pairs, the table one right-aligned cell per column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MISSING_TEXT = "-"  # what the progress line and the table print for a value that is None


@dataclass(frozen=True)
class Column:
    name: str  # the record's field (the CSV header)
    spec: str = ""  # format spec of the value in the progress line and the table (".4f", ">5", "g")
    # The progress line's label for the value (None: the name; "": the value alone).
    label: str | None = None
    title: str | None = None  # the table's header (None: the name)
    width: int | None = None  # the table cell's width (None: the title's, at least 6)
    value: Callable[[dict[str, Any]], Any] | None = None  # computed from the record, not read from it
    csv: bool = True
    progress: bool = True
    table: bool = True
    optional: bool = False  # True: some records lack the field (their cell is blank)

    def read(self, record: dict[str, Any]) -> Any:
        return self.value(record) if self.value is not None else record.get(self.name)

    def text(self, record: dict[str, Any]) -> str:
        """The value as the progress line and the table show it: through ``spec`` when the value
        takes it (a count in a column of ratios still prints), else as it is."""
        value = self.read(record)
        if value is None:
            return MISSING_TEXT
        try:
            return format(value, self.spec)
        except (TypeError, ValueError):
            return str(value)

    @property
    def header(self) -> str:
        return self.title if self.title is not None else self.name

    @property
    def cell_width(self) -> int:
        if self.width is not None:
            return self.width
        declared = re.match(r"[<>^=]?0?(\d*)", self.spec)
        return max(len(self.header), int(declared.group(1)) if declared and declared.group(1) else 0, 6)

    @property
    def align(self) -> str:
        return "<" if self.spec.startswith("<") else ">"


def csv_columns(columns: Iterable[Column]) -> list[str]:
    return [c.name for c in columns if c.csv]


def csv_row(columns: Iterable[Column], record: dict[str, Any]) -> dict[str, Any]:
    return {c.name: c.read(record) for c in columns if c.csv}


def progress_text(columns: Iterable[Column], record: dict[str, Any]) -> str:
    parts = []
    for c in columns:
        if not c.progress:
            continue
        label = c.name if c.label is None else c.label
        parts.append(f"{label} {c.text(record)}" if label else c.text(record))
    return "  ".join(parts)


def table_header(columns: Iterable[Column]) -> str:
    return " ".join(f"{c.header:{c.align}{c.cell_width}}" for c in columns if c.table)


def table_row(columns: Iterable[Column], record: dict[str, Any]) -> str:
    return " ".join(f"{c.text(record):{c.align}{c.cell_width}}" for c in columns if c.table)


def check_columns(columns: Iterable[Column], owner: str) -> None:
    """A format's columns, checked once when its plan is made: a typo in a declaration is said at
    load, never as a blank CSV column an hour into an evaluation."""
    seen: set[str] = set()
    for c in columns:
        if not isinstance(c, Column):
            raise TypeError(f"{owner}.columns: {c!r} is not a Column")
        if c.name in seen:
            raise ValueError(f"{owner}.columns: {c.name!r} is declared twice")
        seen.add(c.name)
        if not _takes_spec(c.spec):
            raise ValueError(
                f"{owner}.columns: {c.name!r} has the format spec {c.spec!r}, which no number or text takes"
            )


def _takes_spec(spec: str) -> bool:
    for sample in (0, "text"):
        try:
            format(sample, spec)
            return True
        except ValueError:
            continue
    return False
