"""The results folder: each finished item is written durably before anything else happens.

- ``episodes.jsonl``: one JSON object per record (an item's records: one episode, or a training
  run's many), the source of truth. An item is appended whole in one write and synced to the
  disk (``fdatasync``: its bytes and the file's size); every record carries its item's
  ``index``, and ``last_of_item`` (true on the item's last record only), so ``read_items`` keeps
  an item only once its last record is there: an append cut short by a kill, a full disk or a
  power loss leaves a torn tail that every reader drops (``--resume`` cuts it off the file);
- ``results.csv``: the format's columns (Flatland: the test set's metadata columns plus
  flatland's result columns), one row per record: episodes.jsonl's table, appended item by item
  and rebuilt from it whole (temp file + rename) by a resume or a withdrawal;
- ``summary.json``: the evaluation's state and scores, rewritten atomically;
- ``replayed.jsonl``: the records of items withdrawn to be played again (``withdraw_from``), as
  they were in ``episodes.jsonl``, kept for the record;
- ``events.jsonl``: the progress events (events.py), informational only;
- ``replays/episode-<index>.json``: the actions of recorded episodes (formats/flatland/recording.py).

The writes that must survive a power loss are durable.py's.

A folder that cannot be written (full, read-only) raises ``ResultsUnwritable`` and leaves what
it held as it was: no temporary file, no part of an item.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import json
import logging
import os
import shutil
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from arbiter.protocol.errors import ConfigError, EvaluationError
from arbiter.server.core.words import resume_command
from arbiter.server.service import results_fence
from arbiter.server.service.durable import PendingAppend, append_synced, atomic_write, cut_to, start_append
from arbiter.server.service.records_file import ItemsFile, StoredItem, item_lines, read_items, read_records

log = logging.getLogger(__name__)

REPLAYS_DIR = "replays"
EPISODES_FILE = "episodes.jsonl"
REPLAYED_FILE = "replayed.jsonl"


class ResultsUnwritable(EvaluationError):
    """The results folder cannot be written (full, read-only, gone). The evaluation stops as
    INTERRUPTED with this cause; ``--resume`` continues it once the folder can be written."""

    def __init__(self, name: str, error: OSError, resume: str):
        reason = error.strerror or str(error)
        super().__init__(
            f"the results folder cannot be written ({name}: {reason}): the evaluation stops here; "
            f"{resume} continues it once the folder can be written again"
        )


class ResultsFenced(ResultsUnwritable):
    """This process may no longer write the results folder (results_fence.py): a hosted attempt
    that lost its hold on its submission, which another attempt may be evaluating there."""

    def __init__(self, reason: str):
        EvaluationError.__init__(self, f"the results folder is no longer this evaluation's to write: {reason}")


def replay_file(directory: str, index: int) -> str:
    """Where the actions of recorded episode ``index`` are kept in a results folder."""
    return os.path.join(directory, REPLAYS_DIR, f"episode-{index}.json")


class _Pieces:
    """A file for ``csv.writer`` that keeps what is written in ``pieces``."""

    def __init__(self, pieces: list[str]):
        self.write = pieces.append


class ResultsStore:
    def __init__(self, directory: str, csv_columns: list[str], csv_row: Callable[[dict[str, Any]], dict[str, Any]]):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.episodes_path = os.path.join(directory, EPISODES_FILE)
        self.csv_path = os.path.join(directory, "results.csv")
        self.summary_path = os.path.join(directory, "summary.json")
        self.events_path = os.path.join(directory, "events.jsonl")
        self.replayed_path = os.path.join(directory, REPLAYED_FILE)
        self.replays_dir = os.path.join(directory, REPLAYS_DIR)
        self.csv_columns = csv_columns
        self._csv_row = csv_row
        # One CSV writer for the store's life, writing into a list: results.csv gets a row or two
        # at the end of every item, and a writer made for each costs more than the rows.
        self._csv_pieces: list[str] = []
        self._csv_writer = csv.writer(_Pieces(self._csv_pieces), lineterminator="\n")
        # The first write the folder refused: the evaluation ends with it as its cause.
        self.unwritable: ResultsUnwritable | None = None
        self.command: str | None = None  # the command that runs the evaluation: its messages name its resume
        # Records in episodes.jsonl whose rows results.csv is still to get (``write_due_rows``).
        self._rows_due: list[dict[str, Any]] = []
        # What making each item durable took (its append and the disk's sync): summary.json's
        # ``record_durable_s``, where a slow disk under the results shows.
        self.durable_s = array("d")
        # An item's record written, its sync still to come (``add_episodes(sync_later=True)``).
        self._pending: PendingAppend | None = None

    def _fence_refused(self) -> ResultsFenced | None:
        """Why this process may not write the folder now (results_fence.py), remembered like a
        write the folder refused, so that the evaluation stops; None when it may."""
        reason = results_fence.refusal()
        if reason is None:
            return None
        error = ResultsFenced(reason)
        if self.unwritable is None:
            self.unwritable = error
        return error

    @contextlib.contextmanager
    def _writing(self, path: str, remember: bool = True, fenced: bool = True) -> Iterator[None]:
        """A failure to write ``path`` raised as ResultsUnwritable, and remembered (``remember``);
        ``fenced``: the write is refused (ResultsFenced) when this process may no longer write here."""
        refused = self._fence_refused() if fenced else None
        if refused is not None:
            raise refused
        try:
            yield
        except OSError as exc:
            error = ResultsUnwritable(os.path.basename(path), exc, resume_command(self.command))
            if remember and self.unwritable is None:
                self.unwritable = error
            raise error from exc

    def _remove_temporaries(self) -> None:
        """Temp files of writes a kill cut short (no evaluator writes this folder now)."""
        for folder in (self.directory, self.replays_dir):
            for tmp in glob.glob(os.path.join(glob.escape(folder), "*.tmp.*")):
                with contextlib.suppress(OSError):
                    os.remove(tmp)

    def start_fresh(self) -> None:
        """A new evaluation: earlier results in this folder would mix with ours."""
        with self._writing(self.directory):
            for path in (self.episodes_path, self.csv_path, self.summary_path, self.events_path, self.replayed_path):
                if os.path.exists(path):
                    os.remove(path)
            shutil.rmtree(self.replays_dir, ignore_errors=True)
            self._remove_temporaries()

    def read_for_resume(self) -> list[dict[str, Any]]:
        """The records of the whole items of an earlier, killed run, read only: what a resume
        checks before it writes anything (``load_for_resume`` writes). Damage is refused."""
        return self._resumable().records

    def _resumable(self) -> ItemsFile:
        stored = read_items(self.episodes_path)
        if stored.whole_bytes != stored.size and stored.damage is not None:
            raise ConfigError(
                f"{self.episodes_path} is damaged after its {len(stored.items)} whole items ({stored.damage}): "
                "a crash leaves at most a cut last item, so --resume cuts nothing here; restore the file, "
                "or evaluate again in a new --results folder"
            )
        return stored

    def load_for_resume(self) -> list[dict[str, Any]]:
        """The records of the whole items of an earlier, killed run; a torn tail (an item whose
        last record never made it, a cut line) is cut off the file first, and results.csv is
        rebuilt from them."""
        stored = self._resumable()
        with self._writing(self.episodes_path):
            self._remove_temporaries()
            if not os.path.exists(self.episodes_path):
                return []
            if stored.whole_bytes != stored.size:
                log.warning(
                    "%s ends with %d bytes of an item that was never written whole: cut off",
                    self.episodes_path,
                    stored.size - stored.whole_bytes,
                )
                cut_to(self.episodes_path, stored.whole_bytes)
        records = stored.records
        self._write_csv([self._csv_row(record) for record in records])
        return records

    def previous_summary(self) -> dict[str, Any] | None:
        try:
            with open(self.summary_path, encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def add_episode(self, record: dict[str, Any]) -> None:
        self.add_episodes([record])

    def add_episodes(
        self, records: list[dict[str, Any]], *, rows_later: bool = False, sync_later: bool = False
    ) -> None:
        """One item's records (a training run holds many): appended to episodes.jsonl in one
        write and synced to the disk, then their rows to results.csv. Either both happen or
        neither does. ``rows_later``: the rows wait for ``write_due_rows``, which the service
        calls once the item's reply has gone (and which comes before another item's records).
        ``sync_later``: the records are written and on their way to the disk; ``wait_durable``
        ends their sync, and the caller's work in between overlaps the disk's.

        results.csv is episodes.jsonl's table and is rebuilt from it whenever an evaluation
        resumes or takes items back, so its rows are appended without an fsync of their own:
        a process killed at any point leaves what it wrote in the page cache, and a machine
        that loses power loses at most rows that the resume writes again."""
        if not records:
            return
        self.wait_durable()
        self.write_due_rows()
        rows = [] if rows_later else [self._csv_row(record) for record in records]
        lines = item_lines(records)
        with self._writing(self.episodes_path):
            if sync_later:
                self._pending = start_append(self.episodes_path, lines)
                size_before = self._pending.size
            else:
                began = time.perf_counter()
                size_before = append_synced(self.episodes_path, lines)
                self.durable_s.append(time.perf_counter() - began)
        if rows_later:
            self._rows_due.extend(records)
            return
        try:
            self._append_csv(rows)
        except ResultsFenced:
            self._drop_pending()  # the folder is no longer ours to mend
            raise
        except ResultsUnwritable:
            self._drop_pending()
            cut_to(self.episodes_path, size_before)  # results.csv lacks the item: so must episodes.jsonl
            raise

    def wait_durable(self) -> None:
        """The records ``add_episodes(sync_later=True)`` wrote, on the disk when this returns. A
        sync the disk refuses takes them back (episodes.jsonl ends where it ended before), and
        results.csv too, rebuilt from episodes.jsonl if their rows went out meanwhile; then
        ResultsUnwritable."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with self._writing(self.episodes_path, fenced=False):  # its write was allowed: the sync ends it
            try:
                pending.finish()
            except OSError:
                self._rows_due = []
                with contextlib.suppress(OSError, ValueError):  # the disk that refused the sync may refuse this too
                    rows = [self._csv_row(record) for record in read_records(self.episodes_path)]
                    atomic_write(self.csv_path, self._csv_text(rows, header=True))
                raise
        self.durable_s.append(pending.took_s)

    def _drop_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            os.close(pending.handle)

    def write_due_rows(self, *, replied: bool = False) -> None:
        """The rows of the items added with ``rows_later``, appended to results.csv; their items
        stand whatever happens here (durable in episodes.jsonl). A refusal keeps the rows due and
        raises ResultsUnwritable: the evaluation stops, the cause the reply to the request being
        handled. ``replied``: the replies have gone, no request would carry the cause, so it is
        logged; the rows are written again before the next item's records and at the end."""
        if not self._rows_due:
            return
        try:
            self._append_csv([self._csv_row(record) for record in self._rows_due], remember=not replied)
        except ResultsUnwritable as exc:
            if not replied:
                raise
            log.warning("results.csv refused the rows due (%d): %s", len(self._rows_due), exc.__cause__ or exc)
            return
        self._rows_due = []

    def withdraw_from(self, index: int) -> list[dict[str, Any]]:
        """Take the records of every item from ``index`` on out of the results; returns them.

        They are appended to replayed.jsonl first (one write, synced), then episodes.jsonl and
        results.csv are rewritten without them (temp file, fsync, rename, fsync of the folder):
        a crash at any point leaves them in episodes.jsonl, where resume and scoring read them,
        or out of it, never in part. One that left them in both files costs nothing more: an
        item already in replayed.jsonl, byte for byte, is not appended again."""
        self.write_due_rows()
        stored = read_items(self.episodes_path)
        kept: list[StoredItem] = []
        withdrawn: list[StoredItem] = []
        for item in stored.items:
            (withdrawn if isinstance(item.index, int) and item.index >= index else kept).append(item)
        if not withdrawn and stored.whole_bytes == stored.size:
            return []
        with self._writing(self.replayed_path):
            self._keep_replayed(withdrawn)
        with self._writing(self.episodes_path):
            atomic_write(self.episodes_path, b"".join(item.data for item in kept), sync_folder=True)
        rows = [self._csv_row(record) for item in kept for record in item.records]
        self._write_csv(rows, sync_folder=True)
        return [record for item in withdrawn for record in item.records]

    def _keep_replayed(self, items: list[StoredItem]) -> None:
        """Append ``items`` to replayed.jsonl, but those it already holds (from a withdrawal a
        crash cut short), after cutting off a torn tail of its own."""
        held = read_items(self.replayed_path)
        if held.whole_bytes != held.size:
            cut_to(self.replayed_path, held.whole_bytes)
        present = {hashlib.sha256(item.data).digest() for item in held.items}
        new = b"".join(item.data for item in items if hashlib.sha256(item.data).digest() not in present)
        if new:
            append_synced(self.replayed_path, new)

    def _csv_text(self, rows: list[dict[str, Any]], header: bool) -> str:
        """``rows`` as results.csv lines, each a row's values in the columns' order (a column a
        row lacks is empty, a key no column names is left out), with the header first if asked."""
        columns, pieces, writer = self.csv_columns, self._csv_pieces, self._csv_writer
        try:
            if header:
                writer.writerow(columns)
            writer.writerows([[row.get(column, "") for column in columns] for row in rows])
            return "".join(pieces)
        finally:
            pieces.clear()

    def _write_csv(self, rows: list[dict[str, Any]], sync_folder: bool = False) -> None:
        with self._writing(self.csv_path):
            atomic_write(self.csv_path, self._csv_text(rows, header=True), sync_folder=sync_folder)

    def _append_csv(self, rows: list[dict[str, Any]], remember: bool = True) -> None:
        """``rows`` at the end of results.csv (with the header first in a new file) in one
        write; one the disk cuts short is taken back."""
        with self._writing(self.csv_path, remember):
            handle = os.open(self.csv_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                size = os.fstat(handle).st_size
                view = memoryview(self._csv_text(rows, header=size == 0).encode())
                try:
                    while view:
                        view = view[os.write(handle, view) :]
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(handle, size)
                    raise
            finally:
                os.close(handle)

    def write_replay(self, index: int, replay: dict[str, Any]) -> None:
        """Atomically, so ``arbiter replay`` never reads half a file of a running evaluation.
        A failure is the recorder's to count (an OSError): the evaluation does not need it."""
        refused = self._fence_refused()
        if refused is not None:
            raise OSError(str(refused))  # the evaluation stops at the end of this request all the same
        os.makedirs(self.replays_dir, exist_ok=True)
        atomic_write(
            replay_file(self.directory, index), json.dumps(replay, separators=(",", ":"), allow_nan=False) + "\n"
        )

    def write_summary(self, summary: dict[str, Any]) -> None:
        with self._writing(self.summary_path):
            atomic_write(self.summary_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
