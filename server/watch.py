"""``arbiter watch``: follow one evaluation's progress events from another terminal.

It reads the evaluation's event stream (server/events.py) with XREAD, each wait bounded by
``WATCH_BLOCK_S``, prints a line per event and returns the final state when the ``finished``
event arrives. By default it reads from the stream's start, so a late watcher sees the history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TextIO

import redis

from arbiter.protocol import keys
from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.redis_conn import connect

from .events import EPISODE, FINISHED, STARTED, TIMEOUT
from .progress import _fmt, bank_note

WATCH_BLOCK_S = 1.0  # one XREAD waits at most this long, so the --timeout check stays prompt
WATCH_BATCH = 100  # events per XREAD: a late watcher catches up in a few round trips


class WatchError(ArbiterError):
    """The events cannot be followed: Redis unreachable, no event in time, not a stream."""

    code = "WATCH"


def follow(
    redis_url: str,
    service_id: str,
    *,
    timeout_s: float,
    from_start: bool = True,
    out: TextIO,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Print the evaluation's events until it finishes; returns its final state."""
    key = keys.events_key(service_id)
    conn = connect(redis_url, socket_timeout_s=WATCH_BLOCK_S + 5.0)
    try:
        last_id = "0-0" if from_start else _last_id(conn, key)
        last_event_at = clock()
        while True:
            waited_s = clock() - last_event_at
            if waited_s >= timeout_s:
                raise WatchError(
                    f"no event from evaluation {service_id!r} for {timeout_s:g} s "
                    f"(is its evaluator running, on this Redis, with this service id?)"
                )
            # XREAD's BLOCK 0 means "forever": never ask for less than 1 ms.
            block_ms = max(1, int(min(timeout_s - waited_s, WATCH_BLOCK_S) * 1000))
            for entry_id, fields in _read(conn, key, last_id, block_ms):
                last_id = entry_id
                last_event_at = clock()
                event = _parse(fields)
                if event is None:
                    continue
                line = render(event)
                if line:
                    print(line, file=out, flush=True)
                if event.get("event") == FINISHED:
                    return str(event.get("state"))
    finally:
        conn.close()


def _read(conn: redis.Redis, key: str, last_id: Any, block_ms: int) -> list[tuple[Any, dict]]:
    try:
        found = conn.xread({key: last_id}, count=WATCH_BATCH, block=block_ms)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise WatchError(f"cannot reach Redis: {exc}") from None
    except redis.ResponseError as exc:
        raise WatchError(f"cannot read {key}: {exc}") from None
    return [entry for _, entries in found or [] for entry in entries]


def _last_id(conn: redis.Redis, key: str) -> Any:
    """The newest entry's id (or 0-0): only events after it are shown. Read once, then every
    XREAD continues from the last id seen, so nothing published between reads is missed."""
    try:
        newest = conn.xrevrange(key, count=1)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise WatchError(f"cannot reach Redis: {exc}") from None
    except redis.ResponseError as exc:
        raise WatchError(f"cannot read {key}: {exc}") from None
    return newest[0][0] if newest else "0-0"


def _parse(fields: dict) -> dict[str, Any] | None:
    try:
        event = json.loads(fields[b"data"])
    except (KeyError, ValueError):
        return None
    return event if isinstance(event, dict) else None


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def bank_budget(budgets: dict[str, Any]) -> str:
    """The time bank in the budgets line, when there is one (NeurIPS 2020 has none)."""
    bank = budgets.get("time_bank_s")
    return f", time bank {_g(bank)} s per episode" if isinstance(bank, (int, float)) and bank > 0 else ""


def render(event: dict[str, Any]) -> str:
    """The display line(s) of one event; empty for an event kind this version does not know."""
    kind = event.get("event")
    tag = "[DEBUG] " if event.get("debug") else ""
    if kind == STARTED:
        budgets = event.get("budgets") or {}
        again = f", resumed after {event.get('episodes_done')} episodes" if event.get("resumed") else ""
        return (
            f"{tag}evaluation {event.get('service_id')}: {event.get('episodes_total')} episodes "
            f"({event.get('competition')}, scoring {event.get('scoring')}{again})\n"
            f"{tag}budgets: planning {_g(budgets.get('planning_s'))} s, step {_g(budgets.get('step_s'))} s, "
            f"overall {_g(budgets.get('overall_s'))} s, idle {_g(budgets.get('idle_s'))} s, "
            f"{budgets.get('max_successive_timeouts')} successive timeouts{bank_budget(budgets)}"
        )
    if kind == TIMEOUT:
        return (
            f"{tag}TIMEOUT: episode {event.get('index')} ({event.get('env')}) exceeded its "
            f"{event.get('kind')} budget after {event.get('steps')} steps"
        )
    if kind == EPISODE:
        note = bank_note(event)
        if event.get("timed_out"):
            note += f"  TIMEOUT ({event.get('timeout')})"
        elif event.get("abandoned"):
            note += "  ABANDONED"
        elif event.get("skipped"):
            note += "  NOT PLAYED"
        if "text" in event:  # the format's own line (events written before formats had none)
            if event["text"] is None:
                return ""  # a record the format shows with its item's last one
            return (
                f"{tag}[{event.get('episodes_done')}/{event.get('episodes_total')}] {event['text']}{note}"
                f"  | score so far {_fmt(event.get('score_so_far'))}"
            )
        arrived = f"{event.get('arrived')}/{event.get('num_agents')}" if event.get("num_agents") else "-"
        return (
            f"{tag}[{event.get('episodes_done')}/{event.get('episodes_total')}] {event.get('env', ''):<22} "
            f"steps {event.get('steps')!s:>5}  return {_fmt(event.get('normalized_return'))}  "
            f"arrived {arrived:>5}{note}  | score so far {_fmt(event.get('score_so_far'))}"
        )
    if kind == FINISHED:
        score = event.get("score") or {}
        debug = " (DEBUG run: not an official score)" if event.get("debug") else ""
        lines = [f"state: {event.get('state')}{debug} - {event.get('termination_cause')}"]
        if score.get("primary") is not None:
            lines.append(f"primary   ({score.get('primary_name')}): {score['primary']:.6f}")
            lines.append(f"secondary ({score.get('secondary_name')}): {_fmt(score.get('secondary'), 6)}")
        else:
            lines.append("no score")
        lines.append(
            f"{event.get('episodes_done')}/{event.get('episodes_total')} episodes recorded, "
            f"{event.get('timed_out')} timed out, evaluation time {_fmt(event.get('evaluation_s'), 2)} s"
        )
        return "\n".join(lines)
    return ""
