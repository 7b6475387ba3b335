"""Submitting and cancelling: every check is made before anything is written, so a refused
submission (an unknown competition, a missing folder, a used-up quota) leaves Redis as it was."""

from __future__ import annotations

import hashlib
import json
import os
import time

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec, is_image_reference, load_competition, preset_paths
from arbiter.server.hosting.queue import SERIALIZER, arbiter_queue, enqueue_submission, job_timeout_s
from arbiter.server.hosting.quotas import check_quota
from arbiter.server.hosting.submissions import (
    CANCELLED,
    ENDED,
    QUEUED,
    RUNNING,
    Submission,
    SubmissionStore,
    new_submission_id,
)

# Held while a participant's quota is counted and the submission added: two submissions of one
# participant at once cannot both take the last one.
QUOTA_LOCK_TIMEOUT_S = 10.0
QUOTA_LOCK_PREFIX = "arbiter:hosting:quota-lock"
CANCELLED_BY_ORGANISER = "cancelled by the organiser"
# The competition file each competition name stands for on this farm: a competition is named
# after its file, and its results folder, quotas and boards go by that name.
COMPETITIONS_KEY = "arbiter:hosting:competitions"


# Tables a submission's --set may not change: they bound the submission itself.
ORGANISER_TABLES = ("hosting", "leaderboard")


def competition_source(competition: str) -> dict[str, str]:
    """Which file a submission's competition is (its path, or a preset's name) and what it holds."""
    path = competition if os.path.isfile(competition) else preset_paths()[competition]
    with open(path, "rb") as handle:
        return {"file": competition, "sha256": hashlib.sha256(handle.read()).hexdigest()}


def check_one_file_per_name(conn: redis.Redis, name: str, source: dict[str, str]) -> None:
    """Two different competition files of one name would share its results folder, quotas and
    board: refused. The same file edited in place, or moved (the same text elsewhere), is the
    same competition."""
    known = conn.hget(COMPETITIONS_KEY, name)
    if known is None:
        return
    earlier = json.loads(known)
    if source["file"] != earlier.get("file") and source["sha256"] != earlier.get("sha256"):
        raise ConfigError(
            f"competition {name!r} on this farm is {earlier.get('file')}; {source['file']} is another file of "
            "the same name, whose submissions would share its results folder, quotas and leaderboard: a "
            "competition is named after its file, so name this one otherwise"
        )


def submission_spec(submission: Submission) -> CompetitionSpec:
    """The competition as the submission asked for it: its --set overrides, phase and debug."""
    spec = load_competition(submission.competition, list(submission.sets), phase=submission.phase)
    return spec.with_debug() if submission.debug else spec


def submit(
    conn: redis.Redis,
    *,
    competition: str,
    participant: str,
    agent: list[str],
    phase: int | str | None = None,
    debug: bool = False,
    sets: list[str] | None = None,
    workdir: str | None = None,
    image: str | None = None,
) -> Submission:
    """Queue one submission; returns its record (its id is the evaluation's). ``image``: the
    agent's container image; whether one is needed is the worker's backend's to say."""
    if not participant.strip():
        raise ConfigError("--participant is empty: name the participant the submission is for")
    if not agent:
        raise ConfigError("no agent command: use  arbiter submit [options] -- python my_agent.py")
    if workdir is not None:
        if not os.path.isdir(workdir):
            raise ConfigError(f"--workdir {workdir!r} is not a folder")
        workdir = os.path.abspath(workdir)
    if image is not None and not is_image_reference(image):
        raise ConfigError(f"--image {image!r} is not an image name (such as registry.example.org/team/agent:v3)")
    for assignment in sets or []:
        table = assignment.partition("=")[0].strip().split(".", 1)[0]
        if table == "debug":
            raise ConfigError(
                "--set debug: a debug submission is made with --debug, which gives it its own quota and keeps it off "
                "every board"
            )
        if table in ORGANISER_TABLES:
            raise ConfigError(
                f"--set {assignment.partition('=')[0].strip()}: a competition's [{table}] table (quotas, the agent's "
                "resources, how it ranks) comes from its competition file alone, never from a submission"
            )
    if os.path.isfile(competition):
        competition = os.path.abspath(competition)  # workers read the same file
    submission = Submission(
        id=new_submission_id(),
        competition=competition,
        participant=participant,
        agent=list(agent),
        phase=phase,
        debug=debug,
        sets=list(sets or []),
        workdir=workdir,
        image=image,
    )
    spec = submission_spec(submission)  # an unknown competition or a bad --set stops here
    submission.competition_name = spec.name
    submission.timeout_s = job_timeout_s(spec)
    source = competition_source(competition)
    check_one_file_per_name(conn, spec.name, source)
    store = SubmissionStore(conn)
    with conn.lock(f"{QUOTA_LOCK_PREFIX}:{participant}", timeout=QUOTA_LOCK_TIMEOUT_S):
        submission.submitted_at = time.time()
        check_quota(store, spec, participant, debug=debug, now=submission.submitted_at)
        with conn.pipeline() as pipe:  # the record and its job, both or neither
            # RQ opens the transaction (MULTI) itself, so its job goes into the pipeline first.
            enqueue_submission(arbiter_queue(conn), submission.id, submission.timeout_s, pipeline=pipe)
            store.add(submission, pipeline=pipe)
            pipe.hset(COMPETITIONS_KEY, spec.name, json.dumps(source))  # edited or moved: its file now
            pipe.execute()
    return submission


def cancel(conn: redis.Redis, submission_id: str) -> Submission:
    """Cancel a queued or running submission. A running one is stopped by its own worker, which
    watches its record: the evaluation ends as interrupted and its agent is stopped."""
    store = SubmissionStore(conn)
    found = store.get(submission_id)
    if found.state in ENDED:
        raise ConfigError(f"submission {submission_id} already ended ({found.state}); nothing to cancel")
    changed = store.change(
        submission_id, (QUEUED, RUNNING), state=CANCELLED, cause=CANCELLED_BY_ORGANISER, finished_at=time.time()
    )
    if changed is None:  # it ended meanwhile
        raise ConfigError(f"submission {submission_id} already ended ({store.get(submission_id).state})")
    # One that had an attempt keeps its job: the worker it goes to marks that attempt's results
    # folder as cancelled when its worker was lost after the evaluation ended (job.py). Where the
    # folder is on this machine and no attempt holds it, it is marked at once: the job may never
    # run again (its attempts spent), and a board built meanwhile would rank the evaluation.
    if found.attempts:
        from arbiter.server.hosting.job import mark_cancelled_folder

        mark_cancelled_folder(conn, changed)
    if found.state == QUEUED and found.attempts == 0:
        try:
            Job.fetch(submission_id, connection=conn, serializer=SERIALIZER).cancel()
        except NoSuchJobError:
            pass  # its job is gone already: the record alone says it is cancelled
    return changed
