"""server/service/results.py: the results folder as ResultsStore writes it and every reader reads it.

What happens to the folder under faults (torn appends, full disks, crashed withdrawals) is in
tests/service/test_fault_results.py and tests/service/test_full_disk.py; here is the plain
behaviour those build on, on disk: what an item's write leaves, what a fresh start removes,
what a resume loads, what a withdrawal moves, and a folder that cannot be written.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from arbiter.server.service import durable
from arbiter.server.service.records_file import ITEM_END, read_items, read_records
from arbiter.server.service.results import ResultsStore, ResultsUnwritable, replay_file

COLUMNS = ["index", "unit", "score"]


def csv_row(record: dict[str, Any]) -> dict[str, Any]:
    return {"index": record["index"], "unit": record["unit"], "score": record["score"]}


def store_in(folder: str) -> ResultsStore:
    return ResultsStore(folder, COLUMNS, csv_row)


def item(index: int, scores: list[float]) -> list[dict[str, Any]]:
    """An item's records as the core makes them: the last one marked ``last_of_item``."""
    last = len(scores) - 1
    return [
        {"index": index, "unit": f"item-{index}", "score": score, ITEM_END: i == last} for i, score in enumerate(scores)
    ]


def csv_rows(store: ResultsStore) -> list[dict[str, str]]:
    with open(store.csv_path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def file_lines(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_an_item_is_appended_whole_with_its_last_record_marked(tmp_path):
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0, 2.0, 3.0]))
    store.add_episode(item(1, [4.0])[0])
    assert [line[ITEM_END] for line in file_lines(store.episodes_path)] == [False, False, True, True]
    # Readers see the records as the evaluation made them.
    assert read_records(store.episodes_path) == item(0, [1.0, 2.0, 3.0]) + item(1, [4.0])
    assert [len(stored.records) for stored in read_items(store.episodes_path).items] == [3, 1]


def test_results_csv_has_the_formats_columns_and_a_row_per_record(tmp_path):
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [0.5, 0.25]))
    store.add_episodes(item(1, [1.5]))
    rows = csv_rows(store)
    assert list(rows[0]) == COLUMNS
    assert [(row["index"], row["score"]) for row in rows] == [("0", "0.5"), ("0", "0.25"), ("1", "1.5")]


def test_no_records_write_nothing(tmp_path):
    store = store_in(str(tmp_path))
    store.add_episodes([])
    assert not os.path.exists(store.episodes_path) and not os.path.exists(store.csv_path)


def test_a_record_that_is_not_json_is_refused_and_leaves_the_file_as_it_was(tmp_path):
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0]))
    before = Path(store.episodes_path).read_bytes()
    with pytest.raises(ValueError):
        store.add_episodes(item(1, [float("nan")]))  # JSON has no NaN: scoring could not read it back
    assert Path(store.episodes_path).read_bytes() == before


def test_the_summary_is_rewritten_whole_and_read_back(tmp_path):
    store = store_in(str(tmp_path))
    assert store.previous_summary() is None
    store.write_summary({"state": "RUNNING"})
    store.write_summary({"state": "SUCCESS", "score": {"primary": 1.0}})
    assert store.previous_summary() == {"state": "SUCCESS", "score": {"primary": 1.0}}
    assert [name for name in os.listdir(tmp_path) if ".tmp." in name] == []


def test_a_summary_that_cannot_be_read_is_no_previous_summary(tmp_path):
    store = store_in(str(tmp_path))
    with open(store.summary_path, "w", encoding="utf-8") as handle:
        handle.write('{"state": "RUN')
    assert store.previous_summary() is None


def test_a_replay_is_written_where_replay_file_says(tmp_path):
    store = store_in(str(tmp_path))
    store.write_replay(4, {"actions": [[0, 1], [2, 3]]})
    with open(replay_file(str(tmp_path), 4), encoding="utf-8") as handle:
        assert json.load(handle) == {"actions": [[0, 1], [2, 3]]}


