"""The job a worker runs for one submission, called as RQ calls it (in a forked child: the
evaluator installs its signal handlers in the process it runs in)."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import redis
from harness import in_forked_child, read_episodes, read_summary, wait_for
from hosting_farm import competition_file, seeded_agent, wait_state

from arbiter.server.hosting import job
from arbiter.server.hosting.backends import LocalBackend
from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.submissions import AGENT_FAULT, FAILED, FINISHED, RUNNING, SubmissionStore, lock_key


def run_job(redis_url: str, results_root: str, submission_id: str) -> str:
    """``evaluate_submission`` in a child process, as a work-horse runs it; returns its words."""

    def evaluate() -> str:
        job.configure(job.WorkerSettings(redis_url, results_root, LocalBackend(), worker_name="test-worker"))
        return job.evaluate_submission(submission_id)

    return in_forked_child(evaluate)[1]


def test_a_job_delivered_twice_evaluates_once(redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    root = str(tmp_path / "results")

    first = run_job(redis_url, root, submission.id)
    store = SubmissionStore(redis_conn)
    done = store.get(submission.id)
    assert done.state == FINISHED, first
    assert done.results == os.path.join(root, "farm", submission.id)
    summary_before = read_summary(done.results)
    episodes_before = read_episodes(done.results)
    mtimes = {name: os.stat(os.path.join(done.results, name)).st_mtime_ns for name in os.listdir(done.results)}

    second = run_job(redis_url, root, submission.id)
    assert "already finished" in second
    again = store.get(submission.id)
    assert again == done, "a finished submission is never rewritten"
    assert again.attempts == 1 and again.deliveries == 1
    assert read_summary(done.results) == summary_before and read_episodes(done.results) == episodes_before
    assert {name: os.stat(os.path.join(done.results, name)).st_mtime_ns for name in os.listdir(done.results)} == mtimes


def test_a_delivery_while_another_worker_holds_the_submission_evaluates_nothing(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    # Another worker's lock, renewed for longer than the delivery waits for it.
    redis_conn.set(lock_key(submission.id), "another-worker", px=int((job.LOCK_TTL_S + 3) * 1000))

    words = run_job(redis_url, str(tmp_path / "results"), submission.id)

    assert "another worker" in words
    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == "queued" and found.attempts == 0 and found.deliveries == 1
    assert not os.path.exists(tmp_path / "results")


def test_an_agent_that_exits_before_its_handshake_ends_the_evaluation_at_once(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    idle_s = 30  # what waiting for a client that never comes would cost
    competition = competition_file(tmp_path, tiny_tests, idle_s=idle_s)
    submission = submit(
        redis_conn, competition=competition, participant="alice", agent=["sh", "-c", "echo crashed >&2; exit 3"]
    )
    started = time.monotonic()
    run_job(redis_url, str(tmp_path / "results"), submission.id)
    elapsed = time.monotonic() - started

    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == FAILED and found.fault == AGENT_FAULT
    assert "exited with status 3" in found.cause
    assert elapsed < idle_s / 3, f"ended after {elapsed:.1f} s"


def test_an_agent_command_that_cannot_start_fails_the_submission_as_the_agent_s_fault(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=["./no-such-agent"])
    run_job(redis_url, str(tmp_path / "results"), submission.id)
    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == FAILED and found.fault == AGENT_FAULT
    assert "no-such-agent" in found.cause and "does not exist" in found.cause


def test_the_summary_names_the_submission(redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="carol", agent=seeded_agent(), debug=True)
    run_job(redis_url, str(tmp_path / "results"), submission.id)
    found = SubmissionStore(redis_conn).get(submission.id)
    summary = read_summary(found.results)
    submitted_at = datetime.datetime.fromtimestamp(submission.submitted_at, datetime.UTC)
    assert summary["submission"] == {
        "id": submission.id,
        "participant": "carol",
        "submitted_at": submitted_at.isoformat(timespec="milliseconds"),
        "competition": "farm",
        "phase": None,
        "debug": True,
        "attempts": 1,
    }
    assert summary["debug"] is True
    assert summary["leaderboard"]["figures"][0]["value"] == summary["score"]["primary"]


def test_an_attempt_the_farm_cut_short_names_its_submission_from_the_first_write(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    """The evaluation carries the submission's identity itself: an attempt stopped before the job
    stamps the summary (the farm lost the worker) leaves a summary that says whose it is."""
    competition = competition_file(tmp_path, tiny_tests)
    agent = seeded_agent(step_delay_s=0.02)
    submission = submit(redis_conn, competition=competition, participant="dave", agent=agent)
    attempt = SubmissionStore(redis_conn).change(submission.id, ("queued",), state=RUNNING, attempts=1)
    results = str(tmp_path / "results")

    def stop_after_the_first_episode() -> None:
        wait_for(lambda: os.path.exists(os.path.join(results, "episodes.jsonl")), what="the first episode")
        os.kill(os.getpid(), signal.SIGTERM)  # what the worker's lock keeper sends when the farm stops it

    def evaluate_and_stop() -> str:
        from arbiter.server.core.competition import load_competition

        threading.Thread(target=stop_after_the_first_episode, daemon=True).start()
        evaluated = LocalBackend().evaluate(load_competition(competition), attempt, results_dir=results, resume=False)
        return evaluated.summary["state"]

    assert in_forked_child(evaluate_and_stop)[1] == "INTERRUPTED"
    identity = read_summary(results)["submission"]
    submitted_at = datetime.datetime.fromtimestamp(submission.submitted_at, datetime.UTC)
    when = submitted_at.isoformat(timespec="milliseconds")
    assert identity == {"participant": "dave", "id": submission.id, "submitted_at": when, "debug": False}


def test_an_attempt_that_lost_its_lock_stops_and_records_nothing(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05))
    store = SubmissionStore(redis_conn)
    words: dict[str, str] = {}
    attempt = threading.Thread(
        target=lambda: words.update(text=run_job(redis_url, str(tmp_path / "results"), submission.id)), daemon=True
    )
    attempt.start()
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    wait_for(lambda: os.path.exists(os.path.join(running.results, "events.jsonl")), what="the evaluation started")
    # As after this worker was held up past the lock's lifetime: another one holds it now.
    redis_conn.set(lock_key(submission.id), "another-worker", px=60_000)
    stopped_at = time.monotonic()
    attempt.join(timeout=15)

    assert not attempt.is_alive() and time.monotonic() - stopped_at < 5
    assert "lock was lost" in words["text"]
    found = store.get(submission.id)
    assert found.state == RUNNING and found.attempts == 1, "left to the worker that holds it"
    assert redis_conn.get(lock_key(submission.id)) == b"another-worker"
