"""The results folder under faults: an item lands whole or not at all as far as resume and scoring
can tell, and withdrawing items (to play them again) survives a crash at any point.

A kill, a full disk or a power loss can cut an item's append short at any byte: whatever it left
(complete lines of a training run without its last record, a cut line) is dropped by every
reader, `arbiter rescore` included, and cut off the file by ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.service.records_file import item_lines, read_items, read_records
from arbiter.server.service.results import ResultsStore

REPO = str(paths.REPO)
COLUMNS = ["index", "run", "steps"]


def csv_row(record: dict) -> dict:
    return {"index": record["index"], "run": record.get("run"), "steps": record["steps"]}


def store_at(folder: Path) -> ResultsStore:
    return ResultsStore(str(folder), COLUMNS, csv_row)


def item(index: int, records: int = 1) -> list[dict]:
    """One item's records as the core makes them: a training run when ``records`` > 1 (the run's
    figures on its last, which is marked ``last_of_item``)."""
    return [
        {"index": index, "unit": f"item-{index}", "run": n, "steps": 5, "wall_s": 0.5 if n == records - 1 else None,
         "last_of_item": n == records - 1}
        for n in range(records)
    ]  # fmt: skip


def csv_indices(store: ResultsStore) -> list[int]:
    with open(store.csv_path, encoding="utf-8") as handle:
        return [int(line.split(",")[0]) for line in handle.readlines()[1:]]


def evaluation(folder: Path) -> tuple[ResultsStore, list[list[dict]]]:
    """Items 0-4 written, item 2 a training run of 50 records."""
    store = store_at(folder)
    items = [item(0), item(1), item(2, records=50), item(3), item(4)]
    for records in items:
        store.add_episodes(records)
    return store, items


# -- a torn item -------------------------------------------------------------------------------


def torn(records: list[dict], keep_lines: int, extra_bytes: int = 0) -> bytes:
    """What an append of ``records`` left when cut short: ``keep_lines`` whole lines (never the
    item's last), then ``extra_bytes`` of the next line."""
    lines = item_lines(records).split(b"\n")
    return b"".join(line + b"\n" for line in lines[:keep_lines]) + lines[keep_lines][:extra_bytes]


@pytest.mark.parametrize("extra_bytes", [0, 17])
def test_a_training_run_cut_short_is_dropped_by_every_reader_and_cut_off_on_resume(tmp_path, extra_bytes):
    store, items = evaluation(tmp_path)
    whole = (tmp_path / "episodes.jsonl").read_bytes()
    run = item(5, records=1000)
    with open(tmp_path / "episodes.jsonl", "ab") as handle:
        handle.write(torn(run, keep_lines=600, extra_bytes=extra_bytes))  # 600 complete lines of 1000
    expected = [record for records in items for record in records]

    assert read_records(str(tmp_path / "episodes.jsonl")) == expected
    # `arbiter rescore` reads as resume does: the run is not among its records.
    summary = {"state": "INTERRUPTED", "format": "two-phase", "scoring": "two-phase", "score": {"primary": None}}
    (tmp_path / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    rescored = subprocess.run([sys.executable, "-m", "arbiter.server.cli", "rescore", str(tmp_path)],
                              capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert rescored.returncode == 0 and rescored.stdout.startswith(f"{len(expected)} records"), rescored.stdout

    resumed = store_at(tmp_path)
    assert resumed.load_for_resume() == expected
    assert (tmp_path / "episodes.jsonl").read_bytes() == whole  # the torn run is cut off the file
    assert csv_indices(resumed) == [r["index"] for r in expected]
    # The run played again lands after the whole items, as if the cut one had never been.
    resumed.add_episodes(run)
    assert read_records(str(tmp_path / "episodes.jsonl")) == expected + run


@pytest.mark.parametrize("damage", ["a damaged line", "a record cut by hand"])
def test_a_damaged_line_before_whole_items_is_refused_not_cut_off(tmp_path, damage):
    """A crash leaves at most the start of one item; a damaged line with finished items after it
    is damage: the resume refuses, and every byte of the file stays."""
    evaluation(tmp_path)
    path = tmp_path / "episodes.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"steps":5', b'"steps":5,,') if damage == "a damaged line" else lines[1][:-5]
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"damaged after its 1 whole items \(line 1 after the last whole item is not"):
        store_at(tmp_path).load_for_resume()
    assert path.read_bytes() == before


def test_records_written_before_items_were_marked_stand_for_themselves(tmp_path):
    legacy = [{"index": 0, "steps": 3}, {"index": 1, "steps": 4}]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in legacy), encoding="utf-8")
    store = store_at(tmp_path)
    assert store.load_for_resume() == legacy
    store.add_episodes(item(2, records=3))
    assert read_records(str(tmp_path / "episodes.jsonl")) == legacy + item(2, records=3)


