"""The organiser's story, end to end: real redis-server, real `arbiter worker` processes, real
agents. Two participants submit the same deterministic agent; two workers take one each; one
worker is lost with everything it started in the middle of its evaluation. Its submission is
picked up again, continues from its last finished episode, and ends with the score of the
uninterrupted one, once."""

from __future__ import annotations

import json
import os
import time

import redis
from harness import read_episodes, read_events, read_summary, wait_for
from hosting_farm import Workers, arbiter, competition_file, kill_tree, seeded_agent, wait_lines, wait_state
from processes import alive

from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.submissions import CANCELLED, FINISHED, RUNNING, SubmissionStore, lock_key

# A step delay that makes an evaluation of the tiny test set last a few seconds: long enough to
# lose a worker between two episodes.
STEP_DELAY_S = 0.01


def test_a_lost_worker_costs_nothing_and_scores_once(
    redis_url: str, redis_conn: redis.Redis, tiny_tests: str, tmp_path, workers: Workers
) -> None:
    competition = competition_file(tmp_path, tiny_tests, hosting="daily_submissions = 5")
    store = SubmissionStore(redis_conn)
    alice = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(STEP_DELAY_S))
    bob = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent(STEP_DELAY_S))
    workers.start()
    workers.start()

    # Lose the worker on alice's submission once its first episode is written.
    running = wait_state(store, alice.id, RUNNING, timeout_s=30)
    episodes_path = os.path.join(running.results, "episodes.jsonl")
    wait_lines(episodes_path, 1)
    lost_worker = workers.by_name(running.worker)
    killed = kill_tree(lost_worker.pid)
    lost_at = time.monotonic()
    assert len(killed) >= 3, f"the worker, its work-horse and the agent: {killed}"
    wait_for(lambda: not any(alive(pid) for pid in killed), timeout_s=5, what="the lost worker's processes gone")
    first_episode = read_episodes(running.results)[0]

    ended = wait_state(store, alice.id, FINISHED, timeout_s=60)
    assert time.monotonic() - lost_at < 30, "picked up again within a bounded time"
    uninterrupted = wait_state(store, bob.id, FINISHED, timeout_s=60)

    assert ended.attempts == 2 and uninterrupted.attempts == 1
    assert ended.worker != running.worker
    assert ended.score == uninterrupted.score and ended.score is not None
    episodes = read_episodes(ended.results)
    assert [record["env"] for record in episodes] == [record["env"] for record in read_episodes(uninterrupted.results)]
    assert len({record["env"] for record in episodes}) == len(episodes), "each episode once"
    assert episodes[0] == first_episode, "the episode finished before the loss was kept, not played again"
    started = [event for event in read_events(ended.results) if event.get("event") == "started"]
    assert [event.get("resumed") for event in started] == [False, True]
    summary = read_summary(ended.results)
    assert summary["submission"]["id"] == alice.id and summary["submission"]["participant"] == "alice"
    assert summary["score"]["primary"] == ended.score
    assert os.path.exists(os.path.join(ended.results, "report.html"))

    # The organiser's list: both finished, with their scores.
    listed = arbiter("submissions", "--redis-url", redis_url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert {rows[alice.id]["participant"], rows[bob.id]["participant"]} == {"alice", "bob"}
    assert rows[alice.id]["state"] == rows[bob.id]["state"] == FINISHED
    assert rows[alice.id]["score"] == rows[bob.id]["score"] == ended.score
    table = arbiter("submissions", "--redis-url", redis_url, "--participant", "bob")
    assert bob.id in table.stdout and alice.id not in table.stdout


def lost_after_its_summary(redis_conn: redis.Redis, tiny_tests: str, tmp_path, workers: Workers) -> tuple:
    """alice's submission, its worker lost once the evaluation wrote its summary and before it
    recorded the ending (the agent was still exiting): the competition file, the store, the
    submission and its running record."""
    competition = competition_file(tmp_path, tiny_tests)
    store = SubmissionStore(redis_conn)
    lingering = [*seeded_agent()[:2], seeded_agent()[2].removeprefix("exec ") + "; sleep 30"]  # exits late
    alice = submit(redis_conn, competition=competition, participant="alice", agent=lingering)
    lost_worker = workers.start()
    running = wait_state(store, alice.id, RUNNING, timeout_s=30)
    wait_for(lambda: os.path.exists(os.path.join(running.results, "summary.json")), timeout_s=30, what="the summary")
    kill_tree(lost_worker.pid)
    return competition, store, alice, running


def test_a_cancel_marks_the_folder_of_an_ended_evaluation_no_worker_will_take_up_again(
    redis_url: str, redis_conn: redis.Redis, tiny_tests: str, tmp_path, workers: Workers
) -> None:
    """As below, but no worker comes back for the job (its attempts spent, or the farm drained):
    `arbiter cancel`, which sees the folder and finds no attempt holding it, marks it itself, so
    that a board built straight after does not rank the cancelled evaluation."""
    competition, store, alice, running = lost_after_its_summary(redis_conn, tiny_tests, tmp_path, workers)
    wait_for(lambda: not redis_conn.exists(lock_key(alice.id)), timeout_s=10, what="the lost worker's lock to lapse")
    cancelled = arbiter("cancel", "--redis-url", redis_url, alice.id)
    assert cancelled.returncode == 0, cancelled.stderr
    marked = read_summary(running.results)["submission"]
    assert marked["cancelled"] and store.get(alice.id).state == CANCELLED
    board = arbiter("leaderboard", "--results-root", str(tmp_path / "results"), "--competition", competition, "--json")
    assert board.returncode == 0, board.stderr
    assert json.loads(board.stdout)["rows"] == []


def test_a_submission_cancelled_after_its_lost_evaluation_ended_is_never_ranked(
    redis_url: str, redis_conn: redis.Redis, tiny_tests: str, tmp_path, workers: Workers
) -> None:
    """The worker is lost once the evaluation wrote its SUCCESS summary, before it recorded the
    ending (the agent was still exiting); the organiser then cancels the submission. The folder
    must agree with the farm: its summary says cancelled, and the leaderboard does not rank it."""
    competition, store, alice, running = lost_after_its_summary(redis_conn, tiny_tests, tmp_path, workers)
    assert read_summary(running.results)["state"] == "SUCCESS"
    cancelled = arbiter("cancel", "--redis-url", redis_url, alice.id)
    assert cancelled.returncode == 0, cancelled.stderr
    workers.start()
    wait_for(
        lambda: "cancelled" in read_summary(running.results).get("submission", {}),
        timeout_s=20,
        what="the folder marked cancelled",
    )
    assert store.get(alice.id).state == CANCELLED
    board = arbiter("leaderboard", "--results-root", str(tmp_path / "results"), "--competition", competition, "--json")
    assert board.returncode == 0, board.stderr
    assert json.loads(board.stdout)["rows"] == []
