"""How a records file (``episodes.jsonl``, ``replayed.jsonl``) is read: whole items only.

An item's records reach the file in one write, its last record marked (``last_of_item``); a
crash can leave the start of one item after the last whole one, a torn tail every reader drops
and ``--resume`` cuts off. What a crash cannot leave (a damaged line with more after it, records
of several items past the last whole one) is damage, which a resume refuses to cut
(``torn_tail_problem``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# On every record written: true on its item's last record. Records written before arbiter marked
# items carry no such field and stand for themselves.
ITEM_END = "last_of_item"  # the core's own mark of an item's last record (core/summary.py)
LEGACY_ITEM_END = "item_end"  # the same mark in folders written before records carried it


@dataclass
class StoredItem:
    records: list[dict[str, Any]]  # as the evaluation made them
    data: bytes  # its lines, as written

    @property
    def index(self) -> Any:
        return self.records[0].get("index")


@dataclass
class ItemsFile:
    items: list[StoredItem] = field(default_factory=list)
    whole_bytes: int = 0  # the file's bytes that hold whole items; the rest is a torn tail
    size: int = 0
    damage: str | None = None  # why what follows the whole items is no torn tail (torn_tail_problem)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [record for item in self.items for record in item.records]


def read_items(path: str) -> ItemsFile:
    """The whole items of a records file (``episodes.jsonl``, ``replayed.jsonl``), in order.

    Reading stops at the first line that is cut or not a JSON object, and at a record that
    cannot belong to the item being read (another index, or an unmarked record inside an
    item): what follows the last whole item is a torn tail, however many complete lines it
    holds. A missing file has no items."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return ItemsFile()
    found = ItemsFile(size=len(data))
    pending: list[dict[str, Any]] = []
    item_start = start = 0
    while (end := data.find(b"\n", start)) >= 0:
        try:
            record = json.loads(data[start:end])
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        end_mark = record.get(ITEM_END, record.pop(LEGACY_ITEM_END, None))
        if pending and (end_mark is None or record.get("index") != pending[0].get("index")):
            break
        pending.append(record)
        start = end + 1
        if end_mark is None or end_mark is True:
            found.items.append(StoredItem(pending, data[item_start:start]))
            pending, item_start = [], start
    found.whole_bytes = item_start
    if item_start != len(data):
        found.damage = torn_tail_problem(data[item_start:])
    return found


def torn_tail_problem(tail: bytes) -> str | None:
    """Why ``tail`` (what follows the last whole item) is not what a crash leaves, or None.

    An item's records reach the file in one write, so a crash leaves at most the start of one
    item: complete records of a single index none of which ends it, then perhaps a cut line.
    Anything else (a damaged line with lines after it, records of another index) is damage."""
    lines = tail.split(b"\n")
    complete, last = lines[:-1], lines[-1]  # ``last`` is empty when the tail ends with a newline
    indices = set()
    for number, line in enumerate(complete, 1):
        try:
            record = json.loads(line)
        except ValueError:
            return f"line {number} after the last whole item is not valid JSON, and more follows it"
        if not isinstance(record, dict):
            return f"line {number} after the last whole item is not a record"
        indices.add(record.get("index"))
    if len(indices) > 1:
        return f"the lines after the last whole item hold records of {len(indices)} items"
    del last  # a cut line: what a crash leaves
    return None


def read_records(path: str) -> list[dict[str, Any]]:
    """The records of every whole item of ``path``: what resume, scoring and the tests read."""
    return read_items(path).records


def item_lines(records: list[dict[str, Any]]) -> bytes:
    """One item's records as written: a JSON line each, the last one marked."""
    last = len(records) - 1
    return "".join(
        json.dumps({**record, ITEM_END: i == last}, separators=(",", ":"), allow_nan=False) + "\n"
        for i, record in enumerate(records)
    ).encode()


# -- writing ------------------------------------------------------------------------------------
