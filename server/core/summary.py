"""What an evaluation reports about itself: the record of a played item, per-step timing
statistics, and ``summary.json`` (server/evaluation.py owns the state these are made from)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import math
import platform
from dataclasses import dataclass
from typing import Any

from arbiter.protocol.messages import EXTENSION_KEY

# How an item ended: the one vocabulary of every record (``ended``), every format alike. The core
# decides it from how the item's play stopped; a format may only say that an item that finished
# was stopped by its own limit (a cap on steps) rather than by its env.
FINISHED = "finished"  # the item's env (or the format's own rule, e.g. a training run that converged) ended it
STEP_LIMIT = "step_limit"  # the format's own cap on the item (its step limit) cut it short
PLANNING_TIMEOUT = "planning_timeout"  # the agent took longer than the planning budget for its first step
STEP_TIMEOUT = "step_timeout"  # ... than the step budget (and its time bank) for a step
STAGE_TIMEOUT = "stage_timeout"  # ... than the item's stage budget for the whole item
ABANDONED = "abandoned"  # left before its end: the agent reset, or the evaluation ended early
NOT_PLAYED = "not_played"  # never handed out (the evaluation ended before it)
ENDINGS = (FINISHED, STEP_LIMIT, PLANNING_TIMEOUT, STEP_TIMEOUT, STAGE_TIMEOUT, ABANDONED, NOT_PLAYED)
TIMEOUT_ENDINGS = {"planning": PLANNING_TIMEOUT, "step": STEP_TIMEOUT, "stage": STAGE_TIMEOUT}
# What the endings read as in the lines and pages people read.
ENDING_TEXT = {
    FINISHED: "finished",
    STEP_LIMIT: "stopped at the step limit",
    PLANNING_TIMEOUT: "planning budget ran out",
    STEP_TIMEOUT: "step budget ran out",
    STAGE_TIMEOUT: "stage budget ran out",
    ABANDONED: "left before its end",
    NOT_PLAYED: "not played",
}


def ending(
    *, finished: bool, timeout: str | None, abandoned: bool, played: bool = True, limit_reached: bool = False
) -> str:
    """How an item ended, from how its play stopped (``limit_reached``: the format's own cap
    stopped an item that otherwise finished)."""
    if not played:
        return NOT_PLAYED
    if timeout is not None:
        if timeout not in TIMEOUT_ENDINGS:
            raise ValueError(f"unknown timeout {timeout!r}; the core's budgets are {sorted(TIMEOUT_ENDINGS)}")
        return TIMEOUT_ENDINGS[timeout]
    if finished:
        return STEP_LIMIT if limit_reached else FINISHED
    return ABANDONED


def killed_at_memory_limit(limit: str, *, confirmed: bool) -> str:
    """How an agent ended that its container's memory limit killed, for the evaluation's cause
    (its exit status alone says only "137"). ``confirmed``: the container engine says so; else the
    agent died of a SIGKILL arbiter did not send, which inside its container only the kernel's
    out-of-memory killer sends, unless the agent killed itself."""
    if confirmed:
        return f"the agent was killed at its memory limit of {limit}"
    return f"the agent was killed by SIGKILL, most likely at its memory limit of {limit}"


def timeout_of(ended: str) -> str | None:
    """The budget that ran out, for an item that timed out (``"step"``, ...), else None."""
    return next((kind for kind, name in TIMEOUT_ENDINGS.items() if name == ended), None)


# Fields the core adds to every record. ``index``, ``unit``, ``ended`` and ``last_of_item`` are the
# core's alone; on the others a format's own field of the same name wins (a training run says
# which of its episodes a timeout cut short with its own ``timed_out``).
CORE_FIELDS = (
    "ended",
    "last_of_item",
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


OWNED = ("ended", "last_of_item")  # the core's alone: a format's field of these names never wins


@dataclass(frozen=True)
class RecordCore:
    """The core's part of one item's records. ``timed_out``, ``timeout``, ``abandoned`` and
    ``skipped`` restate ``ended`` for the readers of results folders that filter on them. The
    item-wide figures (invalid actions, wall time, planning and think times, the bank) are on the
    item's last record only, so sums over records count them once."""

    ended: str
    debug: bool
    elapsed_s: float  # overall budget used when the item ended (for --resume)
    client: str | None  # the session of the client that played it (--resume: did that agent live on?)
    invalid_actions: int = 0
    wall_s: float | None = None
    planning_s: float | None = None
    step_think_s: dict[str, float] | None = None
    time_bank_used_s: float = 0.0

    @property
    def timeout(self) -> str | None:
        return timeout_of(self.ended)

    def fields(self, *, last_of_item: bool) -> dict[str, Any]:
        return {
            "ended": self.ended,
            "last_of_item": last_of_item,
            "timed_out": self.timeout is not None,
            "timeout": self.timeout,
            "abandoned": self.ended == ABANDONED,
            "skipped": self.ended == NOT_PLAYED,
            "invalid_actions": self.invalid_actions,
            "wall_s": self.wall_s,
            "planning_s": self.planning_s,
            "step_think_s": self.step_think_s,
            "time_bank_used_s": self.time_bank_used_s,
            "debug": self.debug,
            "elapsed_s": self.elapsed_s,
            "client": self.client,
        }


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
) -> tuple[RecordCore, RecordCore]:
    """The core's part of an item's records: (for every record, for the item's last one)."""
    ended = ending(finished=not abandoned and timeout is None, timeout=timeout, abandoned=abandoned, played=played)
    item_core = RecordCore(ended=ended, debug=debug, elapsed_s=elapsed_s, client=client)
    if not played:
        return item_core, dataclasses.replace(item_core, wall_s=0.0)
    last_core = dataclasses.replace(
        item_core,
        invalid_actions=invalid_actions,
        wall_s=wall_s,
        planning_s=planning_s,
        step_think_s=step_think_s,
        time_bank_used_s=time_bank_used_s,
    )
    return item_core, last_core


