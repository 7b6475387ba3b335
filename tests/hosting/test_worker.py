"""`arbiter worker` processes on a real Redis: a burst, a cancellation in the middle of an
evaluation, and a worker lost on the last attempt of its submission."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import redis
from harness import read_summary, wait_for
from hosting_farm import Workers, arbiter, competition_file, kill_tree, seeded_agent, wait_state
from processes import alive, descendants
from rq.job import Job

from arbiter.server.hosting.farm import CANCELLED_BY_ORGANISER, submit
from arbiter.server.hosting.private_redis import FOLDER_PREFIX
from arbiter.server.hosting.queue import SERIALIZER, arbiter_queue, enqueue_submission
from arbiter.server.hosting.submissions import (
    CANCELLED,
    FAILED,
    FINISHED,
    INFRASTRUCTURE_FAULT,
    RUNNING,
    SubmissionStore,
)


def test_a_burst_worker_evaluates_the_queue_and_exits(redis_conn, tiny_tests, tmp_path, workers: Workers) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    first = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    debug = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent(), debug=True)
    worker = workers.start("--burst")
    assert worker.wait(timeout=60) == 0, workers.log_of(worker)
    store = SubmissionStore(redis_conn)
    assert store.get(first.id).state == store.get(debug.id).state == FINISHED
    assert read_summary(store.get(debug.id).results)["debug"] is True
    assert read_summary(store.get(first.id).results)["debug"] is False


def test_a_running_submission_is_cancelled_within_seconds(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05))
    worker = workers.start()
    store = SubmissionStore(redis_conn)
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    evaluating = wait_for(lambda: len(descendants(worker.pid)) >= 2 and descendants(worker.pid), what="horse + agent")

    done = arbiter("cancel", "--redis-url", redis_url, submission.id)
    assert done.returncode == 0, done.stderr
    cancelled_at = time.monotonic()
    wait_for(lambda: not any(alive(pid) for pid in evaluating), timeout_s=10, what="the agent and evaluator stopped")
    assert time.monotonic() - cancelled_at < 5
    assert worker.poll() is None, "the worker itself goes on"
    found = store.get(submission.id)
    assert found.state == CANCELLED and found.score is None
    summary = read_summary(running.results)
    assert summary["state"] == "INTERRUPTED"
    assert Job.fetch(submission.id, connection=redis_conn, serializer=SERIALIZER).get_status() == "finished"


def test_a_submission_cancelled_after_its_evaluation_ended_is_never_ranked(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    """The agent lingers after submitting: the evaluation has ended SUCCESS when the organiser
    cancels. The farm says cancelled, and so does the results folder, which no board ranks."""
    from arbiter.server.core.competition import load_competition
    from arbiter.server.leaderboard.board import build_board

    competition = competition_file(tmp_path, tiny_tests)
    lingering = ["sh", "-c", seeded_agent()[2].removeprefix("exec ") + "; sleep 60"]
    submission = submit(redis_conn, competition=competition, participant="alice", agent=lingering)
    workers.start()
    store = SubmissionStore(redis_conn)
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    summary_file = os.path.join(running.results, "summary.json")
    ended = lambda: os.path.exists(summary_file) and read_summary(running.results)["state"] == "SUCCESS"  # noqa: E731
    wait_for(ended, timeout_s=30, what="the evaluation's end")
    done = arbiter("cancel", "--redis-url", redis_url, submission.id)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: Job.fetch(submission.id, connection=redis_conn, serializer=SERIALIZER).get_status() == "finished",
             timeout_s=30, what="the attempt's end")  # fmt: skip
    assert store.get(submission.id).state == CANCELLED
    summary = read_summary(running.results)
    assert summary["state"] == "SUCCESS" and summary["submission"]["cancelled"] == CANCELLED_BY_ORGANISER
    board = build_board(load_competition(competition), str(tmp_path / "results"))
    assert board["rows"] == [] and "the submission was cancelled" in board["unranked"][0]["cause"]


def test_a_worker_lost_on_the_last_attempt_fails_the_submission(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05))
    job = Job.fetch(submission.id, connection=redis_conn, serializer=SERIALIZER)
    job.retries_left = 0  # as after its retries
    job.save()
    store = SubmissionStore(redis_conn)
    first = workers.start()
    wait_state(store, submission.id, RUNNING, timeout_s=30)
    wait_for(lambda: os.path.exists(os.path.join(store.get(submission.id).results, "events.jsonl")), what="started")
    kill_tree(first.pid)
    workers.start()

    found = wait_state(store, submission.id, FAILED, timeout_s=30)
    assert found.fault == INFRASTRUCTURE_FAULT and "lost" in found.cause and found.attempts == 1


def test_a_worker_stopped_at_once_takes_the_agent_with_it(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05))
    worker = workers.start()
    running = wait_state(SubmissionStore(redis_conn), submission.id, RUNNING, timeout_s=30)
    evaluating = wait_for(lambda: len(descendants(worker.pid)) >= 2 and descendants(worker.pid), what="horse + agent")
    assert private_redis_folders(evaluating), "the horse's Redis has a folder named after it"

    # RQ takes the first stop signal for "finish the job first" (it notes when in the worker's
    # record), and a second one, a second or more later, for "now": it kills the work-horse.
    worker.send_signal(signal.SIGTERM)
    worker_key = f"rq:worker:{running.worker}"
    wait_for(lambda: redis_conn.hget(worker_key, "shutdown_requested_date"), what="the warm shutdown noted")
    noted = time.monotonic()
    wait_for(lambda: time.monotonic() - noted > 1.2, what="RQ's window for a repeated signal")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) is not None
    wait_for(lambda: not any(alive(pid) for pid in evaluating), timeout_s=5, what="the agent stopped too")
    # The horse's Redis died with it, and the worker removed that Redis's folder once it reaped it.
    assert not private_redis_folders(evaluating)


def private_redis_folders(starters: list[int]) -> list[Path]:
    """The folders of evaluation Redis servers started by one of ``starters``."""
    temp = Path(tempfile.gettempdir())
    return [folder for pid in starters for folder in temp.glob(f"{FOLDER_PREFIX}{pid}-*")]


def test_a_job_enqueued_again_while_it_runs_is_evaluated_once(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    delivered_twice = tmp_path / "delivered-twice"  # the agent plays slowly until then: the job runs on
    agent = seeded_agent(0.02, slow_until=str(delivered_twice))
    submission = submit(redis_conn, competition=competition, participant="alice", agent=agent)
    store = SubmissionStore(redis_conn)
    first = workers.start()
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    enqueue_submission(arbiter_queue(redis_conn), submission.id, running.timeout_s)  # delivered again
    second = workers.start()
    wait_for(lambda: store.get(submission.id).deliveries == 2, timeout_s=30, what="the second delivery")
    assert store.get(submission.id).state == RUNNING, "the second delivery came while the first attempt ran"
    delivered_twice.touch()

    done = wait_state(store, submission.id, FINISHED, timeout_s=60)
    assert done.attempts == 1 and done.deliveries == 2
    assert done.worker == running.worker == f"arbiter-{socket.gethostname()}-{first.pid}"
    assert second.poll() is None
    results = os.listdir(os.path.dirname(done.results))
    assert results == [submission.id]
    assert read_summary(done.results)["submission"]["attempts"] == 1


@contextlib.contextmanager
def busy_on_a_farm_of_its_own(tiny_tests, tmp_path, step_delay_s: float = 0.2) -> Iterator[SimpleNamespace]:
    """A worker evaluating one submission on a farm Redis of the test's own (which the test may
    hang or kill): the Redis, the worker, the submission's store and the attempt's processes."""
    from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port

    farm_redis = EmbeddedRedis(port=free_port()).start()
    workers = Workers(farm_redis.url, str(tmp_path / "results"))
    try:
        conn = redis.Redis.from_url(farm_redis.url, socket_timeout=10)
        competition = competition_file(tmp_path, tiny_tests)
        submission = submit(conn, competition=competition, participant="alice", agent=seeded_agent(step_delay_s))
        worker = workers.start()
        store = SubmissionStore(conn)
        wait_state(store, submission.id, RUNNING, timeout_s=30)
        evaluating = wait_for(lambda: len(descendants(worker.pid)) >= 2 and descendants(worker.pid),
                              what="the work-horse and the agent")  # fmt: skip
        yield SimpleNamespace(redis=farm_redis, worker=worker, workers=workers, store=store, submission=submission,
                              evaluating=evaluating)  # fmt: skip
    finally:
        workers.stop_all()
        if farm_redis.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(farm_redis.pid, signal.SIGCONT)  # a test that hung it
        farm_redis.stop()


def test_a_busy_worker_whose_redis_hangs_exits_as_a_failure_not_as_done(tiny_tests, tmp_path) -> None:
    """RQ's loop quits when the farm's Redis does not answer a busy worker in time; a worker runs
    until it is told to stop, so it exits with status 2 and says so, for a supervisor to restart
    it (status 0 would read as a clean stop), taking the attempt it watched along."""
    with busy_on_a_farm_of_its_own(tiny_tests, tmp_path) as farm:
        os.kill(farm.redis.pid, signal.SIGSTOP)
        try:  # hung until RQ's loop gives up on it, then back (a short outage)
            wait_for(lambda: "quitting" in farm.workers.log_of(farm.worker), timeout_s=60, what="RQ's loop giving up")
        finally:
            os.kill(farm.redis.pid, signal.SIGCONT)
        assert farm.worker.wait(timeout=60) == 2, farm.workers.log_of(farm.worker)
        assert "stopped on its own" in farm.workers.log_of(farm.worker)
        # Nothing of its attempt runs on unwatched.
        wait_for(lambda: not any(alive(pid) for pid in farm.evaluating), timeout_s=10, what="the attempt stopped")


def test_a_busy_worker_whose_redis_dies_takes_the_attempt_it_watched_along(tiny_tests, tmp_path) -> None:
    """The farm's Redis killed while a worker evaluates: RQ's loop raises instead of quitting. The
    worker exits with status 2 all the same, and its attempt does not run on unwatched."""
    with busy_on_a_farm_of_its_own(tiny_tests, tmp_path) as farm:
        os.kill(farm.redis.pid, signal.SIGKILL)
        assert farm.worker.wait(timeout=60) == 2, farm.workers.log_of(farm.worker)
        assert "stopped on an error" in farm.workers.log_of(farm.worker)
        wait_for(lambda: not any(alive(pid) for pid in farm.evaluating), timeout_s=10, what="the attempt stopped")


def agents_of(pid: int) -> list[int]:
    """The seeded agents among ``pid``'s descendants."""
    found = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as handle:
                if b"seeded_agent_main.py" in handle.read():
                    found.append(child)
        except OSError:
            pass
    return found