def test_a_fresh_start_removes_an_earlier_evaluation_and_only_that(tmp_path):
    earlier = store_in(str(tmp_path))
    earlier.add_episodes(item(0, [1.0]))
    earlier.write_summary({"state": "SUCCESS"})
    earlier.write_replay(0, {"actions": []})
    with open(earlier.events_path, "w", encoding="utf-8") as handle:
        handle.write("{}\n")
    (tmp_path / "results.csv.tmp.999").write_text("a write a kill cut short")
    (tmp_path / "notes.txt").write_text("the organiser's own file")
    store_in(str(tmp_path)).start_fresh()
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_resume_loads_the_whole_items_and_rebuilds_results_csv(tmp_path):
    earlier = store_in(str(tmp_path))
    earlier.add_episodes(item(0, [1.0]))
    earlier.add_episodes(item(1, [2.0, 3.0]))
    os.remove(earlier.csv_path)  # results.csv follows episodes.jsonl, the source of truth
    resumed = store_in(str(tmp_path))
    assert resumed.load_for_resume() == item(0, [1.0]) + item(1, [2.0, 3.0])
    assert [row["score"] for row in csv_rows(resumed)] == ["1.0", "2.0", "3.0"]
    # New items go after the loaded ones, in both files.
    resumed.add_episodes(item(2, [4.0]))
    assert [row["index"] for row in csv_rows(resumed)] == ["0", "1", "1", "2"]
    assert [record["index"] for record in read_records(resumed.episodes_path)] == [0, 1, 1, 2]


def test_resume_of_a_folder_without_records_loads_nothing(tmp_path):
    assert store_in(str(tmp_path)).load_for_resume() == []
    assert read_records(str(tmp_path / "episodes.jsonl")) == []


def test_withdraw_from_moves_the_later_items_to_replayed_and_keeps_the_earlier(tmp_path):
    store = store_in(str(tmp_path))
    for index in range(4):
        store.add_episodes(item(index, [float(index), float(index) + 0.5]))
    withdrawn = store.withdraw_from(2)
    assert withdrawn == item(2, [2.0, 2.5]) + item(3, [3.0, 3.5])
    assert [record["index"] for record in read_records(store.episodes_path)] == [0, 0, 1, 1]
    assert read_records(store.replayed_path) == withdrawn
    assert [row["index"] for row in csv_rows(store)] == ["0", "0", "1", "1"]
    # The items played again are appended as usual; replayed.jsonl keeps the withdrawn ones.
    store.add_episodes(item(2, [9.0]))
    assert [record["score"] for record in read_records(store.episodes_path)][-1] == 9.0
    assert read_records(store.replayed_path) == withdrawn


def test_a_folder_that_is_gone_raises_results_unwritable_and_is_remembered(tmp_path):
    folder = tmp_path / "results"
    store = store_in(str(folder))
    store.add_episodes(item(0, [1.0]))
    shutil.rmtree(folder)
    with pytest.raises(ResultsUnwritable, match=r"cannot be written \(episodes.jsonl: .*--resume"):
        store.add_episodes(item(1, [2.0]))
    assert isinstance(store.unwritable, ResultsUnwritable)
    first = store.unwritable
    with pytest.raises(ResultsUnwritable):
        store.write_summary({"state": "INTERRUPTED"})
    assert store.unwritable is first  # the first refusal is the evaluation's cause


def test_rows_appended_item_by_item_are_the_table_a_resume_rebuilds(tmp_path):
    store = store_in(str(tmp_path))
    for index in range(5):
        store.add_episodes(item(index, [float(index)] * (index % 3 + 1)))
    appended = Path(store.csv_path).read_bytes()
    assert appended.count(b"index,unit,score") == 1  # the header once, at the top
    resumed = store_in(str(tmp_path))
    resumed.load_for_resume()
    assert Path(resumed.csv_path).read_bytes() == appended


def test_a_results_csv_torn_mid_row_is_rebuilt_whole_by_the_resume(tmp_path):
    # results.csv's rows are not fsynced (episodes.jsonl's are): a power loss may cut it anywhere.
    store = store_in(str(tmp_path))
    for index in range(3):
        store.add_episodes(item(index, [1.5, 2.5]))
    whole = Path(store.csv_path).read_bytes()
    Path(store.csv_path).write_bytes(whole[: len(whole) - 7])
    resumed = store_in(str(tmp_path))
    assert len(resumed.load_for_resume()) == 6
    assert Path(resumed.csv_path).read_bytes() == whole


