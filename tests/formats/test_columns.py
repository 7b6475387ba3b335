"""A format's columns (server/formats/columns.py): one declaration drives results.csv, the progress
line and the results table, and a broken declaration is refused when the plan is made."""

from __future__ import annotations

import pytest

from arbiter.server.formats.columns import (
    MISSING_TEXT,
    Column,
    check_columns,
    csv_columns,
    csv_row,
    progress_text,
    table_header,
    table_row,
)

COLUMNS = (
    Column("episode"),
    Column("seed", progress=False),
    Column("steps", ">5"),
    Column("return", ".2f", label="R"),
    Column("share", ".1%", label="", value=lambda r: r["arrived"] / r["agents"], csv=False),
    Column("ended", progress=False, table=False),
)
RECORD = {"episode": 3, "seed": 99, "steps": 42, "return": -1.23456, "arrived": 1, "agents": 4, "ended": "done"}


def test_the_csv_holds_raw_values_of_its_columns_only():
    assert csv_columns(COLUMNS) == ["episode", "seed", "steps", "return", "ended"]
    assert csv_row(COLUMNS, RECORD) == {"episode": 3, "seed": 99, "steps": 42, "return": -1.23456, "ended": "done"}


def test_the_progress_line_labels_formatted_values():
    assert progress_text(COLUMNS, RECORD) == "episode 3  steps    42  R -1.23  25.0%"


def test_the_table_aligns_each_cell_under_its_header():
    header, row = table_header(COLUMNS), table_row(COLUMNS, RECORD)
    assert len(header) == len(row)
    assert header.split() == ["episode", "seed", "steps", "return", "share"]
    assert row.split() == ["3", "99", "42", "-1.23", "25.0%"]
    # every cell is right-aligned to at least 6 characters (or its header)
    assert row.startswith(" " * (len("episode") - 1) + "3")


def test_a_missing_value_prints_as_a_dash_and_a_non_number_passes_a_number_spec():
    record = {**RECORD, "return": None, "steps": "n/a"}
    line = progress_text(COLUMNS, record)
    assert f"R {MISSING_TEXT}" in line and "steps   n/a" in line
    assert csv_row(COLUMNS, record)["return"] is None


@pytest.mark.parametrize(
    "columns,error,message",
    [
        ((Column("a"), "b"), TypeError, "'b' is not a Column"),
        ((Column("a"), Column("a", ".2f")), ValueError, "'a' is declared twice"),
        ((Column("a", ".2q"),), ValueError, "'a' has the format spec '.2q'"),
    ],
)
def test_a_broken_declaration_is_named(columns, error, message):
    with pytest.raises(error, match=message):
        check_columns(columns, "MyPlan")
