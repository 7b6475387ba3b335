"""The reaper: an overdue evaluation, or a job that failed for good, ends its submission as
failed through the farm's fault; a submission a worker is on is left alone; one no worker is on
is queued again, never failed for the time it waits."""

from __future__ import annotations

import time

import redis
from hosting_farm import competition_file, seeded_agent
from rq.job import Job, JobStatus

from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.queue import RETRIES, SERIALIZER, arbiter_queue
from arbiter.server.hosting.reaper import OVERDUE_GRACE_S, reap, reap_due
from arbiter.server.hosting.submissions import (
    FAILED,
    INFRASTRUCTURE_FAULT,
    QUEUED,
    RUNNING,
    SubmissionStore,
    lock_key,
)


def running_since(conn: redis.Redis, tiny_tests: str, tmp_path, started_at: float) -> str:
    competition = competition_file(tmp_path, tiny_tests, overall_s=30)
    submission = submit(conn, competition=competition, participant="alice", agent=seeded_agent())
    SubmissionStore(conn).change(submission.id, (QUEUED,), state=RUNNING, started_at=started_at, attempts=1)
    return submission.id


def test_an_evaluation_past_its_budget_and_margin_fails(redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    now = time.time()
    store = SubmissionStore(redis_conn)
    overdue = running_since(redis_conn, tiny_tests, tmp_path, started_at=now - 10_000)
    in_time = running_since(redis_conn, tiny_tests, tmp_path, started_at=now - 1)
    redis_conn.set(lock_key(overdue), "its worker")  # a stuck worker still holds it
    redis_conn.set(lock_key(in_time), "its worker")

    reaped = reap(redis_conn, now=now)

    found = store.get(overdue)
    assert reaped == [(overdue, found.cause)]
    assert found.state == FAILED and found.fault == INFRASTRUCTURE_FAULT
    assert found.cause == f"ran past its overall budget plus margin ({found.timeout_s} s in all)"
    assert store.get(in_time).state == RUNNING
    limit = store.get(in_time).timeout_s + OVERDUE_GRACE_S
    assert reap(redis_conn, now=now + limit - 2) == []
    assert [submission_id for submission_id, _ in reap(redis_conn, now=now + limit + 1)] == [in_time]


def test_a_job_that_failed_for_good_fails_its_submission(redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    lost = running_since(redis_conn, tiny_tests, tmp_path, started_at=time.time())
    held = running_since(redis_conn, tiny_tests, tmp_path, started_at=time.time())
    for submission_id in (lost, held):
        Job.fetch(submission_id, connection=redis_conn, serializer=SERIALIZER).set_status(JobStatus.FAILED)
    redis_conn.set(lock_key(held), "a live worker", px=5000)

    reap(redis_conn)

    store = SubmissionStore(redis_conn)
    assert store.get(lost).state == FAILED and store.get(lost).fault == INFRASTRUCTURE_FAULT
    assert "lost or failed on every attempt (1 attempts)" in store.get(lost).cause
    assert store.get(held).state == RUNNING


def test_one_reaper_pass_per_interval_across_the_farm(redis_conn: redis.Redis) -> None:
    assert reap_due(redis_conn) is True
    assert reap_due(redis_conn) is False


def test_a_submission_queued_again_after_its_worker_was_lost_waits_without_running_late(
    redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    """RQ queued the job again (its worker was lost); the submission still says running, since
    long ago. It is queued, not failed as overdue: waiting in the queue is no attempt's time."""
    now = time.time()
    waiting = running_since(redis_conn, tiny_tests, tmp_path, started_at=now - 10_000)
    assert Job.fetch(waiting, connection=redis_conn, serializer=SERIALIZER).get_status() == JobStatus.QUEUED
    assert reap(redis_conn, now=now) == []
    found = SubmissionStore(redis_conn).get(waiting)
    assert found.state == QUEUED and found.attempts == 1 and found.cause is None


def test_an_attempt_that_lost_its_hold_and_recorded_nothing_is_followed_by_another(
    redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    """The job ended (its lock was lost when the farm's Redis restarted, so it stopped and
    recorded nothing) while the submission still says running: a new attempt is queued, until
    the attempts are spent."""
    store = SubmissionStore(redis_conn)
    lost = running_since(redis_conn, tiny_tests, tmp_path, started_at=time.time())
    job = Job.fetch(lost, connection=redis_conn, serializer=SERIALIZER)
    job.set_status(JobStatus.FINISHED)
    assert reap(redis_conn) == []
    assert store.get(lost).state == QUEUED
    assert Job.fetch(lost, connection=redis_conn, serializer=SERIALIZER).get_status() == JobStatus.QUEUED
    assert lost in arbiter_queue(redis_conn).job_ids
    # A newer attempt started meanwhile: nothing is changed under it.
    store.change(lost, (QUEUED,), state=RUNNING, attempts=2)
    assert store.change(lost, (RUNNING,), after_attempts=1, state=QUEUED) is None
    # The last attempt allowed lost its hold too: the farm's fault, said so.
    store.change(lost, (RUNNING,), attempts=RETRIES + 1)
    Job.fetch(lost, connection=redis_conn, serializer=SERIALIZER).set_status(JobStatus.FINISHED)
    reap(redis_conn)
    found = store.get(lost)
    assert found.state == FAILED and found.fault == INFRASTRUCTURE_FAULT
    assert found.cause == f"its attempts lost their hold on it ({RETRIES + 1} attempts)"