ADDER = """
import sys
sys.path.insert(0, {tests!r})
from test_results import item, store_in
store = store_in({folder!r})
store.start_fresh()
for index in range(100_000):
    if {during_sync!r}:  # as the evaluator ends an item with a step: its rows before the records' sync
        store.add_episodes(item(index, [float(index), 0.5]), rows_later=True, sync_later=True)
        store.write_due_rows(replied=True)
        store.wait_durable()
    else:
        store.add_episodes(item(index, [float(index), 0.5]))
    print(index, flush=True)  # the item is finished
"""


@pytest.mark.parametrize("during_sync", [False, True], ids=["synced-first", "rows-before-the-sync"])
@pytest.mark.parametrize("kill_after", [1, 7, 40, 150])
def test_a_sigkill_at_any_point_loses_no_finished_item(tmp_path, kill_after, during_sync):
    import signal
    import subprocess
    import sys

    folder = tmp_path / "r"
    code = ADDER.format(tests=str(Path(__file__).parent), folder=str(folder), during_sync=during_sync)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    finished = -1
    try:
        for line in child.stdout:
            finished = int(line)
            if finished + 1 >= kill_after:
                break
        os.kill(child.pid, signal.SIGKILL)  # in the middle of the items after it: wherever it is
    finally:
        child.kill()
        child.wait()
    resumed = store_in(str(folder))
    records = resumed.load_for_resume()
    indices = sorted({record["index"] for record in records})
    assert indices[: finished + 1] == list(range(finished + 1))  # every finished item, whole
    assert indices == list(range(len(indices)))  # and nothing torn or out of order after them
    assert all(sum(r["index"] == i for r in records) == 2 for i in indices)
    assert [int(row["index"]) for row in csv_rows(resumed)] == [record["index"] for record in records]


def test_an_item_is_on_the_disk_before_its_rows_reach_results_csv(tmp_path, monkeypatch):
    # The item's append is synced (fdatasync: its bytes and the file's size) with the item whole
    # in the file, before add_episodes writes the table and returns.
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0]))
    synced: list[tuple[str, bytes, int]] = []
    real_sync = os.fdatasync

    def recorded_sync(handle: int) -> None:
        path = os.readlink(f"/proc/self/fd/{handle}")
        with open(path, "rb") as opened:
            held = opened.read()
        synced.append((path, held, len(csv_rows(store))))
        real_sync(handle)

    monkeypatch.setattr(os, "fdatasync", recorded_sync)
    store.add_episodes(item(1, [2.0, 3.0]))
    assert [(path, rows) for path, _, rows in synced] == [(store.episodes_path, 1)]
    assert read_records(store.episodes_path) == item(0, [1.0]) + item(1, [2.0, 3.0])
    with open(store.episodes_path, "rb") as opened:
        assert synced[0][1] == opened.read()
    assert len(csv_rows(store)) == 3


def test_results_csv_is_written_as_the_csv_module_writes_a_table_of_its_columns(tmp_path):
    # Values that need quoting, a column a row lacks (empty), a key no column names (left out),
    # across rows appended one item at a time and a table rebuilt whole.
    columns = ["unit", "score", "note"]
    rows = [
        {"unit": "a,b", "score": 0.1 + 0.2, "note": 'said "hi"', "extra": 1},
        {"unit": "line\nbreak", "score": None, "note": ""},
        {"unit": "plain", "score": 1 / 3},
        {"unit": " spaced ", "score": -0.0, "note": True},
    ]
    store = ResultsStore(str(tmp_path), columns, lambda record: {k: v for k, v in record.items() if k != ITEM_END})
    for i, row in enumerate(rows):
        store.add_episodes([{**row, ITEM_END: True, "index": i}])
    assert Path(store.csv_path).read_text(encoding="utf-8") == dict_writer_table(columns, rows)
    store.withdraw_from(2)  # the table rebuilt whole from episodes.jsonl
    assert Path(store.csv_path).read_text(encoding="utf-8") == dict_writer_table(columns, rows[:2])


