"""An item's notices (its event, the progress line) and its rows in results.csv are given while its
record goes to the disk: its records are written to episodes.jsonl first and the disk starts
writing them; the notices go out (and the next item opens) meanwhile; then the sync, and only
then the reply of the step that ended the item. The agent, which waits for that sync anyway,
hardly waits for the notices, and they do not hold up its next request. A sync the disk refuses
takes the item back out."""

from __future__ import annotations

import csv
import errno
import os
import time

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, read_events, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import EvaluationError
from arbiter.server.service import durable

SLOW_NOTICE_S = 0.2
# An item's sync is timed against SLOW_NOTICE_S, and one test has a 0.2 s step budget: a disk or a
# CPU busy with another test's work would change what they find.
pytestmark = pytest.mark.alone


def test_the_notices_go_out_before_the_records_sync_and_the_reply_after_it(
    redis_url, service_id, tmp_path, monkeypatch
):
    results = str(tmp_path / "results")
    syncs: list[tuple[float, float]] = []  # (called, returned) per sync of an item's records
    real_sync = durable.sync_data

    def timed_sync(handle: int) -> None:
        called = time.monotonic()
        real_sync(handle)
        syncs.append((called, time.monotonic()))

    monkeypatch.setattr(durable, "sync_data", timed_sync)
    notices: list[tuple[float, bool, bool]] = []  # per notice: when, item written, its row in the table
    replied_at: list[float] = []
    with running_service(
        counting_competition(num_episodes=2, length=3),
        tests=None,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        evaluation = service.evaluation
        give_notice = evaluation.on_episode
        assert give_notice is not None

        def timed_notice(record, evaluation_now):
            written = record["index"] in {r["index"] for r in read_episodes(results)}
            notices.append((time.monotonic(), written, table_rows(results) == record["index"] + 1))
            time.sleep(SLOW_NOTICE_S)  # a notice that takes long: not part of making the item durable
            give_notice(record, evaluation_now)

        evaluation.on_episode = timed_notice
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        for _ in range(2):
            env.reset()
            terminated = False
            while not terminated:
                _, _, terminated, _, _ = env.step(1)
            replied_at.append(time.monotonic())
        env.reset()
        assert env.finished
        env.submit()
        env.close()
        summary = finish(outcome)

    assert [(written, row) for _, written, row in notices] == [(True, True), (True, True)]
    assert len(syncs) == len(notices) == len(replied_at) == 2
    for (noticed, _, _), (sync_called, synced), replied in zip(notices, syncs, replied_at, strict=True):
        assert noticed < sync_called and synced < replied
    assert summary["state"] == "SUCCESS"
    events = read_events(results)
    assert [e["event"] for e in events] == ["started", "episode", "episode", "finished"]
    records = read_episodes(results)
    assert [e["index"] for e in events[1:3]] == [r["index"] for r in records] == [0, 1]
    # the last notice shows the score the evaluation ends with
    assert events[2]["score_so_far"] == summary["score"]["primary"]
    assert [e["episodes_done"] for e in events[1:3]] == [1, 2]
    # what making each item durable took: its write and its sync, not the notices between
    durable_s = summary["timing"]["record_durable_s"]
    assert durable_s["n"] == 2 and durable_s["max"] < SLOW_NOTICE_S


def table_rows(results: str) -> int:
    """How many rows results.csv has (one per record of episodes.jsonl, in its order)."""
    try:
        with open(os.path.join(results, "results.csv"), newline="", encoding="utf-8") as handle:
            return len(list(csv.DictReader(handle)))
    except FileNotFoundError:
        return 0


def serving(competition, results: str, redis_url: str, service_id: str, resume: bool = False):
    return running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=resume
    )


def resumed_to_the_end(
    competition, results: str, redis_url: str, service_id: str, episodes: int = 0
) -> tuple[dict, int]:
    """``arbiter serve --resume`` of an evaluation with ``episodes`` left to play, played: its
    summary, and how many rows results.csv had once the resume had started."""
    with serving(competition, results, redis_url, service_id, resume=True) as (_, outcome):
        rows_at_start = table_rows(results)
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, episodes)
        env.reset()
        assert env.finished
        env.submit()
        env.close()
        return finish(outcome), rows_at_start


def refuse_the_table_after_its_first_row(results: str) -> None:
    """Once results.csv has the first item's row, it can no longer be opened for writing."""
    table = os.path.join(results, "results.csv")
    wait_for(lambda: table_rows(results) == 1, what="the first item's row")
    os.remove(table)
    os.mkdir(table)


def last_step_refused(env: RemoteEnv, match: str) -> None:
    """The next item (3 steps) played to its last step, which is answered with an error matching ``match``."""
    env.reset()
    env.step(1)
    env.step(1)
    with pytest.raises(EvaluationError, match=match):
        env.step(1)


