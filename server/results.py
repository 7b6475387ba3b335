"""The results folder: each finished episode is written durably before anything else happens.

- ``episodes.jsonl``: one JSON object per finished episode, appended, flushed and fsynced (the
  source of truth);
- ``results.csv``: the format's columns (Flatland: the test set's metadata columns plus
  flatland's result columns), one row per record, rewritten atomically (temp file + rename);
- ``summary.json``: the evaluation's state and scores, rewritten atomically;
- ``events.jsonl``: the progress events (server/events.py), informational only;
- ``replays/episode-<index>.json``: the actions of recorded episodes (server/recording.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

REPLAYS_DIR = "replays"


def replay_file(directory: str, index: int) -> str:
    """Where the actions of recorded episode ``index`` are kept in a results folder."""
    return os.path.join(directory, REPLAYS_DIR, f"episode-{index}.json")


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class ResultsStore:
    def __init__(self, directory: str, csv_columns: list[str], csv_row: Callable[[dict[str, Any]], dict[str, Any]]):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.episodes_path = os.path.join(directory, "episodes.jsonl")
        self.csv_path = os.path.join(directory, "results.csv")
        self.summary_path = os.path.join(directory, "summary.json")
        self.events_path = os.path.join(directory, "events.jsonl")
        self.replays_dir = os.path.join(directory, REPLAYS_DIR)
        self.csv_columns = csv_columns
        self._csv_row = csv_row
        self._csv_rows: list[dict[str, Any]] = []

    def start_fresh(self) -> None:
        """A new evaluation: earlier results in this folder would mix with ours."""
        for path in (self.episodes_path, self.csv_path, self.summary_path, self.events_path):
            if os.path.exists(path):
                os.remove(path)
        shutil.rmtree(self.replays_dir, ignore_errors=True)
        self._csv_rows = []

    def load_for_resume(self) -> list[dict[str, Any]]:
        """The finished episodes of an earlier, killed run; a torn last line is cut off.

        A SIGKILL can land in the middle of an append: every complete line ends with a newline
        and parses, so the file is truncated after the last such line.
        """
        if not os.path.exists(self.episodes_path):
            return []
        records: list[dict[str, Any]] = []
        good_bytes = 0
        with open(self.episodes_path, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                try:
                    records.append(json.loads(line))
                except ValueError:
                    break
                good_bytes += len(line)
        if good_bytes != os.path.getsize(self.episodes_path):
            with open(self.episodes_path, "r+b") as handle:
                handle.truncate(good_bytes)
                handle.flush()
                os.fsync(handle.fileno())
        self._csv_rows = [self._csv_row(record) for record in records]
        self._write_csv()
        return records

    def previous_summary(self) -> dict[str, Any] | None:
        try:
            with open(self.summary_path, encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def add_episode(self, record: dict[str, Any]) -> None:
        self.add_episodes([record])

    def add_episodes(self, records: list[dict[str, Any]]) -> None:
        """One item's records (a training run may hold hundreds): appended and fsynced together,
        and results.csv rewritten once."""
        lines = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records)
        with open(self.episodes_path, "a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())
        self._csv_rows.extend(self._csv_row(r) for r in records)
        self._write_csv()

    def _write_csv(self) -> None:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.csv_columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self._csv_rows)
        _atomic_write(self.csv_path, out.getvalue())

    def write_replay(self, index: int, replay: dict[str, Any]) -> None:
        """Atomically, so ``arbiter replay`` never reads half a file of a running evaluation."""
        os.makedirs(self.replays_dir, exist_ok=True)
        _atomic_write(
            replay_file(self.directory, index), json.dumps(replay, separators=(",", ":"), allow_nan=False) + "\n"
        )

    def write_summary(self, summary: dict[str, Any]) -> None:
        _atomic_write(self.summary_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
