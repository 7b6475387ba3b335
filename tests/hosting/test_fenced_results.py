"""A hosted attempt that lost its hold on its submission writes nothing more into its results
folder (results_fence.py): not an item, not an event, not the summary of its own ending (F22)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from harness import read_summary, wait_for
from hosting_farm import Workers, competition_file, seeded_agent, wait_state
from processes import alive, descendants

from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.job import LOCK_RENEW_S, LOCK_TTL_S, LockKeeper
from arbiter.server.hosting.submissions import FINISHED, RUNNING, SubmissionStore, lock_key
from arbiter.server.service import results_fence
from arbiter.server.service.events import EventLog
from arbiter.server.service.results import ResultsFenced, ResultsStore


def folder_bytes(folder: str) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes() for path in sorted(Path(folder).rglob("*")) if path.is_file()
    }


def test_a_worker_held_up_past_its_lock_leaves_the_folder_its_successor_finished(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers: Workers
) -> None:
    """A worker's whole process tree is stopped (as a paused machine would be) in the middle of an
    evaluation; its lock lapses, a second worker takes the submission over and finishes it. When
    the first goes on, its attempt stops, and the results folder stays byte for byte as the
    second attempt left it: its summary SUCCESS, not the first attempt's INTERRUPTED."""
    fast_now = tmp_path / "fast-now"
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(
        redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05, slow_until=str(fast_now))
    )
    store = SubmissionStore(redis_conn)
    first = workers.start()
    running = wait_state(store, submission.id, RUNNING, timeout_s=30)
    episodes = os.path.join(running.results, "episodes.jsonl")
    wait_for(lambda: os.path.exists(episodes) and os.path.getsize(episodes) > 0, timeout_s=30, what="a first item")
    held_up = [first.pid, *descendants(first.pid)]
    assert len(held_up) >= 3, "the worker, its work-horse and the agent"
    for pid in held_up:
        os.kill(pid, signal.SIGSTOP)
    try:
        fast_now.touch()
        workers.start()
        done = wait_state(store, submission.id, FINISHED, timeout_s=90)
        assert done.attempts == 2
        finished = folder_bytes(done.results)
        assert read_summary(done.results)["state"] == "SUCCESS"
    finally:
        for pid in held_up:
            os.kill(pid, signal.SIGCONT)
    horse_and_agent = held_up[1:]
    wait_for(lambda: not any(alive(pid) for pid in horse_and_agent), timeout_s=30, what="the held-up attempt's end")
    assert folder_bytes(done.results) == finished
    assert store.get(submission.id).state == FINISHED and store.get(submission.id).attempts == 2
    said = workers.log_of(first)
    assert "summary.json not written (the results folder is no longer this evaluation's to write" in said


def test_a_refused_fence_leaves_the_results_as_they_were(tmp_path) -> None:
    """Every write of the store and the event log asks the fence first; a refusal changes no file,
    and is remembered as the cause the evaluation stops with."""
    folder = str(tmp_path / "results")
    store = ResultsStore(folder, ["index", "reward"], lambda record: record)
    events = EventLog(path=store.events_path, redis_url="redis://127.0.0.1:1", service_id="T1")
    store.add_episodes([{"index": 0, "reward": 1.0, "last_of_item": True}])
    store.write_summary({"state": "RUNNING"})
    events.emit("episode", index=0)
    before = folder_bytes(folder)
    with results_fence.fenced(lambda: "another attempt holds it"):
        with pytest.raises(ResultsFenced, match="another attempt holds it"):
            store.add_episodes([{"index": 1, "reward": 2.0, "last_of_item": True}])
        with pytest.raises(ResultsFenced):
            store.write_summary({"state": "INTERRUPTED"})
        with pytest.raises(OSError, match="another attempt holds it"):
            store.write_replay(1, {"actions": []})
        events.emit("finished", state="INTERRUPTED")
    events.close(flush_s=0)
    assert isinstance(store.unwritable, ResultsFenced)
    assert events.unwritten == 1
    assert folder_bytes(folder) == before
    store.unwritable = None
    store.add_episodes([{"index": 1, "reward": 2.0, "last_of_item": True}])  # no fence: written
    assert len(Path(store.episodes_path).read_text().splitlines()) == 2


def test_the_keeper_lets_a_held_up_attempt_write_only_while_redis_says_the_lock_is_its_own(redis_url) -> None:
    """Renewals on time: writing is allowed without asking Redis. Late ones: the keeper asks Redis,
    which renews a lock still held, and refuses for good once another holder has it."""
    conn = redis.Redis.from_url(redis_url)
    key = lock_key(f"fence-{time.monotonic_ns()}")
    lock = conn.lock(key, timeout=LOCK_TTL_S, thread_local=False)
    assert lock.acquire(blocking=False)
    keeper = LockKeeper(lock, SubmissionStore(conn), "S1", acquired_at=time.monotonic())  # never started
    assert keeper.refusal() is None
    conn.pexpire(key, 200)  # the lock about to lapse, as Redis sees a lock whose holder was held up
    keeper.renewed_at -= LOCK_TTL_S  # and so the keeper sees its last renewal
    assert keeper.refusal() is None, "the lock was still its own: renewed"
    assert conn.pttl(key) > (LOCK_TTL_S - LOCK_RENEW_S) * 1000
    conn.delete(key)
    assert conn.lock(key, timeout=LOCK_TTL_S).acquire(blocking=False), "another attempt takes the lock"
    keeper.renewed_at -= LOCK_TTL_S
    assert "another attempt may be evaluating the submission" in (keeper.refusal() or "")
    assert keeper.lost and keeper.refusal() is not None
    conn.delete(key)
    conn.close()
