"""Live progress events: one evaluation's story as it happens, for ``arbiter watch`` and tools.

Each event is a JSON object, written two ways:

- appended to ``events.jsonl`` in the results folder (append + flush, in the evaluator's
  thread, so the file is complete and in order whatever Redis does);
- XADDed to the evaluation's stream (``keys.events_key``) by a background thread, so a slow or
  broken Redis never stalls a budget decision. The stream is capped (approximate MAXLEN) and
  expires a while after the evaluation ends.

Events are per episode and per evaluation only, never per step. They are informational:
``episodes.jsonl`` stays the source of truth. A failure to publish or write is logged and
counted (``summary.json`` → ``counters``), never raised.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from arbiter.protocol import keys
from arbiter.protocol.redis_conn import Packets, connect
from arbiter.server.service import results_fence
from arbiter.server.service.throttled_log import ThrottledLog

log = logging.getLogger(__name__)
throttled_log = ThrottledLog(log)

# Per-episode events: 10,000 entries hold the whole history of any realistic evaluation, and
# cap a runaway one. Approximate trimming (MAXLEN ~) is what keeps XADD O(1).
EVENTS_MAXLEN = 10_000
EVENTS_TTL_S = 24 * 3600  # late watchers see a finished evaluation's history for a day
EVENTS_SOCKET_TIMEOUT_S = 2.0  # one XADD to a hung Redis gives up after this
EVENTS_QUEUE_LIMIT = 1000  # events waiting for Redis; beyond it they are dropped and counted
EVENTS_FLUSH_S = 3.0  # at the end, how long the evaluator waits for the last events to reach Redis
# ... when the evaluation was interrupted: a stop signal (an orchestrator kills soon after it) or
# Redis gone for good. Far longer than an XADD to a live Redis takes; the summary waits for it.
EVENTS_FLUSH_INTERRUPTED_S = 0.3
INTERRUPTED = "INTERRUPTED"  # the evaluation's state (not imported: `arbiter watch` loads no evaluator)

STARTED, EPISODE, TIMEOUT, FINISHED = "started", "episode", "timeout", "finished"
REPLAYED = "replayed"  # items withdrawn from the results, to be played again (a restart)
SUBMISSION = "submission"  # whose evaluation it is: what a resume keeps, should no summary be written
# What an episode event carries of the episode's record (episodes.jsonl has the rest).
EPISODE_FIELDS = (
    "index",
    "env",
    "num_agents",
    "steps",
    "normalized_return",
    "arrived",
    "arrived_fraction",
    "ended",
    "last_of_item",
    "timed_out",
    "timeout",
    "abandoned",
    "skipped",
    "wall_s",
    "elapsed_s",
    "time_bank_used_s",
)
_STOP = object()


# The last whole second written by wall_text, and its text: events come many to a second (a
# MetaLC dataset lasts milliseconds), and a datetime built and formatted for each event costs
# several times what appending the milliseconds to that text does, on the step that ends an item.
_second_text: tuple[int, str] = (-1, "")


def wall_text(timestamp: float) -> str:
    """``timestamp`` (seconds since 1970, as time.time() gives) in UTC as ISO 8601 to the
    millisecond, exactly as ``datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")``
    writes it: microseconds rounded half to even, then cut to milliseconds."""
    global _second_text
    second = int(timestamp)
    microseconds = round((timestamp - second) * 1_000_000)
    if microseconds == 1_000_000:
        second, microseconds = second + 1, 0
    if second != _second_text[0]:
        _second_text = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_second_text[1]}.{microseconds // 1000:03d}+00:00"


def _never_raises(hook: Callable[..., None]) -> Callable[..., None]:
    """The evaluation calls these hooks in its own flow: a fault here (a bug, a missing figure)
    costs the event, never the evaluation."""

    @functools.wraps(hook)
    def guarded(self: EventLog, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception:
            self.dropped += 1
            log.exception("event hook %s failed", hook.__name__)

    return guarded


class EventLog:
    """Publishes one evaluation's events; every public method is safe to call in any state."""

    def __init__(self, *, path: str, redis_url: str, service_id: str, maxlen: int = EVENTS_MAXLEN):
        self.path = path
        self.key = keys.events_key(service_id)
        self.service_id = service_id
        self.maxlen = maxlen
        # Counted apart by the thread that sees each failure, so no increment is ever lost.
        self.dropped = 0  # events never queued for Redis (queue full, not serializable)
        self.failed = 0  # events Redis refused or did not answer (publisher thread only)
        self.unwritten = 0  # events that did not reach events.jsonl
        self.closed = False
        self._in_flight = False  # the publisher thread is waiting for Redis to take an event
        self._abandoned = False  # close() stopped waiting for the publisher and counted what it held
        self._redis = connect(redis_url, socket_timeout_s=EVENTS_SOCKET_TIMEOUT_S)
        # The publisher's commands, packed and read straight on its socket: the thread holds the
        # interpreter's lock for as little as it can, since the evaluator's turn waits for it.
        self._packets = Packets(self._redis)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=EVENTS_QUEUE_LIMIT)
        try:
            # Appended, never truncated: a resumed evaluation continues the file of its first
            # run (a fresh one has had it removed by ResultsStore.start_fresh).
            self._file: Any = open(path, "a", encoding="utf-8")
        except OSError as exc:
            log.warning("cannot open %s (%s); events go to Redis only", path, exc)
            self._file = None
        self._thread = threading.Thread(target=self._publish_loop, name="events", daemon=True)
        self._thread.start()

    # -- the evaluation's seams ---------------------------------------------------------------

    @_never_raises
    def started(self, evaluation: Any, *, resumed: bool, record_episodes: int = 0, command: str | None = None) -> None:
        self.emit(
            STARTED,
            service_id=self.service_id,
            competition=evaluation.competition,
            scoring=evaluation.rule.name,
            format=evaluation.format_name,
            item_nouns=list(evaluation.plan.item_nouns),  # what arbiter watch calls the items
            episodes_total=evaluation.total,
            episodes_done=len({r["index"] for r in evaluation.records}),  # items, as episodes_total counts
            resumed=resumed,
            debug=evaluation.debug,
            budgets=evaluation.budgets.as_dict(),
            options=evaluation.options,
            record_episodes=record_episodes,
            command=command,  # what ran it ("run", "serve"; null: a hosted attempt): whose resume to name
        )

    def submission(self, identity: dict[str, Any]) -> None:
        """Whose evaluation this is (summary.json's ``submission``), as soon as it is named: an
        evaluation killed before its summary keeps it through a resume (``submission_recorded``)."""
        self.emit(SUBMISSION, **identity)

    @_never_raises
    def episode(self, record: dict[str, Any], evaluation: Any) -> None:
        """The Evaluation's ``on_episode``: a timeout event first when the episode timed out."""
        if record["timed_out"]:
            self.emit(
                TIMEOUT,
                kind=record["timeout"],
                index=record["index"],
                env=record.get("env", record.get("unit")),
                steps=record.get("steps"),
                debug=evaluation.debug,
            )
        self.emit(
            EPISODE,
            **{field: record[field] for field in EPISODE_FIELDS if field in record},
            unit=record.get("unit"),
            text=evaluation.plan.progress_text(record),  # the format's own line (arbiter watch shows it)
            episodes_done=record["index"] + 1,  # items are played in order; one may hold many records
            episodes_total=evaluation.total,
            score_so_far=evaluation.running_score(),
            debug=evaluation.debug,
        )

    @_never_raises
    def replayed(self, replayed: dict[str, Any]) -> None:
        """The Evaluation's ``on_replay``: these items' records were withdrawn (replayed.jsonl
        keeps them); they are played again, and announced again as they end. ``replayed``: the
        summary's entry (``items``, ``group``, ``records``, ``cause``), which a resume reads back."""
        self.emit(REPLAYED, **replayed)

    @_never_raises
    def finished(self, evaluation: Any) -> None:
        """The Evaluation's ``on_finish``: the last event, then the stream is flushed and closed."""
        if self.closed:
            return
        end = evaluation.finished_at if evaluation.finished_at is not None else evaluation.clock()
        try:
            scores = evaluation.scores()
            self.emit(
                FINISHED,
                state=evaluation.state.value,
                termination_cause=evaluation.termination_cause,
                score={
                    name: scores[name] if scores else None
                    for name in ("primary", "secondary", "primary_name", "secondary_name")
                },
                episodes_total=evaluation.total,
                episodes_done=len({r["index"] for r in evaluation.records}),
                timed_out=sum(1 for r in evaluation.records if r["timed_out"]),
                evaluation_s=evaluation.elapsed_s(end),
                debug=evaluation.debug,
            )
        finally:
            self.close(EVENTS_FLUSH_INTERRUPTED_S if evaluation.state == INTERRUPTED else EVENTS_FLUSH_S)
            for name, count in (("events_unpublished", self.unpublished), ("events_unwritten", self.unwritten)):
                if count:
                    evaluation.counters[name] += count

    @property
    def unpublished(self) -> int:
        return self.dropped + self.failed

    # -- mechanics ------------------------------------------------------------------------------

    def emit(self, kind: str, /, **fields: Any) -> None:
        if self.closed:
            return
        try:
            line = json.dumps(
                {"event": kind, "time": wall_text(time.time()), **fields}, separators=(",", ":"), allow_nan=False
            )
        except (TypeError, ValueError) as exc:  # a figure JSON cannot hold (NaN): a bug, not a crash
            log.warning("event %s not serializable: %s", kind, exc)
            self.unwritten += 1
            self.dropped += 1
            return
        self._write(line)
        try:
            self._queue.put_nowait((kind, line))
        except queue.Full:
            self.dropped += 1
            # Counted; said at most once a second (an agent ending episodes faster than Redis
            # takes their events would otherwise write a line for each).
            throttled_log.warning(
                "queue full",
                "events queue full (events come faster than Redis takes them, or it is down): event %s not published",
                kind,
            )

    def _write(self, line: str) -> None:
        if self._file is None:
            self.unwritten += 1
            return
        refused = results_fence.refusal()
        if refused is not None:  # the results folder is no longer this evaluation's to write
            self.unwritten += 1
            log.warning("%s not appended to: %s", self.path, refused)
            return
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            self.unwritten += 1
            log.warning("cannot append to %s: %s", self.path, exc)

    def _publish_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            kind, line = item
            self._in_flight = True
            try:
                self._send(kind, line)
            except Exception as exc:  # any failure of Redis (down, wrong key type, ACL): counted
                if not self._abandoned:  # else close() counted it already
                    self.failed += 1
                log.warning("event %s not published to %s: %s", kind, self.key, exc)
            finally:
                self._in_flight = False

    def _send(self, kind: str, line: str) -> None:
        commands: list[tuple[Any, ...]] = []
        if kind == STARTED:
            commands.append(("PERSIST", self.key))  # a resumed evaluation's stream may have been set to expire
        commands.append(("XADD", self.key, "MAXLEN", "~", self.maxlen, "*", "event", kind, "data", line))
        if kind == FINISHED:
            commands.append(("EXPIRE", self.key, EVENTS_TTL_S))
        self._packets.run(commands)

    def close(self, flush_s: float = EVENTS_FLUSH_S) -> None:
        """Wait up to ``flush_s`` for queued events to reach Redis; then release everything."""
        if self.closed:
            return
        self.closed = True
        give_up = time.monotonic() + flush_s  # one bound for both waits below
        try:
            self._queue.put(_STOP, timeout=flush_s)
        except queue.Full:
            pass
        self._thread.join(timeout=max(0.0, give_up - time.monotonic()))
        if self._thread.is_alive():
            # Still stuck on Redis: the event being sent and those queued will not be sent
            # before the process ends.
            self._abandoned = True
            pending = sum(1 for item in list(self._queue.queue) if item is not _STOP) + int(self._in_flight)
            self.dropped += pending
            log.warning("%d events did not reach Redis within %g s", pending, flush_s)
        else:
            self._packets.close()
            self._redis.close()
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                log.warning("cannot close %s: %s", self.path, exc)


