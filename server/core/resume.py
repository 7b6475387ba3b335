"""Where a killed evaluation continues (``arbiter serve --resume``), from its results folder.

An item's records are written together when the item ends, so the folder holds whole items: the
evaluation continues with the first item that has none. An item cut by the kill (a training run
half done) left none and is played again from its start. The folder must belong to the same
plan: its items' keys (``unit``) must be the plan's first ones, in order.

Items of one group (``Item.group``: a training run and its evaluation episodes, a MetaLC fold)
depend on the agent's state from the group's first item on. When the agent that built that
state is gone, the evaluation goes back to the group's first item (server/evaluation_restarts.py
decides when); ``group_bounds`` says where a group starts and ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.budgets import Wait
from arbiter.server.formats.base import Item

if TYPE_CHECKING:
    from arbiter.server.core.evaluation import Evaluation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    items_done: int
    used_before_s: float  # overall budget used by the earlier runs
    successive_timeouts: int  # the timeouts in a row the earlier runs ended with


def resume_point(records: list[dict[str, Any]], items: list[Item]) -> ResumePoint:
    units: list[str] = []
    for record in records:
        unit = str(record.get("unit", record.get("env")))  # results written before units existed
        if not units or units[-1] != unit:
            units.append(unit)
    if len(units) > len(items):
        raise ConfigError(f"the results folder holds {len(units)} items; this plan has {len(items)}")
    for index, (unit, item) in enumerate(zip(units, items, strict=False)):
        if unit != item.unit:
            raise ConfigError(
                f"the results folder does not belong to this test set or plan: item {index} "
                f"is {unit!r} there, {item.unit!r} here"
            )
    successive = 0
    for record in reversed(records):
        if not record["timed_out"]:
            break
        successive += 1
    used = float(records[-1].get("elapsed_s") or 0.0) if records else 0.0
    return ResumePoint(items_done=len(units), used_before_s=used, successive_timeouts=successive)


def group_bounds(items: list[Item], index: int) -> tuple[int, int]:
    """The items ``[start, end)`` of ``items[index]``'s group (``(index, index + 1)`` for an item
    that stands alone); a group's items are consecutive in the plan."""
    group = items[index].group
    if group is None:
        return index, index + 1
    start = index
    while start > 0 and items[start - 1].group == group:
        start -= 1
    end = index + 1
    while end < len(items) and items[end].group == group:
        end += 1
    return start, end


def restore(evaluation: Evaluation, records: list[dict[str, Any]], earlier: dict[str, Any] | None = None) -> None:
    """Continue a killed evaluation after its last finished item (``--resume``). ``earlier``:
    the summary the last run to end wrote (a stop), whose counters this run's add to; a run
    killed outright wrote none, and its counters are lost with it."""
    point = resume_point(records, evaluation.items)
    counted = (earlier or {}).get("counters")
    for name, count in counted.items() if isinstance(counted, dict) else ():
        if isinstance(count, int) and not isinstance(count, bool):
            evaluation.counters[name] += count
    evaluation.records = list(records)
    evaluation.next_index = point.items_done
    if point.items_done >= evaluation.total:  # every item on record: only the submit was missing
        evaluation.wait = Wait.SUBMIT
    evaluation.used_before_s = point.used_before_s
    evaluation.successive_timeouts = point.successive_timeouts
    evaluation.counters["resumed"] += 1
    evaluation.restarted = evaluation.server_side
    evaluation.previous_client = next((r.get("client") for r in reversed(records) if not r.get("skipped")), None)
    log.info(
        "resuming after %d finished items (%.1f s of the overall budget used)", point.items_done, point.used_before_s
    )
