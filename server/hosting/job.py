"""What a worker runs for one submission (RQ's job function, named by queue.py).

Nothing lost, nothing twice: the job takes the submission's lock in Redis before it evaluates,
so a job delivered twice (enqueued again, retried while a first attempt still runs) evaluates
nothing the second time; a submission that ended is left as it is. The lock lives
``LOCK_TTL_S`` unless its holder renews it, so the lock of a worker that vanished frees itself.
An attempt whose results folder already holds finished items continues after the last one
(the evaluator's resume), with a new agent.

An attempt cut by the farm (a Redis outage, an internal error) raises while RQ has retries left,
so RQ runs the job again; after the last one the submission fails, its fault the farm's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from rq import get_current_job

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.summary import iso_utc
from arbiter.server.hosting.backends import Backend
from arbiter.server.hosting.farm import submission_spec
from arbiter.server.hosting.submissions import (
    AGENT_FAULT,
    CANCELLED,
    ENDED,
    FAILED,
    FINISHED,
    INFRASTRUCTURE_FAULT,
    QUEUED,
    RUNNING,
    Submission,
    SubmissionStore,
    lock_key,
)
from arbiter.server.service import held_stops, results_fence

log = logging.getLogger(__name__)

LOCK_TTL_S = 3.0  # how soon the lock of a vanished worker frees itself
LOCK_RENEW_S = 0.5  # how often its holder renews it, and looks whether it was cancelled


class RetryableFailure(Exception):
    """An attempt the farm cut short; RQ runs the job again (it continues where it stopped)."""


@dataclass
class WorkerSettings:
    redis_url: str
    results_root: str
    backend: Backend
    worker_name: str = ""


_settings: WorkerSettings | None = None


def configure(settings: WorkerSettings) -> None:
    """Set by the worker process before it takes jobs; its work-horses inherit it."""
    global _settings
    _settings = settings


def current_settings() -> WorkerSettings | None:
    return _settings


def results_folder(results_root: str, submission: Submission) -> str:
    return os.path.join(results_root, submission.competition_name, submission.id)


def evaluate_submission(submission_id: str) -> str:
    """RQ's job: evaluate one submission, once. Returns what happened, in words (RQ keeps it)."""
    if _settings is None:
        raise RuntimeError("evaluate_submission runs in an arbiter worker (arbiter worker, or job.configure)")
    conn = redis.Redis.from_url(_settings.redis_url)
    store = SubmissionStore(conn)
    delivered = store.change(submission_id, (QUEUED, RUNNING), deliveries=lambda n: n + 1)
    if delivered is None:
        ended = store.get(submission_id)
        if ended.state == CANCELLED and ended.results:
            mark_cancelled_folder(conn, ended, wait_s=LOCK_TTL_S + 1.0)
        conn.close()
        return f"submission {submission_id} already {ended.state}; left as it is"
    # The lock on a connection of its own, whose calls give up on a Redis that does not answer
    # within a renewal's interval: the keeper must see an outage in time to act on it.
    lock_conn = redis.Redis.from_url(_settings.redis_url, socket_timeout=LOCK_RENEW_S)
    lock = lock_conn.lock(lock_key(submission_id), timeout=LOCK_TTL_S, thread_local=False)
    asked_at = time.monotonic()
    if not lock.acquire(blocking=True, blocking_timeout=LOCK_TTL_S + 1.0):
        lock_conn.close()
        return f"submission {submission_id} is being evaluated by another worker; this delivery evaluates nothing"
    keeper = LockKeeper(lock, SubmissionStore(lock_conn), submission_id, acquired_at=asked_at)
    # The keeper's SIGTERM may come before the evaluation can obey it: it is held till then.
    # The results folder is written only while the lock holds (the keeper is the fence).
    with held_stops.held(), results_fence.fenced(keeper.refusal):
        keeper.start()
        try:
            return _evaluate_locked(store, submission_id, _settings, keeper)
        finally:
            keeper.stop()
            try:
                lock.release()
            except redis.exceptions.LockError:
                pass  # it expired (the process was stopped long enough): nothing held any more
            except redis.exceptions.RedisError:
                pass  # the farm's Redis out of reach: the lock lapses by itself
            lock_conn.close()
            conn.close()


