"""arbiter's RQ queue: a job per submission, JSON only, a timeout from the overall budget."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import redis
from hosting_farm import competition_file, seeded_agent
from rq.job import Job

from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.queue import JOB_FUNCTION, JOB_MARGIN_S, QUEUE_NAME, RETRIES, SERIALIZER, arbiter_queue


def test_a_submission_is_one_json_job_named_by_its_id(redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests, overall_s=90)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())

    queue = arbiter_queue(redis_conn)
    assert queue.name == QUEUE_NAME and queue.job_ids == [submission.id]
    job = Job.fetch(submission.id, connection=redis_conn, serializer=SERIALIZER)
    assert job.func_name == JOB_FUNCTION and list(job.args) == [submission.id]
    assert job.timeout == 90 + JOB_MARGIN_S == submission.timeout_s
    assert job.retries_left == RETRIES
    stored = zlib.decompress(redis_conn.hget(f"rq:job:{submission.id}", "data"))  # RQ compresses it
    assert json.loads(stored)[0] == JOB_FUNCTION  # JSON, never a pickle


def test_rq_info_reads_the_queue(redis_url: str, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    info = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", redis_url,
         "--serializer", "rq.serializers.JSONSerializer", QUEUE_NAME],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert f"{QUEUE_NAME} " in info.stdout and "1 queues, 1 jobs total" in info.stdout