def play_episodes(env: RemoteEnv, episodes: int, after_each=lambda episode: None) -> None:
    for episode in range(episodes):
        env.reset()
        terminated = False
        while not terminated:
            _, _, terminated, _, _ = env.step(1)
        after_each(episode)


def test_an_items_rows_are_in_results_csv_when_its_reply_comes(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    rows_when_replied: list[int] = []
    with serving(counting_competition(num_episodes=2, length=3), results, redis_url, service_id) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 2, lambda episode: rows_when_replied.append(table_rows(results)))
        env.reset()
        env.submit()
        env.close()
        summary = finish(outcome)

    assert rows_when_replied == [1, 2]
    assert summary["state"] == "SUCCESS"
    assert table_rows(results) == len(read_episodes(results)) == 2


def test_a_table_refused_with_its_notices_is_told_at_the_next_items_end(redis_url, service_id, tmp_path, caplog):
    # Item 1's rows are refused as its notices go out: item 1 stands and the evaluation goes on.
    # Item 2's end writes them first, is refused again, and its last step is answered with the
    # cause: the agent is told at once, the evaluation stops, item 2 is not recorded. The resume
    # rebuilds the table and plays item 2 again.
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=3, length=3)
    with serving(competition, results, redis_url, service_id) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 2, lambda episode: episode == 0 and refuse_the_table_after_its_first_row(results))
        last_step_refused(env, r"results.csv: Is a directory")  # item 2's
        summary = finish(outcome)
        env.close()
    assert "results.csv refused the rows due (1)" in caplog.text
    assert summary["state"] == "INTERRUPTED"
    assert "(results.csv: Is a directory)" in summary["termination_cause"]
    assert [r["index"] for r in read_episodes(results)] == [0, 1]  # item 1 stands, item 2 is not written

    os.rmdir(os.path.join(results, "results.csv"))
    resumed, rows_at_start = resumed_to_the_end(competition, results, redis_url, service_id, episodes=1)
    assert rows_at_start == 2  # rebuilt by the resume
    assert resumed["state"] == "SUCCESS"
    assert table_rows(results) == len(read_episodes(results)) == 3


def test_a_sync_the_disk_refuses_takes_the_item_back_and_the_resume_plays_it_again(
    redis_url, service_id, tmp_path, monkeypatch
):
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=3, length=3)
    real_sync, syncs = durable.sync_data, []

    def failing_second_sync(handle: int) -> None:
        syncs.append(handle)
        if len(syncs) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(handle)

    monkeypatch.setattr(durable, "sync_data", failing_second_sync)
    with serving(competition, results, redis_url, service_id) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 1)
        last_step_refused(env, r"episodes.jsonl: Input/output error")  # item 1's records' sync is refused
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "INTERRUPTED" and "Input/output error" in summary["termination_cause"]
    # the item is out of the files and out of the summary; the table matches episodes.jsonl
    assert [r["index"] for r in read_episodes(results)] == [0]
    assert table_rows(results) == 1
    assert summary["items"]["recorded"] == 1

    monkeypatch.setattr(durable, "sync_data", real_sync)
    resumed, _ = resumed_to_the_end(competition, results, redis_url, service_id, episodes=2)
    assert resumed["state"] == "SUCCESS"
    assert [r["index"] for r in read_episodes(results)] == [0, 1, 2]
    assert table_rows(results) == 3


def test_a_success_decided_with_rows_due_waits_for_its_table(redis_url, service_id, tmp_path):
    # The last item times out, which ends the evaluation (one timeout is the limit): the evaluator
    # records it and ends the evaluation in one turn, its rows still due. The table refuses them:
    # the item stays in episodes.jsonl, the evaluation is INTERRUPTED instead of a success without
    # its table, and the resume rebuilds the table and ends it as it had ended.
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=2, length=3, budgets={"step_s": 0.2, "max_successive_timeouts": 1})
    with serving(competition, results, redis_url, service_id) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 1)
        refuse_the_table_after_its_first_row(results)
        env.reset()
        env.step(1)  # then silent past the step budget
        summary = finish(outcome)
        env.close()
    assert summary["state"] == "INTERRUPTED"
    assert "(results.csv: Is a directory)" in summary["termination_cause"]
    assert "(the evaluation had ended: 1 timeout, the limit of successive timeouts)" in summary["termination_cause"]
    assert [(r["index"], r["timed_out"]) for r in read_episodes(results)] == [(0, False), (1, True)]

    os.rmdir(os.path.join(results, "results.csv"))
    assert resumed_to_the_end(competition, results, redis_url, service_id)[0]["state"] == "SUCCESS"
    assert table_rows(results) == 2