def dict_writer_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """``rows`` as the csv module's ``DictWriter`` writes a table of ``columns``, header first."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def test_rows_written_later_reach_results_csv_in_order_once_asked_for(tmp_path):
    # The service's way: an item's records are durable in episodes.jsonl before its reply, its
    # rows are appended to results.csv once that reply has gone.
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0, 2.0]), rows_later=True)
    assert read_records(store.episodes_path) == item(0, [1.0, 2.0])
    assert not os.path.exists(store.csv_path)
    store.write_due_rows()
    assert [row["index"] for row in csv_rows(store)] == ["0", "0"]
    store.write_due_rows()  # nothing due: nothing written twice
    assert len(csv_rows(store)) == 2

    # Rows still due when the next item comes are written before it.
    store.add_episodes(item(1, [3.0]), rows_later=True)
    store.add_episodes(item(2, [4.0]), rows_later=True)
    assert [row["index"] for row in csv_rows(store)] == ["0", "0", "1"]
    store.add_episodes(item(3, [5.0]))  # rows now: the item's, after those due
    assert [row["index"] for row in csv_rows(store)] == ["0", "0", "1", "2", "3"]
    assert [row["unit"] for row in csv_rows(store)] == [r["unit"] for r in read_records(store.episodes_path)]


def test_a_withdrawal_leaves_results_csv_whole_with_rows_still_due(tmp_path):
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0]), rows_later=True)
    store.add_episodes(item(1, [2.0]), rows_later=True)
    store.add_episodes(item(2, [3.0]), rows_later=True)
    assert [r["index"] for r in store.withdraw_from(2)] == [2]
    store.write_due_rows()
    assert [row["index"] for row in csv_rows(store)] == ["0", "1"]
    assert [r["index"] for r in read_records(store.episodes_path)] == [0, 1]


def test_an_append_in_two_halves_is_written_at_once_and_on_the_disk_when_it_finishes(tmp_path, monkeypatch):
    path = str(tmp_path / "log")
    synced: list[bytes] = []
    real_sync = durable.sync_data
    monkeypatch.setattr(
        durable, "sync_data", lambda handle: (synced.append(Path(path).read_bytes()), real_sync(handle))
    )
    first = durable.start_append(path, b"first\n")
    assert first.size == 0 and Path(path).read_bytes() == b"first\n" and synced == []  # written, not synced yet
    first.finish()
    assert synced == [b"first\n"] and first.took_s > 0
    second = durable.start_append(path, b"second\n")
    assert second.size == len(b"first\n")
    second.finish()
    assert Path(path).read_bytes() == b"first\nsecond\n"


def test_an_append_whose_sync_is_refused_is_taken_back(tmp_path, monkeypatch):
    path = str(tmp_path / "log")
    Path(path).write_bytes(b"kept\n")

    def refused(handle: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable, "sync_data", refused)
    pending = durable.start_append(path, b"lost\n")
    with pytest.raises(OSError, match="Input/output error"):
        pending.finish()
    assert Path(path).read_bytes() == b"kept\n"
    with pytest.raises(OSError):  # its handle is closed either way
        os.fstat(pending.handle)


def test_the_store_ends_a_refused_sync_with_results_unwritable_and_a_matching_table(tmp_path, monkeypatch):
    store = store_in(str(tmp_path))
    store.add_episodes(item(0, [1.0]))

    def refused(handle: int) -> None:
        raise OSError(errno.EIO, "gone")

    monkeypatch.setattr(durable, "sync_data", refused)
    store.add_episodes(item(1, [2.0]), rows_later=True, sync_later=True)
    store.write_due_rows(replied=True)  # the rows go out before the records' sync
    assert len(csv_rows(store)) == 2
    with pytest.raises(ResultsUnwritable, match="episodes.jsonl: gone"):
        store.wait_durable()
    assert store.unwritable is not None
    assert read_records(store.episodes_path) == item(0, [1.0])
    assert [row["index"] for row in csv_rows(store)] == ["0"]  # rebuilt from episodes.jsonl
    assert len(store.durable_s) == 1  # only the item that reached the disk was timed
