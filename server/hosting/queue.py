"""arbiter's RQ queue: one job per submission, its job id the submission id, JSON-serialized
(never pickled: a worker runs nothing but the job function named here, with a submission id).

``rq info`` reads it with the same serializer:
``rq info --url REDIS_URL --serializer rq.serializers.JSONSerializer arbiter``.
"""

from __future__ import annotations

import math

import redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from arbiter.server.core.competition import CompetitionSpec

QUEUE_NAME = "arbiter"
SERIALIZER = JSONSerializer
JOB_FUNCTION = "arbiter.server.hosting.job.evaluate_submission"
# Evaluations of a submission after the first, when its worker is lost or its evaluation is cut
# by the farm (a Redis outage): each one continues from the last finished item.
RETRIES = 2
# Beyond the competition's overall budget: starting the evaluator and the agent, writing the
# results. RQ stops a job that runs longer; the reaper fails a submission that runs longer still.
JOB_MARGIN_S = 60.0
# How long RQ keeps a job's record after it ends (the submission record is arbiter's own, kept).
JOB_RECORD_TTL_S = 7 * 24 * 3600


def arbiter_queue(conn: redis.Redis) -> Queue:
    return Queue(QUEUE_NAME, connection=conn, serializer=SERIALIZER)


def job_timeout_s(spec: CompetitionSpec) -> int:
    """The longest one attempt of a submission of ``spec`` may run."""
    return int(math.ceil(spec.budgets.overall_s + JOB_MARGIN_S))


def enqueue_submission(
    queue: Queue, submission_id: str, timeout_s: int, pipeline: redis.client.Pipeline | None = None
) -> None:
    queue.enqueue_call(
        JOB_FUNCTION,
        args=(submission_id,),
        job_id=submission_id,
        timeout=timeout_s,
        retry=Retry(max=RETRIES),
        result_ttl=JOB_RECORD_TTL_S,
        failure_ttl=JOB_RECORD_TTL_S,
        description=f"evaluate submission {submission_id}",
        pipeline=pipeline,
    )
