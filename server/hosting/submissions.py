"""The submission record and its store in Redis.

A submission is one JSON value under its own key, changed only through ``SubmissionStore.change``:
a WATCH/MULTI transaction that applies a change only while the record is still in one of the
states the caller expects, so a worker, the reaper and ``arbiter cancel`` acting at once never
undo each other (a finished submission is never rewritten). Every submission is also listed in
a sorted set by submission time, one for all and one per participant.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from arbiter.protocol.errors import ConfigError

PREFIX = "arbiter:hosting"
QUEUED, RUNNING, FINISHED, FAILED, CANCELLED = "queued", "running", "finished", "failed", "cancelled"
STATES = (QUEUED, RUNNING, FINISHED, FAILED, CANCELLED)
ENDED = (FINISHED, FAILED, CANCELLED)
# Why a submission failed: its agent (it counts against the participant's quota) or the farm
# itself (a lost worker, an overdue evaluation, an internal error: it does not count).
AGENT_FAULT, INFRASTRUCTURE_FAULT = "agent", "infrastructure"


class UnknownSubmission(ConfigError):
    pass


def new_submission_id() -> str:
    """Unique, and a valid evaluation id (the service id of its evaluation)."""
    return f"sub-{time.strftime('%Y%m%d', time.gmtime())}-{secrets.token_hex(6)}"


@dataclass
class Submission:
    id: str
    competition: str  # a preset's name, or the absolute path of a competition file
    participant: str
    agent: list[str]  # the agent command
    phase: int | str | None = None
    debug: bool = False
    sets: list[str] = field(default_factory=list)  # --set KEY=VALUE overrides
    workdir: str | None = None  # the agent's working folder
    image: str | None = None  # the agent's container image (else the competition's [hosting] image)
    state: str = QUEUED
    cause: str | None = None  # why it ended (or why it is being retried)
    fault: str | None = None  # a failed one: AGENT_FAULT or INFRASTRUCTURE_FAULT
    attempts: int = 0  # evaluations started for it
    deliveries: int = 0  # times a worker was handed its job (a duplicate delivery evaluates nothing)
    submitted_at: float = 0.0  # Unix times
    started_at: float | None = None  # of the latest attempt
    finished_at: float | None = None
    score: float | None = None  # the primary score of a finished one
    competition_name: str = ""  # the competition's name (its results live under it)
    results: str | None = None  # its results folder, once a worker took it
    worker: str | None = None  # the worker of the latest attempt
    timeout_s: int = 0  # the longest one attempt may run (the overall budget plus a margin)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Submission:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def submission_key(submission_id: str) -> str:
    return f"{PREFIX}:submission:{submission_id}"


def all_key() -> str:
    return f"{PREFIX}:submissions"


def active_key() -> str:
    """The submissions not ended yet: what the reaper looks at."""
    return f"{PREFIX}:active"


def participant_key(participant: str) -> str:
    return f"{PREFIX}:participant:{participant}"


def lock_key(submission_id: str) -> str:
    """Held by the worker evaluating the submission (job.py)."""
    return f"{PREFIX}:lock:{submission_id}"


class SubmissionStore:
    def __init__(self, conn: redis.Redis):
        self.conn = conn

    def add(self, submission: Submission, pipeline: redis.client.Pipeline | None = None) -> None:
        target = pipeline if pipeline is not None else self.conn.pipeline()
        target.set(submission_key(submission.id), json.dumps(submission.as_dict()))
        target.zadd(all_key(), {submission.id: submission.submitted_at})
        target.zadd(participant_key(submission.participant), {submission.id: submission.submitted_at})
        target.sadd(active_key(), submission.id)
        if pipeline is None:
            target.execute()

    def find(self, submission_id: str) -> Submission | None:
        raw = self.conn.get(submission_key(submission_id))
        return Submission.from_dict(json.loads(raw)) if raw is not None else None

    def get(self, submission_id: str) -> Submission:
        found = self.find(submission_id)
        if found is None:
            raise UnknownSubmission(f"no submission {submission_id!r} (arbiter submissions lists them)")
        return found

    def change(
        self, submission_id: str, expected: Iterable[str], *, after_attempts: int | None = None, **changes: Any
    ) -> Submission | None:
        """Apply ``changes`` if the submission is in one of the ``expected`` states (atomically);
        returns the changed record, or None when it was in another state (left as it is).
        ``after_attempts``: only while it has had that many attempts (no newer one has started)."""
        allowed = tuple(expected)
        key = submission_key(submission_id)
        with self.conn.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        raise UnknownSubmission(f"no submission {submission_id!r}")
                    record = Submission.from_dict(json.loads(raw))
                    if record.state not in allowed or (
                        after_attempts is not None and record.attempts != after_attempts
                    ):
                        pipe.unwatch()
                        return None
                    for name, value in changes.items():
                        setattr(record, name, value(getattr(record, name)) if callable(value) else value)
                    pipe.multi()
                    pipe.set(key, json.dumps(record.as_dict()))
                    if record.state in ENDED:
                        pipe.srem(active_key(), submission_id)
                    pipe.execute()
                    return record
                except redis.WatchError:
                    continue  # changed meanwhile: read it again

    def active(self) -> list[Submission]:
        ids = sorted(raw.decode() for raw in self.conn.smembers(active_key()))
        raws = self.conn.mget([submission_key(one) for one in ids]) if ids else []
        return [Submission.from_dict(json.loads(raw)) for raw in raws if raw is not None]

    def ids(self, participant: str | None = None, since: float | None = None) -> list[str]:
        key = participant_key(participant) if participant is not None else all_key()
        low = since if since is not None else "-inf"
        return [raw.decode() for raw in self.conn.zrangebyscore(key, low, "+inf")]

    def listing(self, participant: str | None = None, since: float | None = None) -> list[Submission]:
        """Submissions in submission order (of one participant, submitted at or after ``since``)."""
        ids = self.ids(participant, since)
        if not ids:
            return []
        raws = self.conn.mget([submission_key(one) for one in ids])
        return [Submission.from_dict(json.loads(raw)) for raw in raws if raw is not None]
