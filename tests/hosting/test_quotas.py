"""Daily quotas: the competition's [hosting] table, what counts, and when a quota resets."""

from __future__ import annotations

import datetime

import pytest
import redis

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import load_competition
from arbiter.server.hosting.quotas import QuotaExceeded, check_quota, day_bounds
from arbiter.server.hosting.submissions import (
    AGENT_FAULT,
    CANCELLED,
    FAILED,
    FINISHED,
    INFRASTRUCTURE_FAULT,
    Submission,
    SubmissionStore,
    new_submission_id,
)

NOON = datetime.datetime(2026, 3, 14, 12, 0, tzinfo=datetime.UTC).timestamp()


def spec_with(*hosting: str):
    return load_competition("flatland-debug", [f"hosting.{line}" for line in hosting])


def add(store: SubmissionStore, *, at: float, competition: str = "flatland-debug", debug: bool = False, **fields):
    submission = Submission(
        id=new_submission_id(),
        competition=competition,
        competition_name=competition,
        participant="alice",
        agent=["a"],
        submitted_at=at,
        debug=debug,
        **fields,
    )
    store.add(submission)
    return submission


def test_the_hosting_table_is_validated() -> None:
    assert spec_with("daily_submissions=5").hosting.daily_submissions == 5
    assert spec_with().hosting.daily_submissions is None
    with pytest.raises(ConfigError, match="daily_submissions must be a whole number >= 0"):
        spec_with("daily_submissions=-1")
    with pytest.raises(ConfigError, match="daily_submissions must be a whole number"):
        spec_with('daily_submissions="many"')
    with pytest.raises(ConfigError, match="unknown hosting keys \\['weekly'\\]"):
        spec_with("weekly=3")
    with pytest.raises(ConfigError, match="\\[hosting\\] must be a table"):
        load_competition("flatland-debug", ["hosting=3"])


def test_the_limit_refuses_and_says_when_it_resets(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    spec = spec_with("daily_submissions=2")
    add(store, at=NOON - 3600, state=FINISHED)
    check_quota(store, spec, "alice", debug=False, now=NOON)
    add(store, at=NOON - 60)
    with pytest.raises(
        QuotaExceeded, match="used today's 2 submissions to flatland-debug; .*resets at 2026-03-15 00:00 UTC"
    ):
        check_quota(store, spec, "alice", debug=False, now=NOON)
    check_quota(store, spec, "bob", debug=False, now=NOON)  # another participant's own count
    tomorrow = day_bounds(NOON)[1] + 1
    check_quota(store, spec, "alice", debug=False, now=tomorrow)


def test_failures_of_the_farm_and_cancellations_do_not_count(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    spec = spec_with("daily_submissions=1")
    add(store, at=NOON - 10, state=FAILED, fault=INFRASTRUCTURE_FAULT)
    add(store, at=NOON - 9, state=CANCELLED)
    add(store, at=NOON - 8, competition="another")
    add(store, at=NOON - 86400)  # yesterday
    check_quota(store, spec, "alice", debug=False, now=NOON)
    add(store, at=NOON - 7, state=FAILED, fault=AGENT_FAULT)
    with pytest.raises(QuotaExceeded):
        check_quota(store, spec, "alice", debug=False, now=NOON)


def test_debug_submissions_have_their_own_limit(redis_conn: redis.Redis) -> None:
    store = SubmissionStore(redis_conn)
    spec = spec_with("daily_submissions=1", "debug_daily_submissions=2")
    add(store, at=NOON - 10, debug=True)
    add(store, at=NOON - 9, debug=True)
    check_quota(store, spec, "alice", debug=False, now=NOON)
    with pytest.raises(QuotaExceeded, match="2 debug submissions"):
        check_quota(store, spec, "alice", debug=True, now=NOON)


def test_day_bounds_are_utc_days() -> None:
    start, end = day_bounds(NOON)
    assert end - start == 86400
    assert datetime.datetime.fromtimestamp(start, tz=datetime.UTC).hour == 0
    assert start <= NOON < end


def test_a_limit_of_zero_says_the_competition_takes_none(redis_conn: redis.Redis) -> None:
    """A participant who made no submission is not told they used up today's 0, nor that a new
    day will open a kind of submission the competition takes none of."""
    store = SubmissionStore(redis_conn)
    spec = spec_with("daily_submissions=3", "debug_daily_submissions=0")
    with pytest.raises(QuotaExceeded) as refused:
        check_quota(store, spec, "zoe", debug=True, now=NOON)
    assert str(refused.value) == "flatland-debug takes no debug submissions ([hosting] debug_daily_submissions = 0)"
    check_quota(store, spec, "zoe", debug=False, now=NOON)
