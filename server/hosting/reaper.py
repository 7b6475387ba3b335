"""The reaper: no submission stays queued or running for ever.

Each pass (one at a time across the farm, every ``REAP_INTERVAL_S`` at most):

- RQ's started-job registry is cleaned: a job whose worker stopped sending heartbeats (the
  machine or the worker was lost) is queued again while it has retries left, else moved to RQ's
  failed registry;
- a submission whose job failed for good (lost on every attempt, or an error of arbiter's) is
  marked failed, its fault the farm's;
- a running submission past its longest run (the overall budget plus a margin, ``timeout_s``)
  plus ``OVERDUE_GRACE_S``, while a worker is on it, is marked failed and its work-horse stopped:
  RQ's own timeout should have ended it, so something is stuck;
- a "running" submission no worker is on is queued again: RQ queued its job again after its
  worker was lost (its time waiting in the queue is no attempt's), or the attempt ended having
  lost its lock (the farm's Redis restarted under it) and recorded nothing, and a new attempt
  goes on with its evaluation. Each attempt counts towards ``RETRIES``.
"""

from __future__ import annotations

import logging
import time

import redis
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus

from arbiter.server.hosting.queue import RETRIES, SERIALIZER, arbiter_queue, enqueue_submission
from arbiter.server.hosting.submissions import (
    FAILED,
    INFRASTRUCTURE_FAULT,
    QUEUED,
    RUNNING,
    Submission,
    SubmissionStore,
    lock_key,
)

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 1.0
OVERDUE_GRACE_S = 10.0  # after RQ's timeout: time for the job to record its own ending
REAPER_LOCK = "arbiter:hosting:reaper"


def reap_due(conn: redis.Redis) -> bool:
    """Whether this process should reap now: True for one caller per interval across the farm."""
    return bool(conn.set(REAPER_LOCK, 1, nx=True, px=int(REAP_INTERVAL_S * 1000)))


def reap(conn: redis.Redis, now: float | None = None) -> list[tuple[str, str]]:
    """One pass; returns the submissions it failed, with their causes."""
    now = time.time() if now is None else now
    arbiter_queue(conn).started_job_registry.cleanup()
    store = SubmissionStore(conn)
    reaped: list[tuple[str, str]] = []
    for submission in store.active():
        cause = _why_stuck(conn, submission, now)
        if cause is None or cause is QUEUED_AGAIN:
            continue
        if store.change(
            submission.id, (QUEUED, RUNNING), state=FAILED, cause=cause, fault=INFRASTRUCTURE_FAULT, finished_at=now
        ):
            reaped.append((submission.id, cause))
            log.warning("submission %s failed: %s", submission.id, cause)
    return reaped


QUEUED_AGAIN = "queued again"  # what _why_stuck says of a submission it queued again: nothing failed


def _why_stuck(conn: redis.Redis, submission: Submission, now: float) -> str | None:
    """Why ``submission`` is to fail (None: it is not), or ``QUEUED_AGAIN``."""
    # The job's status is read before the lock: a job that ended recorded its submission's ending
    # first, so a submission still running once its job ended (and no worker holds it) is lost.
    try:
        job = Job.fetch(submission.id, connection=conn, serializer=SERIALIZER)
        status = job.get_status()
    except (NoSuchJobError, InvalidJobOperation):
        job, status = None, None
    held = bool(conn.exists(lock_key(submission.id)))
    overdue_at = (submission.started_at or 0.0) + submission.timeout_s + OVERDUE_GRACE_S
    on_it = held or status == JobStatus.STARTED
    if submission.state == RUNNING and submission.started_at is not None and now > overdue_at and on_it:
        if job is not None and status == JobStatus.STARTED:
            try:
                send_stop_job_command(conn, submission.id, serializer=SERIALIZER)
            except InvalidJobOperation:
                pass  # it stopped meanwhile
        return f"ran past its overall budget plus margin ({submission.timeout_s} s in all)"
    if held:
        return None  # a worker is on it
    if status == JobStatus.FAILED:
        return f"its worker was lost or failed on every attempt ({submission.attempts} attempts)"
    if job is None:
        return "its job is gone from the queue"
    if submission.state != RUNNING:
        return None
    store = SubmissionStore(conn)
    if status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
        # RQ queued it again after its worker was lost: waiting, not running.
        store.change(submission.id, (RUNNING,), after_attempts=submission.attempts, state=QUEUED)
        return QUEUED_AGAIN
    if status == JobStatus.FINISHED:  # the attempt lost its lock and recorded nothing
        if submission.attempts > RETRIES:
            return f"its attempts lost their hold on it ({submission.attempts} attempts)"
        if store.change(submission.id, (RUNNING,), after_attempts=submission.attempts, state=QUEUED) is not None:
            enqueue_submission(arbiter_queue(conn), submission.id, submission.timeout_s)
            log.warning("submission %s queued again: its attempt lost its hold on it", submission.id)
        return QUEUED_AGAIN
    return None