def chain(*callbacks: Callable[..., None] | None) -> Callable[..., None] | None:
    """One ``on_episode`` callback made of several, called in order; None when there are none."""
    present = [callback for callback in callbacks if callback is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def call_all(*args: Any) -> None:
        for callback in present:
            callback(*args)

    return call_all


def resumes_recorded(path: str) -> int:
    """How many times the evaluation whose ``events.jsonl`` is at ``path`` was resumed: its
    ``started`` events that say so (a run killed outright leaves its own)."""
    return sum(event.get("resumed") is True for event in _recorded(path, STARTED))


def replays_recorded(path: str) -> list[dict[str, Any]]:
    """The items the evaluation whose ``events.jsonl`` is at ``path`` played again, as
    summary.json's ``replayed`` entries, in the order of its runs (killed ones' included)."""
    fields = ("items", "group", "records", "cause")
    return [{field: event.get(field) for field in fields} for event in _recorded(path, REPLAYED)]


def _recorded(path: str, kind: str) -> Iterator[dict[str, Any]]:
    """The events of ``kind`` in the ``events.jsonl`` at ``path``, skipping lines a kill cut."""
    marker = f'"event":"{kind}"'.encode()
    try:
        with open(path, "rb") as handle:
            for line in handle:
                if marker not in line.replace(b" ", b""):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if isinstance(event, dict) and event.get("event") == kind:
                    yield event
    except OSError:
        return


def submission_recorded(path: str) -> dict[str, Any] | None:
    """The identity the last ``submission`` event of ``events.jsonl`` at ``path`` named, if any."""
    found = None
    for event in _recorded(path, SUBMISSION):
        if event.get("participant"):
            found = {key: value for key, value in event.items() if key not in ("event", "time")}
    return found


def command_recorded(path: str) -> str | None:
    """The command that ran the evaluation's last run ("run", "serve"), as its ``started`` event
    in ``events.jsonl`` at ``path`` names it; None when none does (a hosted attempt, an older file)."""
    command = None
    for event in _recorded(path, STARTED):
        command = event.get("command") if isinstance(event.get("command"), str) else None
    return command


def first_start_recorded(path: str) -> dict[str, Any] | None:
    """The ``started`` event the evaluation's first run wrote into ``events.jsonl`` at ``path``:
    the settings it started under, which a resume keeps."""
    return next(_recorded(path, STARTED), None)