def test_a_record_that_cannot_belong_to_the_item_being_read_ends_what_is_whole(tmp_path):
    path = tmp_path / "episodes.jsonl"
    # Item 1 lost its last record, and item 2 follows it: item 1 is torn, and so is what follows.
    path.write_bytes(item_lines(item(0)) + torn(item(1, records=3), keep_lines=2) + item_lines(item(2)))
    found = read_items(str(path))
    assert found.records == item(0) and found.whole_bytes == len(item_lines(item(0)))


# -- withdrawing items -----------------------------------------------------------------------


def replayed(folder: Path) -> list[dict]:
    return read_records(str(folder / "replayed.jsonl"))


def test_withdraw_from_takes_the_items_out_and_keeps_them_in_replayed(tmp_path):
    store, items = evaluation(tmp_path)
    withdrawn = store.withdraw_from(2)
    assert withdrawn == items[2] + items[3] + items[4]
    assert read_records(store.episodes_path) == items[0] + items[1]
    assert csv_indices(store) == [0, 1]
    assert replayed(tmp_path) == withdrawn
    assert not [name for name in os.listdir(tmp_path) if ".tmp." in name]
    # Played again: the store goes on from the kept items, in episodes.jsonl and results.csv alike.
    again = item(2, records=7)
    store.add_episodes(again)
    assert read_records(store.episodes_path) == items[0] + items[1] + again
    assert csv_indices(store) == [0, 1] + [2] * 7
    assert store_at(tmp_path).load_for_resume() == items[0] + items[1] + again
    # A second withdrawal of item 2 keeps both plays of it.
    assert store.withdraw_from(2) == again
    assert replayed(tmp_path) == withdrawn + again


def test_withdraw_from_past_the_last_item_changes_nothing(tmp_path):
    store, items = evaluation(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in ("episodes.jsonl", "results.csv")}
    assert store.withdraw_from(5) == []
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert not (tmp_path / "replayed.jsonl").exists()


def crashed_after_keeping(tmp_path: Path, index: int, cut_replayed_at: int | None = None) -> ResultsStore:
    """The folder as a crash leaves it once withdraw_from(``index``) appended to replayed.jsonl
    (all of it, or its first ``cut_replayed_at`` bytes), before episodes.jsonl was rewritten."""
    store, _ = evaluation(tmp_path / "crashed")
    shutil.copytree(tmp_path / "crashed", tmp_path / "finished")
    store_at(tmp_path / "finished").withdraw_from(index)
    kept = (tmp_path / "finished" / "replayed.jsonl").read_bytes()
    (tmp_path / "crashed" / "replayed.jsonl").write_bytes(kept if cut_replayed_at is None else kept[:cut_replayed_at])
    return store_at(tmp_path / "crashed")


@pytest.mark.parametrize("again_from", [2, 1])
def test_a_withdrawal_a_crash_cut_short_is_not_kept_twice(tmp_path, again_from):
    store = crashed_after_keeping(tmp_path, 2)
    records = store.load_for_resume()  # resume reads the items as still there: they are
    assert sorted({r["index"] for r in records}) == [0, 1, 2, 3, 4]
    withdrawn = store.withdraw_from(again_from)
    assert [r["index"] for r in withdrawn] == [r["index"] for r in records if r["index"] >= again_from]
    kept = replayed(tmp_path / "crashed")
    assert sorted(r["index"] for r in kept) == sorted(r["index"] for r in withdrawn)  # each record once
    assert read_records(store.episodes_path) == [r for r in records if r["index"] < again_from]


def test_a_withdrawal_cut_inside_its_append_is_completed_without_duplicates(tmp_path):
    store = crashed_after_keeping(tmp_path, 2, cut_replayed_at=3000)  # inside item 2's fifty records
    records = store.load_for_resume()
    withdrawn = store.withdraw_from(2)
    assert replayed(tmp_path / "crashed") == withdrawn == [r for r in records if r["index"] >= 2]


def test_a_crash_between_the_rewrites_leaves_results_csv_to_resume(tmp_path):
    store, items = evaluation(tmp_path)
    stale_csv = (tmp_path / "results.csv").read_bytes()
    store.withdraw_from(3)
    (tmp_path / "results.csv").write_bytes(stale_csv)  # the crash came before its rewrite
    (tmp_path / "results.csv.tmp.4242").write_bytes(stale_csv[:10])  # and cut that write short
    resumed = store_at(tmp_path)
    assert resumed.load_for_resume() == items[0] + items[1] + items[2]
    assert csv_indices(resumed) == [0, 1] + [2] * 50
    assert not (tmp_path / "results.csv.tmp.4242").exists()
