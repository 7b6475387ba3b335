"""``arbiter watch``: follow one evaluation's progress events from another terminal.

It reads the evaluation's event stream (server/events.py) with XREAD, each wait bounded by
``WATCH_BLOCK_S``, prints a line per event and returns the final state when the evaluation ends.
By default it reads from the stream's start, so a late watcher sees the history.

An evaluation may take several runs of the evaluator: one killed (it leaves no ``finished``
event) or stopped as INTERRUPTED is continued by ``arbiter serve --resume``, whose ``started``
event says ``resumed``. The watcher follows it through every restart to its real end, and counts
each item once whichever run announced it (``Story``); a ``replayed`` event withdraws items,
which count again when they end again.

``arbiter watch`` with no address follows the local ``arbiter run`` (server/local_runs.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import redis

from arbiter.protocol import keys
from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.redis_conn import connect
from arbiter.server.cli.progress import _fmt, bank_note, count_items, plural
from arbiter.server.service.events import EPISODE, FINISHED, INTERRUPTED, REPLAYED, STARTED, TIMEOUT

WATCH_BLOCK_S = 1.0  # one XREAD waits at most this long, so the --timeout check stays prompt
WATCH_BATCH = 100  # events per XREAD: a late watcher catches up in a few round trips
# An answer later than this after its XREAD's block ends (or a first answer later than --timeout
# and this) is Redis not answering: --timeout bounds the wait for an answer as for an event.
ANSWER_SLACK_S = 0.25
CATCH_UP_BATCH = 1000  # events per XRANGE when --new-only reads the history for its counts only
# How a timeout line names one item: a two-phase item is an episode or a whole training run.
ONE_ITEM = {"metalc": "dataset", "two-phase": "item"}


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
    """Print the evaluation's events until it ends; returns its final state.

    An INTERRUPTED end is final only when nothing follows it in the stream: a resumed start
    after it continues the same evaluation."""
    key = keys.events_key(service_id)
    # An XREAD blocks for at most min(--timeout, WATCH_BLOCK_S): never longer than the socket waits.
    conn = connect(redis_url, socket_timeout_s=min(WATCH_BLOCK_S + 5.0, timeout_s + ANSWER_SLACK_S))
    story = Story()
    try:
        # --new-only shows what happens from now on, but counts what happened before too.
        last_id, ended = ("0-0", None) if from_start else _catch_up(conn, key, story)
        last_event_at = clock()
        interrupted_end: str | None = None  # an INTERRUPTED end seen; final unless a resumed start follows
        if ended is not None:  # the history ends with the evaluation's end: nothing new will come
            state, line = ended
            if line:
                print(line, file=out, flush=True)
            if state != INTERRUPTED:
                return state
            interrupted_end = state
        while True:
            waited_s = clock() - last_event_at
            if waited_s >= timeout_s:
                raise WatchError(
                    f"no event from evaluation {service_id!r} for {timeout_s:g} s "
                    f"(is its evaluator running, on this Redis, with this service id?)"
                )
            # XREAD's BLOCK 0 means "forever": never ask for less than 1 ms. After an INTERRUPTED
            # end the stream is only looked at, not waited on.
            block_ms = None if interrupted_end else max(1, int(min(timeout_s - waited_s, WATCH_BLOCK_S) * 1000))
            entries = _read(conn, key, last_id, block_ms)
            if interrupted_end and not entries:
                return interrupted_end
            for entry_id, fields in entries:
                event = _parse(fields)
                if interrupted_end:
                    if event is None or event.get("event") != STARTED or not event.get("resumed"):
                        return interrupted_end  # another evaluation under the same service id
                    interrupted_end = None
                last_id = entry_id
                last_event_at = clock()
                if event is None:
                    continue
                line = story.take(event)
                if line:
                    print(line, file=out, flush=True)
                if event.get("event") == FINISHED:
                    state = str(event.get("state"))
                    if state != INTERRUPTED:
                        return state
                    interrupted_end = state
    finally:
        conn.close()


def _read(conn: redis.Redis, key: str, last_id: Any, block_ms: int | None) -> list[tuple[Any, dict]]:
    try:
        found = conn.xread({key: last_id}, count=WATCH_BATCH, block=block_ms)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unreachable(conn, exc) from None
    except redis.ResponseError as exc:
        raise WatchError(f"cannot read {key}: {exc}") from None
    return [entry for _, entries in found or [] for entry in entries]


def _catch_up(conn: redis.Redis, key: str, story: Story) -> tuple[Any, tuple[str, str | None] | None]:
    """Take in the history without showing it; returns the newest entry's id (or 0-0), and, when
    the history ends with the evaluation's end, its state and the line that tells it. Read up to
    an id fixed first, then every XREAD continues from it, so nothing published meanwhile is
    missed or taken twice."""
    try:
        newest = conn.xrevrange(key, count=1)
        if not newest:
            return "0-0", None
        last_id = newest[0][0]
        start: Any = "-"
        ended: tuple[str, str | None] | None = None
        while True:
            entries = conn.xrange(key, min=start, max=last_id, count=CATCH_UP_BATCH)
            for _, fields in entries:
                event = _parse(fields)
                if event is not None:
                    line = story.take(event)
                    ended = (str(event.get("state")), line) if event.get("event") == FINISHED else None
            if len(entries) < CATCH_UP_BATCH:
                return last_id, ended
            start = b"(" + entries[-1][0]  # exclusive: after the last entry taken
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unreachable(conn, exc) from None
    except redis.ResponseError as exc:
        raise WatchError(f"cannot read {key}: {exc}") from None


def _unreachable(conn: redis.Redis, exc: Exception) -> WatchError:
    if isinstance(exc, redis.TimeoutError):  # connected, yet no answer: said so, not as the socket's words
        waited = conn.connection_pool.connection_kwargs.get("socket_timeout")
        return WatchError(f"cannot reach Redis: it did not answer within {waited:g} s")
    return WatchError(f"cannot reach Redis: {exc}")


def _parse(fields: dict) -> dict[str, Any] | None:
    try:
        event = json.loads(fields[b"data"])
    except (KeyError, ValueError):
        return None
    return event if isinstance(event, dict) else None


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _whole(value: Any) -> int | None:
    return value if type(value) is int else None


def bank_budget(budgets: dict[str, Any]) -> str:
    """The time bank in the budgets line, when there is one (NeurIPS 2020 has none)."""
    bank = budgets.get("time_bank_s")
    return f", time bank {_g(bank)} s per episode" if isinstance(bank, (int, float)) and bank > 0 else ""


def index_ranges(indices: Iterable[int]) -> str:
    """``#3, #7-9``: item indices as runs of consecutive ones."""
    runs: list[list[int]] = []
    for index in sorted(set(indices)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(f"#{first}" if first == last else f"#{first}-{last}" for first, last in runs)


class Story:
    """What a watcher knows of one evaluation from its events, and the line each one shows.

    How many items are recorded: an evaluator that names its format in its ``started`` event
    counts items in ``episodes_done`` (the results folder holds items 0 to n-1 when a run
    starts), and that figure is right even when the last events of a killed run never reached
    the stream. An older one counted records (a training run holds hundreds): then items are
    counted here by index, once each, from the episode events of every run, which is whole
    only when the stream still holds the evaluation's first ``started`` event."""

    def __init__(self) -> None:
        self.format_name: str | None = None
        self.item_nouns: list[str] | None = None  # the plan's words for its items (started event)
        self.total: int | None = None
        self.counts_items = False  # the evaluator's episodes_done counts items
        self.ended: set[int] = set()  # items whose records were announced and not withdrawn
        self.whole = False  # ``ended`` is complete
        self.starts = 0  # runs of the evaluator seen
        self.run_open = False  # a run of the evaluator started and has not finished

    def items(self, count: int) -> str:
        return count_items(count, self.format_name, self.item_nouns)

    def reported(self, event: dict[str, Any]) -> int | None:
        """The event's own count of items recorded, when it is one."""
        done = _whole(event.get("episodes_done"))
        if not self.counts_items or done is None or not 0 <= done <= (self.total or 0):
            return None
        return done

    def done(self, event: dict[str, Any]) -> int | None:
        """Items recorded so far, as the event says or as counted here."""
        reported = self.reported(event)
        if reported is not None:
            return reported
        return len(self.ended) if self.whole else _whole(event.get("episodes_done"))

    def take(self, event: dict[str, Any]) -> str:
        """Take one event in; its display line(s), empty for a kind this version does not know."""
        kind = event.get("event")
        tag = "[DEBUG] " if event.get("debug") else ""
        if kind == STARTED:
            return tag + self._started(event).replace("\n", "\n" + tag)
        if kind == EPISODE:
            if type(event.get("index")) is int:
                self.ended.add(event["index"])
            line = episode_line(event)
            return tag + line if line else ""
        if kind == REPLAYED:
            return self._replayed(event)
        if kind == TIMEOUT:
            steps = event.get("steps")
            after = plural(steps, "step") if type(steps) is int else f"{steps} steps"
            item = f"{ONE_ITEM.get(self.format_name or '', 'episode')} {event.get('index')} ({event.get('env')})"
            return f"{tag}TIMEOUT: {item} exceeded its {event.get('kind')} budget after {after}"
        if kind == FINISHED:
            self.run_open = False
            return self._finished(event)
        return ""

    def _started(self, event: dict[str, Any]) -> str:
        # A fresh evaluation, or a resumed one that had nothing to resume (`serve --resume` on a
        # new folder): nothing before it counts.
        first = not event.get("resumed") or (not self.starts and event.get("episodes_done") == 0)
        lines = []
        if first:
            self.ended.clear()
            self.whole = True
        elif self.run_open:
            lines.append("the evaluator's previous run ended without finishing (killed); this one continues it")
        self.starts += 1
        self.run_open = True
        self.counts_items = "format" in event
        self.format_name = event.get("format", self.format_name)
        nouns = event.get("item_nouns")
        self.item_nouns = nouns if isinstance(nouns, list) and all(isinstance(n, str) for n in nouns) else None
        self.total = _whole(event.get("episodes_total"))
        total = self.items(self.total) if self.total is not None else f"{event.get('episodes_total')} episodes"
        again = ""
        if not first:
            done = self.done(event)
            again = f", resumed after {self.items(done) if done is not None else event.get('episodes_done')}"
            if self.reported(event) is not None:  # the run resumes after items 0 to done-1
                self.ended = set(range(done))
                self.whole = True
        budgets = event.get("budgets") or {}
        lines.append(
            f"evaluation {event.get('service_id')}: {total} "
            f"({event.get('competition')}, scoring {event.get('scoring')}{again})"
        )
        lines.append(
            f"budgets: planning {_g(budgets.get('planning_s'))} s, step {_g(budgets.get('step_s'))} s, "
            f"overall {_g(budgets.get('overall_s'))} s, idle {_g(budgets.get('idle_s'))} s, "
            f"{budgets.get('max_successive_timeouts')} successive timeouts{bank_budget(budgets)}"
        )
        return "\n".join(lines)

    def _replayed(self, event: dict[str, Any]) -> str:
        items = [index for index in event.get("items") or [] if type(index) is int]
        self.ended.difference_update(items)
        return (
            f"replayed: {self.items(len(items))} ({index_ranges(items)}) withdrawn, to be played again: "
            f"{event.get('cause')}"
        )

    def _finished(self, event: dict[str, Any]) -> str:
        score = event.get("score") or {}
        debug = " (DEBUG run: not an official score)" if event.get("debug") else ""
        lines = [f"state: {event.get('state')}{debug} - {event.get('termination_cause')}"]
        if score.get("primary") is not None:
            lines.append(f"primary   ({score.get('primary_name')}): {score['primary']:.6f}")
            if score.get("secondary") is not None:
                lines.append(f"secondary ({score.get('secondary_name')}): {_fmt(score.get('secondary'), 6)}")
        else:
            lines.append("no score")
        done = self.done(event)
        total = _whole(event.get("episodes_total"))
        recorded = (
            f"{done} of {self.items(total)} recorded"
            if done is not None and total is not None
            else f"{event.get('episodes_done')}/{event.get('episodes_total')} episodes recorded"
        )
        evaluation_s = _fmt(event.get("evaluation_s"), 2)
        lines.append(f"{recorded}, {event.get('timed_out')} timed out, evaluation time {evaluation_s} s")
        return "\n".join(lines)


def episode_line(event: dict[str, Any]) -> str:
    """An episode event's line: the format's own text, or Flatland's figures (events written
    before formats had a text); empty for a record shown with its item's last one."""
    note = bank_note(event)
    if event.get("timed_out"):
        note += f"  TIMEOUT ({event.get('timeout')})"
    elif event.get("abandoned"):
        note += "  ABANDONED"
    elif event.get("skipped"):
        note += "  NOT PLAYED"
    elif event.get("ended") == "step_limit":
        note += "  STEP LIMIT"
    where = f"[{event.get('episodes_done')}/{event.get('episodes_total')}]"
    if "text" in event:
        if event["text"] is None:
            return ""
        return f"{where} {event['text']}{note}  | score so far {_fmt(event.get('score_so_far'))}"
    arrived = f"{event.get('arrived')}/{event.get('num_agents')}" if event.get("num_agents") else "-"
    return (
        f"{where} {event.get('env', ''):<22} steps {event.get('steps')!s:>5}  return "
        f"{_fmt(event.get('normalized_return'))}  arrived {arrived:>5}{note}  | "
        f"score so far {_fmt(event.get('score_so_far'))}"
    )


def render(event: dict[str, Any]) -> str:
    """One event's line(s) on its own, without what the events before it told."""
    return Story().take(event)
