"""An item's notices (its event, the progress line) are given once the reply of the step that
ended it has gone: the agent does not wait for them, and they still come whole and in order. The
item's records are written (and fsynced) before that reply is sent."""

from __future__ import annotations

import threading

from fake_envs import counting_competition
from harness import finish, read_episodes, read_events, running_service

from arbiter.client.remote_env import RemoteEnv

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
