"""What an evaluation reports about itself: the record of a played item, per-step timing
statistics, and ``summary.json`` (server/evaluation.py owns the state these are made from)."""

from __future__ import annotations

import math
import platform
from typing import Any

from arbiter.protocol.messages import EXTENSION_KEY

# Fields the core adds to every record; a format's own fields of the same name win.
CORE_FIELDS = (
    "timed_out",
    "timeout",
    "abandoned",
    "skipped",
    "invalid_actions",
    "wall_s",
    "planning_s",
    "step_think_s",
    "time_bank_used_s",
    "debug",
    "elapsed_s",
    "client",
)


def stats(values: Any) -> dict[str, float] | None:
    if not len(values):
        return None
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "mean": math.fsum(ordered) / len(ordered),
        "p99": ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
        "max": ordered[-1],
    }


def versions(format_packages: tuple[str, ...] = ()) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("arbiter", "redis", "msgpack", "numpy", *format_packages):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


def core_fields(
    *,
    timeout: str | None,
    abandoned: bool,
    played: bool,
    debug: bool,
    elapsed_s: float,
    invalid_actions: int,
    wall_s: float,
    planning_s: float | None,
    step_think_s: dict[str, float] | None,
    time_bank_used_s: float,
    client: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The core's fields of an item's records: (for every record, for the item's last one)."""
    item_core = {
        "timed_out": timeout is not None,
        "timeout": timeout,
        "abandoned": abandoned,
        "skipped": not played,
        "invalid_actions": 0,
        "wall_s": None,
        "planning_s": None,
        "step_think_s": None,
        "time_bank_used_s": 0.0,
        "debug": debug,
        "elapsed_s": elapsed_s,  # overall budget used when it ended (for --resume)
        "client": client,  # the session of the client that played it (--resume: did that agent live on?)
    }
    last_core = dict(item_core)
    if played:
        last_core.update(
            invalid_actions=invalid_actions,
            wall_s=wall_s,
            planning_s=planning_s,
            step_think_s=step_think_s,
            time_bank_used_s=time_bank_used_s,
        )
    else:
        last_core["wall_s"] = 0.0
    return item_core, last_core


def merge_records(
    index: int, unit: str, format_records: list[dict[str, Any]], item_core: dict[str, Any], last_core: dict[str, Any]
) -> list[dict[str, Any]]:
    """The records of one item as written: ``index`` and ``unit`` (the item's key, which --resume
    checks), the format's fields, then the core's. Item-wide figures (wall time, think times,
    invalid actions, the bank) go on the item's last record only, so sums over records count
    them once; the others carry what is true of each record."""
    merged = []
    last = len(format_records) - 1
    for i, fields in enumerate(format_records):
        record: dict[str, Any] = {"index": index, "unit": unit, **fields}
        core = last_core if i == last else item_core
        for key in CORE_FIELDS:
            if key not in record:
                record[key] = core[key]
        merged.append(record)
    return merged


def counts(total: int, records: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "total": total,
        "recorded": len(records),
        "finished": sum(1 for r in records if not (r["timed_out"] or r["abandoned"] or r["skipped"])),
        "timed_out": sum(1 for r in records if r["timed_out"]),
        "abandoned": sum(1 for r in records if r["abandoned"]),
        "skipped": sum(1 for r in records if r["skipped"]),
    }


EMPTY_SCORE = {
    "primary": None,
    "secondary": None,
    "primary_name": None,
    "secondary_name": None,
    "per_test": None,
    "spread": None,
}


def summary(evaluation: Any) -> dict[str, Any]:
    end = evaluation.finished_at if evaluation.finished_at is not None else evaluation.clock()
    scores = evaluation.scores()
    records = evaluation.records
    plan = evaluation.plan
    return {
        "state": evaluation.state.value,
        "debug": evaluation.debug,
        "format": evaluation.format_name,
        "competition": evaluation.competition,
        "scoring": evaluation.rule.name,
        "service_id": evaluation.service_id,
        "score": scores if scores else dict(EMPTY_SCORE),
        "termination_cause": evaluation.termination_cause,
        "episodes": counts(len(evaluation.items), records),
        # The plan's items (an episode, or a training run of many episodes) and how many ended.
        "items": {"total": len(evaluation.items), "recorded": len({r["index"] for r in records})},
        "budgets": evaluation.budgets.as_dict(),
        "counters": dict(evaluation.counters),
        # Items taken out of the results and played again after an evaluator restart (their
        # records are in replayed.jsonl): which, and why.
        "replayed": list(evaluation.replayed),
        "timing": {
            "evaluation_s": evaluation.elapsed_s(end),
            "step_think_s": stats(evaluation.think_s),
            "server_step_s": stats(evaluation.server_step_s),
            "time_bank_used_s": stats([r.get("time_bank_used_s") or 0.0 for r in records if not r["skipped"]]),
        },
        "seed": plan.seed,
        "tests": plan.source,
        "options": evaluation.options,
        "client_version": evaluation.client_version,
        "started_at": evaluation.started_wall,
        "versions": versions(getattr(plan, "packages", ())),
    }


def submit_payload(evaluation: Any) -> dict[str, Any]:
    """The ENV_SUBMIT reply: the format's own submit figures (Flatland's four, for legacy
    clients), plus arbiter's full scores."""
    scores = evaluation.scores()
    return {
        **evaluation.plan.submit_fields(evaluation.records),
        "score": scores["primary"] if scores else None,
        "score_secondary": scores["secondary"] if scores else None,
        EXTENSION_KEY: {"state": evaluation.state.value, "debug": evaluation.debug, "scores": scores},
    }
