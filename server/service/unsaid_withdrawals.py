"""A withdrawal no event tells of: a resume killed after it took a group's records out of
``episodes.jsonl`` (into ``replayed.jsonl``) and before its ``replayed`` event reached
``events.jsonl``.

summary.json's ``replayed`` entries are read back from the events; each says how many records it
withdrew, and replayed.jsonl holds every record withdrawn, once (a withdrawal cut short before
episodes.jsonl was rewritten is done again by the next resume, which appends none of them twice
and says so itself). Records of replayed.jsonl beyond what the events account for, and no longer
in episodes.jsonl, were withdrawn by a run that was killed before it said so (or whose event the
disk refused): the next resume names them, as a ``replayed`` entry of its own, so summary.json,
events.jsonl and replayed.jsonl agree.
"""

from __future__ import annotations

import hashlib
from typing import Any

from arbiter.server.service.records_file import read_items

UNSAID_CAUSE = "the evaluator restarted; the run that took these items out to play them again ended before it said why"


def unsaid_withdrawal(replayed_path: str, episodes_path: str, said: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``replayed`` entry (without its ``group``) for the records of ``replayed_path`` that
    neither an entry of ``said`` accounts for nor ``episodes_path`` still holds; None when there
    are none."""
    held = read_items(replayed_path).items
    accounted = sum(entry.get("records") or 0 for entry in said if isinstance(entry.get("records"), int))
    unsaid = sum(len(item.records) for item in held) - accounted
    tail = []
    while unsaid > 0 and held:
        item = held.pop()
        tail.append(item)
        unsaid -= len(item.records)
    still_kept = {hashlib.sha256(item.data).digest() for item in read_items(episodes_path).items}
    gone = [item for item in tail if hashlib.sha256(item.data).digest() not in still_kept]
    if not gone or not all(isinstance(item.index, int) for item in gone):
        return None
    return {
        "items": sorted({item.index for item in gone}),
        "records": sum(len(item.records) for item in gone),
        "cause": UNSAID_CAUSE,
    }