def mark_cancelled_folder(conn: redis.Redis, submission: Submission, *, wait_s: float = 0.0) -> bool:
    """A submission cancelled after an attempt had written its summary, whose worker was lost
    before recording the ending (no attempt is left to do it): its folder gets the cancel's mark
    here, so that it agrees with the farm and no leaderboard ranks it. Under the submission's
    lock, waited for up to ``wait_s``, so that no attempt still writing the folder is
    overwritten. Whether the folder is marked now."""
    if not submission.results or not os.path.isdir(submission.results):
        return False  # not on this machine: the worker the job goes to marks it
    lock = conn.lock(lock_key(submission.id), timeout=LOCK_TTL_S, thread_local=False)
    if not lock.acquire(blocking=wait_s > 0, blocking_timeout=wait_s or None):
        return False  # an attempt still holds it: that attempt marks the folder as it ends
    try:
        if _ended_before(submission.results) is None:
            return False
        _mark_summary(submission.results, submission, cancelled=submission.cause)
        _write_report(submission.results)
        return True
    finally:
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


class LockKeeper(threading.Thread):
    """Renews the submission's lock while the attempt runs, and stops the evaluation (a SIGTERM
    to this process, which the evaluator handles as a stop: the evaluation ends as interrupted,
    the agent's group is stopped) when the submission is cancelled, or when the lock was lost:
    this process was held up past its lifetime, and another worker may have taken over.

    It is also the attempt's results fence (``refusal``, for results_fence.py): once the lock may
    have lapsed, this attempt writes nothing more into the submission's results folder."""

    def __init__(self, lock: Any, store: SubmissionStore, submission_id: str, acquired_at: float):
        super().__init__(name=f"lock-{submission_id}", daemon=True)
        self.lock, self.store, self.submission_id = lock, store, submission_id
        self.done = threading.Event()
        self.stopping = False
        self.lost = False
        # When the last renewal that Redis granted was sent (monotonic): the lock is this
        # attempt's for LOCK_TTL_S from then at least.
        self.renewed_at = acquired_at
        self._renewing = threading.Lock()  # one renewal at a time: this thread's, or a write's

    def run(self) -> None:
        while not self.done.wait(LOCK_RENEW_S):
            try:
                self._renew()
                found = self.store.find(self.submission_id)
            except redis.exceptions.LockNotOwnedError:
                self.lost = True
                self._stop_evaluation()
                return
            except redis.exceptions.RedisError:
                # The farm's Redis out of reach: the attempt goes on while its lock holds, and stops
                # before the lock can lapse, when another worker could take the submission over
                # (two attempts of one submission never run at once). It is then queued again.
                if not self._lease_holds():
                    log.warning("the farm's Redis has not renewed this attempt's lock in time: the attempt stops")
                    self.lost = True
                    self._stop_evaluation()
                    return
                continue
            if found is not None and found.state == "cancelled":
                self._stop_evaluation()

    def refusal(self) -> str | None:
        """Why this attempt may no longer write its results folder; None while its lock holds
        with time to spare. Renewals on time make this a clock reading; late ones (this process
        was held up: its machine paused, its processes stopped) make it ask the farm's Redis."""
        if not self.lost and not self._lease_holds():
            try:
                self._renew()
            except redis.exceptions.RedisError:  # not this attempt's any more, or not known to be
                self.lost = True
        if self.lost:
            return (
                f"its lock in the farm's Redis was not renewed within {LOCK_TTL_S:g} s, so another attempt "
                "may be evaluating the submission in this folder"
            )
        return None

    def _lease_holds(self) -> bool:
        """Whether the lock is this attempt's for at least one more renewal interval."""
        return time.monotonic() - self.renewed_at < LOCK_TTL_S - LOCK_RENEW_S

    def _renew(self) -> None:
        with self._renewing:
            sent_at = time.monotonic()
            self.lock.reacquire()
            self.renewed_at = max(self.renewed_at, sent_at)

    def _stop_evaluation(self) -> None:
        if not self.stopping:
            self.stopping = True
            os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)


