"""An item's notices (its event, the progress line) and its rows in results.csv are given once the
reply of the step that ended it has gone: the agent does not wait for them, and they still come
whole and in order. The item's records are written to episodes.jsonl (and synced) before that
reply is sent, so a table refused after it loses no item."""

from __future__ import annotations

import csv
import os
import threading

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, read_events, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import EvaluationError

NOTICE_WAIT_S = 5.0  # how long a notice waits for the agent to have its reply (far longer than a step)


def test_the_step_that_ends_an_item_is_answered_before_its_notices(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    replies_seen = [threading.Event(), threading.Event()]  # one per episode, set by the agent
    seen_first: list[bool] = []  # per notice: had the agent its reply when the notice began?
    recorded_first: list[bool] = []  # per notice: was its item in episodes.jsonl by then?
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

        def notice_that_waits_for_the_reply(record, evaluation_now):
            seen_first.append(replies_seen[record["index"]].wait(NOTICE_WAIT_S))
            recorded_first.append(record["index"] in {r["index"] for r in read_episodes(results)})
            give_notice(record, evaluation_now)

        evaluation.on_episode = notice_that_waits_for_the_reply
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        for episode in range(2):
            env.reset()
            terminated = False
            while not terminated:
                _, _, terminated, _, _ = env.step(1)
            replies_seen[episode].set()
        env.reset()
        assert env.finished
        env.submit()
        env.close()
        summary = finish(outcome)

    assert seen_first == [True, True]
    assert recorded_first == [True, True]
    assert summary["state"] == "SUCCESS"
    events = read_events(results)
    assert [e["event"] for e in events] == ["started", "episode", "episode", "finished"]
    records = read_episodes(results)
    assert [e["index"] for e in events[1:3]] == [r["index"] for r in records] == [0, 1]
    # the last notice shows the score the evaluation ends with
    assert events[2]["score_so_far"] == summary["score"]["primary"]
    assert [e["episodes_done"] for e in events[1:3]] == [1, 2]


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


def resumed_to_the_end(competition, results: str, redis_url: str, service_id: str) -> dict:
    """``arbiter serve --resume`` of an evaluation with nothing left to play: its summary."""
    with serving(competition, results, redis_url, service_id, resume=True) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        env.reset()
        assert env.finished
        env.submit()
        env.close()
        return finish(outcome)


def refuse_the_table_after_its_first_row(results: str) -> None:
    """Once results.csv has the first item's row, it can no longer be opened for writing."""
    table = os.path.join(results, "results.csv")
    wait_for(lambda: table_rows(results) == 1, what="the first item's row")
    os.remove(table)
    os.mkdir(table)


def play_episodes(env: RemoteEnv, episodes: int, after_each=lambda episode: None) -> None:
    for episode in range(episodes):
        env.reset()
        terminated = False
        while not terminated:
            _, _, terminated, _, _ = env.step(1)
        after_each(episode)


def test_an_items_rows_reach_results_csv_once_its_reply_has_gone(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    replies_seen = [threading.Event(), threading.Event()]
    seen_first: list[bool] = []  # per item whose rows were due: had the agent its reply by then?
    with serving(counting_competition(num_episodes=2, length=3), results, redis_url, service_id) as (service, outcome):
        store = service.evaluation.store
        write_rows = store.write_due_rows

        def rows_that_wait_for_the_reply(**keys):
            recorded = read_episodes(results) if os.path.exists(store.episodes_path) else []
            for record in recorded[table_rows(results) :]:  # in episodes.jsonl, not yet in the table
                seen_first.append(replies_seen[record["index"]].wait(NOTICE_WAIT_S))
            write_rows(**keys)

        store.write_due_rows = rows_that_wait_for_the_reply
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 2, lambda episode: replies_seen[episode].set())
        env.reset()
        env.submit()
        env.close()
        summary = finish(outcome)

    assert seen_first == [True, True]
    assert summary["state"] == "SUCCESS"
    assert table_rows(results) == len(read_episodes(results)) == 2


def test_a_table_refused_after_the_reply_is_told_at_the_next_items_end(redis_url, service_id, tmp_path, caplog):
    # Item 1's rows are refused once its reply has gone: item 1 stands and the evaluation goes on.
    # Item 2's end writes them first, is refused again, and its last step is answered with the
    # cause: the agent is told at once, the evaluation stops, item 2 is not recorded. The resume
    # rebuilds the table and plays item 2 again.
    results = str(tmp_path / "results")
    competition = counting_competition(num_episodes=3, length=3)
    with serving(competition, results, redis_url, service_id) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        play_episodes(env, 2, lambda episode: episode == 0 and refuse_the_table_after_its_first_row(results))
        env.reset()
        env.step(1)
        env.step(1)
        with pytest.raises(EvaluationError, match=r"results.csv: Is a directory"):
            env.step(1)  # item 2's last step
        summary = finish(outcome)
        env.close()
    assert "results.csv refused the rows due (1)" in caplog.text
    assert summary["state"] == "INTERRUPTED"
    assert "(results.csv: Is a directory)" in summary["termination_cause"]
    assert [r["index"] for r in read_episodes(results)] == [0, 1]  # item 1 stands, item 2 is not written

    os.rmdir(os.path.join(results, "results.csv"))
    with serving(competition, results, redis_url, service_id, resume=True) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        assert table_rows(results) == 2  # rebuilt by the resume
        play_episodes(env, 1)
        env.reset()
        env.submit()
        env.close()
        resumed = finish(outcome)
    assert resumed["state"] == "SUCCESS"
    assert table_rows(results) == len(read_episodes(results)) == 3


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
    assert "(the evaluation had ended: 1 successive timeouts)" in summary["termination_cause"]
    assert [(r["index"], r["timed_out"]) for r in read_episodes(results)] == [(0, False), (1, True)]

    os.rmdir(os.path.join(results, "results.csv"))
    assert resumed_to_the_end(competition, results, redis_url, service_id)["state"] == "SUCCESS"
    assert table_rows(results) == 2