def settled_ending(said: Any, core: str, unit: str) -> str:
    """The ending of an item whose record says ``said``: the core's, or the one refinement a
    format may make (its own limit stopped an item that finished). Anything else is a fault of
    the format, said with the item it happened on."""
    if said is None or said == core:
        return core
    if said == STEP_LIMIT and core == FINISHED:
        return STEP_LIMIT
    raise ValueError(
        f"item {unit!r}: the format's record says ended={said!r}, but the item ended {core!r}; a format may "
        f"only say {STEP_LIMIT!r} for an item that finished (endings: {', '.join(ENDINGS)})"
    )


def merge_records(
    index: int, unit: str, format_records: list[dict[str, Any]], item_core: RecordCore, last_core: RecordCore
) -> list[dict[str, Any]]:
    """The records of one item as written: ``index`` and ``unit`` (the item's key, which --resume
    checks), the format's fields, then the core's (``RecordCore``); ``last_of_item`` marks the
    item's last record, which alone carries the item-wide figures."""
    if not format_records:
        raise ValueError(f"item {unit!r}: the format gave no record (every item has at least one)")
    ended = settled_ending(format_records[-1].get("ended"), item_core.ended, unit)
    every = item_core.fields(last_of_item=False)
    every["ended"] = ended
    last = last_core.fields(last_of_item=True)
    last["ended"] = ended
    merged = []
    final = len(format_records) - 1
    for i, fields in enumerate(format_records):
        settled_ending(fields.get("ended"), item_core.ended, unit)
        record: dict[str, Any] = {"index": index, "unit": unit, **fields}
        core = last if i == final else every
        for key in CORE_FIELDS:
            if key in OWNED or key not in record:
                record[key] = core[key]
        merged.append(record)
    return merged


def items_ended(records: list[dict[str, Any]]) -> dict[str, int]:
    """How many items ended each way (each item counted once, at its last record)."""
    found = collections.Counter(r.get("ended") for r in records if r.get("last_of_item", True))
    return {name: found[name] for name in ENDINGS if found[name]}


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


def leaderboard(rule: Any, records: list[dict[str, Any]], score: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json's ``leaderboard``: every figure a leaderboard column may show and the fields
    that describe the evaluation beside them, as the scoring rule makes them from its score (an
    evaluation without a score has no figures)."""
    if not score:
        return {"figures": [], "context": {}}
    return {"figures": rule.figures(records, score), "context": rule.context(records, score)}


def iso_utc(unix_time: float) -> str:
    """A submission's time as summary.json writes it: ISO-8601, UTC, to the millisecond (a board
    places equal submissions by it: two made within one second keep their order)."""
    return datetime.datetime.fromtimestamp(unix_time, datetime.UTC).isoformat(timespec="milliseconds")


def submission_identity(*, participant: str, submission_id: str, submitted_at: str, debug: bool) -> dict[str, Any]:
    """summary.json's ``submission``: who the evaluation is for (``submitted_at`` ISO-8601 UTC)."""
    return {"participant": participant, "id": submission_id, "submitted_at": submitted_at, "debug": debug}


def summary(evaluation: Any) -> dict[str, Any]:
    """summary.json. Written when the evaluation ends, never per step: its figures come from the
    score computed here once."""
    end = evaluation.finished_at if evaluation.finished_at is not None else evaluation.clock()
    scores = evaluation.scores()
    records = evaluation.records
    plan = evaluation.plan
    identity = {"submission": dict(evaluation.submission)} if evaluation.submission else {}
    return {
        "state": evaluation.state.value,
        "debug": evaluation.debug,
        "format": evaluation.format_name,
        "competition": evaluation.competition,
        "scoring": evaluation.rule.name,
        "service_id": evaluation.service_id,
        **identity,
        "score": scores if scores else dict(EMPTY_SCORE),
        "leaderboard": leaderboard(evaluation.rule, records, scores),
        "termination_cause": evaluation.termination_cause,
        "episodes": counts(len(evaluation.items), records),
        # The plan's items (an episode, or a training run of many episodes) and how many ended.
        "items": {
            "total": len(evaluation.items),
            "recorded": len({r["index"] for r in records}),
            "ended": items_ended(records),
        },
        "budgets": evaluation.budgets.as_dict(),
        "counters": dict(evaluation.counters),
        # Items taken out of the results and played again after an evaluator restart (their
        # records are in replayed.jsonl): which, and why.
        "replayed": list(evaluation.replayed),
        "timing": {
            "evaluation_s": evaluation.elapsed_s(end),
            "step_think_s": stats(evaluation.think_s),
            "server_step_s": stats(evaluation.server_step_s),
            "record_durable_s": stats(evaluation.store.durable_s),
            "time_bank_used_s": stats([r.get("time_bank_used_s") or 0.0 for r in records if not r["skipped"]]),
        },
        "seed": plan.seed,
        "tests": plan.source,
        "tests_digest": evaluation.tests_digest,
        "options": evaluation.options,
        "client_version": evaluation.client_version,
        "started_at": evaluation.started_wall,
        "versions": versions(plan.packages),
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