def test_an_attempt_cut_off_from_the_farm_stops_before_its_lock_can_lapse(tiny_tests, tmp_path) -> None:
    """The farm's Redis stops answering while a worker evaluates: the attempt stops itself before
    its lock lapses, so no other worker's attempt can overlap it, and once the farm is back the
    submission is evaluated to its end, resumed."""
    from arbiter.server.hosting.job import LOCK_TTL_S

    with busy_on_a_farm_of_its_own(tiny_tests, tmp_path, step_delay_s=0.1) as farm:
        agent = wait_for(lambda: next(iter(agents_of(farm.worker.pid)), None), what="the agent")
        os.kill(farm.redis.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: not alive(agent), timeout_s=LOCK_TTL_S + 3, what="the attempt stopping itself")
        finally:
            os.kill(farm.redis.pid, signal.SIGCONT)
        done = wait_state(farm.store, farm.submission.id, FINISHED, timeout_s=90)
        assert done.attempts == 2
        assert read_summary(done.results)["state"] == "SUCCESS"


def test_a_busy_worker_rides_out_a_restart_of_the_farm_s_redis(tiny_tests, tmp_path):
    """The farm's Redis (its data kept on disk) killed and started again in the middle of an
    evaluation: the busy worker's heartbeat fails meanwhile, and the worker goes on watching its
    horse instead of quitting; the evaluation ends SUCCESS, on the attempt that was running."""
    import subprocess

    from arbiter.server.cli.embedded_redis import free_port, redis_server_binary

    port, folder = free_port(), tmp_path / "farm-redis"
    folder.mkdir()
    url = f"redis://127.0.0.1:{port}/0"

    def start_redis() -> subprocess.Popen:
        server = subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: _answers(url), what="the farm's Redis answering")
        return server

    server = start_redis()
    workers = Workers(url, str(tmp_path / "results"))
    try:
        submission = submit(redis.Redis.from_url(url), competition=competition_file(tmp_path, tiny_tests),
                            participant="alice", agent=seeded_agent(0.05))  # fmt: skip
        worker = workers.start()
        wait_state(SubmissionStore(redis.Redis.from_url(url)), submission.id, RUNNING, timeout_s=30)
        server.kill()
        server.wait()
        wait_for(lambda: "heartbeat not sent" in workers.log_of(worker), timeout_s=10, what="a heartbeat refused")
        server = start_redis()
        done = wait_state(SubmissionStore(redis.Redis.from_url(url)), submission.id, FINISHED, timeout_s=90)
        assert worker.poll() is None, workers.log_of(worker)
        assert done.attempts == 1 and read_summary(done.results)["state"] == "SUCCESS"
        assert "Traceback" not in workers.log_of(worker)
    finally:
        workers.stop_all()
        server.kill()
        server.wait()


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.exceptions.ConnectionError:
        return False


def test_a_worker_killed_alone_takes_its_evaluation_along_and_another_goes_on_with_it(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    """SIGKILL to the worker process only (not its horse): the kernel stops the horse too (its
    evaluation ends INTERRUPTED, its agent with it), so no attempt goes on unwatched, and another
    worker goes on with the submission after its last finished episode."""
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05))
    store = SubmissionStore(redis_conn)
    first = workers.start()
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    evaluating = wait_for(lambda: len(descendants(first.pid)) >= 2 and descendants(first.pid), what="horse + agent")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in evaluating), timeout_s=15, what="the horse and the agent gone")
    assert read_summary(running.results)["state"] == "INTERRUPTED"
    workers.start()
    done = wait_state(store, submission.id, FINISHED, timeout_s=90)
    assert done.attempts == 2 and read_summary(done.results)["state"] == "SUCCESS"