def _evaluate_locked(store: SubmissionStore, submission_id: str, settings: WorkerSettings, keeper: LockKeeper) -> str:
    submission = store.get(submission_id)
    if submission.state in ENDED:
        return f"submission {submission_id} already {submission.state}; left as it is"
    results_dir = results_folder(settings.results_root, submission)
    ended = _ended_before(results_dir)
    if ended is not None:  # the previous attempt finished its evaluation, then was lost
        _mark_summary(results_dir, submission)
        _write_report(results_dir)
        return _record(store, submission, ended)
    started = store.change(
        submission_id,
        (QUEUED, RUNNING),
        state=RUNNING,
        attempts=lambda n: n + 1,
        started_at=time.time(),
        worker=settings.worker_name or None,
        results=results_dir,
        cause=None,
    )
    if started is None:
        return f"submission {submission_id} ended meanwhile; left as it is"
    resume = os.path.exists(os.path.join(results_dir, "events.jsonl"))
    try:
        spec = submission_spec(started)
        # The farm's Redis stays out of the evaluation: the attempt gets a Redis of its own.
        evaluated = settings.backend.evaluate(spec, started, results_dir=results_dir, resume=resume)
    except Exception as exc:
        if keeper.refusal() is not None:  # whoever holds the submission now records its ending
            return f"submission {submission_id}: its lock was lost; this attempt stopped and recorded nothing"
        if isinstance(exc, ConfigError):
            agent = str(exc).startswith("cannot start the agent")
            return _fail(store, started, str(exc), AGENT_FAULT if agent else INFRASTRUCTURE_FAULT)
        return _retry_or_fail(store, started, f"the evaluation stopped: {type(exc).__name__}: {exc}")
    if keeper.refusal() is not None:  # the lock may have lapsed: its results are not this attempt's to mark
        return f"submission {submission_id}: its lock was lost; this attempt stopped and recorded nothing"
    now = store.get(submission_id)
    _mark_summary(results_dir, started, cancelled=now.cause if now.state == CANCELLED else None)
    _write_report(results_dir)
    if evaluated.agent_fault is not None:  # stopped for what the agent did: never tried again
        return _fail(store, started, evaluated.agent_fault, AGENT_FAULT)
    return _record(store, started, evaluated.summary)


def _write_report(results_dir: str) -> None:
    """The evaluation's report.html, next to its results; the results stand without it."""
    from arbiter.server.report.page import write_report

    try:
        write_report(results_dir)
    except Exception:
        log.exception("no report for %s", results_dir)


def _ended_before(results_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        return None
    return summary if summary.get("state") in ("SUCCESS", "FAILED") else None


def _record(store: SubmissionStore, submission: Submission, summary: dict[str, Any]) -> str:
    state, cause = summary.get("state"), summary.get("termination_cause") or ""
    if state == "SUCCESS":
        score = (summary.get("score") or {}).get("primary")
        changed = store.change(
            submission.id, (QUEUED, RUNNING), state=FINISHED, cause=cause, score=score, finished_at=time.time()
        )
        return f"submission {submission.id}: finished, score {score}" if changed else "ended meanwhile"
    if state == "FAILED":
        internal = cause.startswith("internal error")
        if "JobTimeoutException" in cause:
            cause = f"ran past its overall budget plus margin ({submission.timeout_s} s in all)"
        return _fail(store, submission, cause, INFRASTRUCTURE_FAULT if internal else AGENT_FAULT)
    if store.get(submission.id).state != RUNNING:  # cancelled: its evaluation was stopped for it
        return f"submission {submission.id}: {store.get(submission.id).state}"
    return _retry_or_fail(store, submission, f"the evaluation was interrupted: {cause}")


def _fail(store: SubmissionStore, submission: Submission, cause: str, fault: str) -> str:
    store.change(submission.id, (QUEUED, RUNNING), state=FAILED, cause=cause, fault=fault, finished_at=time.time())
    return f"submission {submission.id}: failed: {cause}"


def _retry_or_fail(store: SubmissionStore, submission: Submission, cause: str) -> str:
    job = get_current_job()
    if job is not None and job.retries_left:
        store.change(submission.id, (RUNNING,), state=QUEUED, cause=f"retrying: {cause}")
        raise RetryableFailure(cause)
    return _fail(store, submission, f"{cause} (after {submission.attempts} attempts)", INFRASTRUCTURE_FAULT)


def _mark_summary(results_dir: str, submission: Submission, cancelled: str | None = None) -> None:
    """Put the submission's whole identity in its summary.json (written through a renamed
    temporary file): the evaluation wrote who and when; the farm adds its own fields.
    ``cancelled``: the cause of a cancel that came while the attempt ran, even once the evaluation
    had ended: the folder then says so too, and no leaderboard ranks it."""
    path = os.path.join(results_dir, "summary.json")
    try:
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        return  # no summary: the evaluation never started
    summary["submission"] = {
        "id": submission.id,
        "participant": submission.participant,
        "submitted_at": iso_utc(submission.submitted_at),
        "competition": submission.competition_name,
        "phase": submission.phase,
        "debug": submission.debug,
        "attempts": submission.attempts,
        # What the submission changed of the competition: a board ranks it apart (leaderboard/entries.py).
        **({"sets": list(submission.sets)} if submission.sets else {}),
        **({"cancelled": cancelled} if cancelled else {}),
    }
    temporary = f"{path}.tmp.{uuid.uuid4().hex[:8]}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)
