"""The submission store: records in Redis, changed only from the states a caller expects."""

from __future__ import annotations

import pytest
import redis

from arbiter.protocol import keys
from arbiter.server.hosting.submissions import (
    CANCELLED,
    FINISHED,
    QUEUED,
    RUNNING,
    Submission,
    SubmissionStore,
    UnknownSubmission,
    new_submission_id,
)


def record(participant: str, at: float, **fields) -> Submission:
    return Submission(
        id=new_submission_id(), competition="c", participant=participant, agent=["a"], submitted_at=at, **fields
    )


def test_ids_are_unique_evaluation_ids() -> None:
    made = {new_submission_id() for _ in range(200)}
    assert len(made) == 200
    for one in made:
        assert keys.validate_service_id(one) == one


def test_a_change_applies_only_from_the_expected_states(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    submission = record("alice", 1.0)
    store.add(submission)

    running = store.change(submission.id, (QUEUED,), state=RUNNING, attempts=lambda n: n + 1)
    assert running is not None and running.state == RUNNING and running.attempts == 1
    assert store.change(submission.id, (QUEUED,), state=RUNNING) is None, "no longer queued"
    finished = store.change(submission.id, (RUNNING,), state=FINISHED, score=0.5)
    assert finished is not None and store.get(submission.id) == finished
    assert store.change(submission.id, (QUEUED, RUNNING), state=CANCELLED) is None
    assert store.get(submission.id).state == FINISHED and store.get(submission.id).score == 0.5


def test_ended_submissions_leave_the_active_set(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    first, second = record("alice", 1.0), record("bob", 2.0)
    store.add(first)
    store.add(second)
    assert {one.id for one in store.active()} == {first.id, second.id}
    store.change(first.id, (QUEUED,), state=CANCELLED)
    assert [one.id for one in store.active()] == [second.id]


def test_listing_in_submission_order_per_participant(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    late, early, other = record("alice", 30.0), record("alice", 10.0), record("bob", 20.0)
    for one in (late, early, other):
        store.add(one)
    assert [one.id for one in store.listing()] == [early.id, other.id, late.id]
    assert [one.id for one in store.listing("alice")] == [early.id, late.id]
    assert [one.id for one in store.listing("alice", since=20.0)] == [late.id]
    assert store.listing("nobody") == []


def test_an_unknown_id_is_a_clear_error(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    assert store.find("sub-nope") is None
    with pytest.raises(UnknownSubmission, match="no submission 'sub-nope'"):
        store.get("sub-nope")
    with pytest.raises(UnknownSubmission):
        store.change("sub-nope", (QUEUED,), state=RUNNING)
    assert redis_conn.keys("*") == []
