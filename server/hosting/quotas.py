"""Per-participant daily limits (the competition's ``[hosting]`` table).

A day is a UTC calendar day: every participant's count starts again at 00:00 UTC, the same
moment for all, which a refused participant is told. Official and debug submissions have
limits of their own (``daily_submissions``, ``debug_daily_submissions``). Not counted: a
submission cancelled by the organiser, and one that failed through a fault of the farm (a lost
worker, an overdue evaluation, an internal error): the participant did not use it up.
"""

from __future__ import annotations

import datetime

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.hosting.submissions import CANCELLED, FAILED, INFRASTRUCTURE_FAULT, Submission, SubmissionStore


class QuotaExceeded(ConfigError):
    """A submission refused by its participant's daily limit."""


def day_bounds(now: float) -> tuple[float, float]:
    """The start of ``now``'s UTC day and of the next one, as Unix times."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return start.timestamp(), (start + datetime.timedelta(days=1)).timestamp()


def counts(submission: Submission) -> bool:
    """Whether ``submission`` uses up one of its participant's daily submissions."""
    if submission.state == CANCELLED:
        return False
    return not (submission.state == FAILED and submission.fault == INFRASTRUCTURE_FAULT)


def daily_limit(spec: CompetitionSpec, debug: bool) -> int | None:
    return spec.hosting.debug_daily_submissions if debug else spec.hosting.daily_submissions


def check_quota(store: SubmissionStore, spec: CompetitionSpec, participant: str, *, debug: bool, now: float) -> None:
    """Raise QuotaExceeded when ``participant`` used up today's submissions of this kind."""
    limit = daily_limit(spec, debug)
    if limit is None:
        return
    kind = "debug submissions" if debug else "submissions"
    if limit == 0:  # closed to this kind: nothing was used, and no new day opens it
        key = "debug_daily_submissions" if debug else "daily_submissions"
        raise QuotaExceeded(f"{spec.name} takes no {kind} ([hosting] {key} = 0)")
    start, reset = day_bounds(now)
    used = sum(
        1
        for earlier in store.listing(participant, since=start)
        if earlier.competition_name == spec.name and earlier.debug == debug and counts(earlier)
    )
    if used >= limit:
        resets = datetime.datetime.fromtimestamp(reset, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        raise QuotaExceeded(
            f"{participant} has used today's {limit} {kind} to {spec.name}; the quota resets at {resets}"
        )
