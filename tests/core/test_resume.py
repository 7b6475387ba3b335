"""server/core/resume.py: where a killed evaluation continues, read from its results folder.

``resume_point`` and ``group_bounds`` are checked against a real plan (two-phase on a counting
env: phase 1's episodes stand alone, each phase 2 training run groups with its evaluation
episodes); the last test resumes a real evaluation through Redis and checks that the agent is
sent on from the first item without records.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, remote_episode, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ConfigError
from arbiter.server.core.resume import group_bounds, resume_point
from arbiter.server.core.scoring import scoring_rule
from arbiter.server.formats import get_format
from arbiter.server.formats.base import Item

PHASE2 = {"num_runs": 2, "max_steps": 20, "goal_reward": 4.0, "stability_window": 2}


@pytest.fixture(scope="module")
def items() -> list[Item]:
    """Both phases: two phase-1 episodes, then two training runs of two evaluation episodes each."""
    spec = counting_competition(num_episodes=2, phase=None, phase2=PHASE2)
    rule = scoring_rule(spec.format, spec.scoring, spec.options)
    return get_format(spec.format).make_plan(spec, rule, tests=None).items


def records_of(items: list[Item], *, timed_out: list[bool], elapsed_s: list[float]) -> list[dict[str, Any]]:
    return [
        {"index": item.index, "unit": item.unit, "timed_out": out, "elapsed_s": elapsed}
        for item, out, elapsed in zip(items, timed_out, elapsed_s, strict=False)
    ]


def test_an_empty_results_folder_starts_at_the_first_item(items):
    point = resume_point([], items)
    assert (point.items_done, point.used_before_s, point.successive_timeouts) == (0, 0.0, 0)


def test_the_evaluation_continues_after_the_last_item_with_records(items):
    records = records_of(items, timed_out=[False, True, True], elapsed_s=[1.0, 2.5, 4.0])
    point = resume_point(records, items)
    assert point.items_done == 3
    assert point.used_before_s == 4.0  # the overall budget used when the last item ended
    assert point.successive_timeouts == 2  # the run of timeouts the killed evaluation ended with


def test_a_training_run_of_many_records_counts_as_one_item(items):
    run = items[2]
    many = [{"index": run.index, "unit": run.unit, "timed_out": False, "elapsed_s": 0.1 * k} for k in range(1, 6)]
    point = resume_point(records_of(items, timed_out=[False, False], elapsed_s=[0.0, 0.0]) + many, items)
    assert point.items_done == 3 and point.used_before_s == pytest.approx(0.5)


def test_records_written_before_units_existed_are_matched_by_their_env(items):
    legacy = [{"index": 0, "env": items[0].unit, "timed_out": False}]
    assert resume_point(legacy, items).items_done == 1


def test_a_results_folder_of_another_plan_is_refused_with_both_keys_named(items):
    foreign = [{"index": 0, "unit": "Test_0/Level_0.pkl", "timed_out": False}]
    with pytest.raises(ConfigError, match="does not belong") as refused:
        resume_point(foreign, items)
    assert "Test_0/Level_0.pkl" in str(refused.value) and items[0].unit in str(refused.value)


def test_a_results_folder_with_more_items_than_the_plan_is_refused(items):
    more = [{"unit": f"u{i}", "timed_out": False} for i in range(len(items) + 1)]
    with pytest.raises(ConfigError, match=f"holds {len(items) + 1} items; this plan has {len(items)}"):
        resume_point(more, items)


def test_an_item_that_stands_alone_is_its_own_group(items):
    assert [group_bounds(items, i) for i in (0, 1)] == [(0, 1), (1, 2)]


def test_a_training_run_and_its_evaluation_episodes_are_one_group(items):
    first_run = [group_bounds(items, i) for i in (2, 3, 4)]
    second_run = [group_bounds(items, i) for i in (5, 6, 7)]
    assert first_run == [(2, 5)] * 3 and second_run == [(5, 8)] * 3


def test_group_bounds_stop_at_the_plan_ends():
    alone = [Item(0, "a", group="g"), Item(1, "b", group="g")]
    assert group_bounds(alone, 0) == group_bounds(alone, 1) == (0, 2)


def test_a_resumed_evaluation_sends_the_agent_on_after_the_last_finished_item(redis_url, service_id, tmp_path):
    competition = counting_competition(num_episodes=3)
    results = str(tmp_path / "results")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        first_return, _ = remote_episode(env, lambda observation: 0, {})
        env.close()
        service.request_stop("the evaluator is killed")
        assert finish(outcome)["state"] == "INTERRUPTED"
    assert [record["index"] for record in read_episodes(results)] == [0]

    with running_service(
        competition, tests=None, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (_, outcome):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert env.next_item == 1  # the PONG names where the evaluation stands
        _, info = env.reset()
        assert info["arbiter"]["item"] == 1
        for _ in range(5):
            env.step(1)
        remote_episode(env, lambda observation: 1, {})
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    returns = [record["return"] for record in read_episodes(results)]
    assert returns == [first_return, 10.0, 10.0]  # the first item kept, never played again
