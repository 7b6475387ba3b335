"""Where a killed evaluation continues (``arbiter serve --resume``), from its results folder.

An item's records are written together when the item ends, so the folder holds whole items: the
evaluation continues with the first item that has none. An item cut by the kill (a training run
half done) left none and is played again from its start. The folder must belong to the same
plan: its items' keys (``unit``) must be the plan's first ones, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arbiter.protocol.errors import ConfigError

from .formats.base import Item


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
        if unit != item.key:
            raise ConfigError(
                f"the results folder does not belong to this test set or plan: item {index} "
                f"is {unit!r} there, {item.key!r} here"
            )
    successive = 0
    for record in reversed(records):
        if not record["timed_out"]:
            break
        successive += 1
    used = float(records[-1].get("elapsed_s") or 0.0) if records else 0.0
    return ResumePoint(items_done=len(units), used_before_s=used, successive_timeouts=successive)
