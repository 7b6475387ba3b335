"""A whole evaluation with arbiter's client: scores, results files, the 2020 formula."""

from __future__ import annotations

import csv
import math
import os

import pytest
from flatland.envs.persistence import RailEnvPersister
from flatland.envs.step_utils.states import TrainState
from harness import finish, play_episode, read_episodes, read_summary, running_service, spec

from arbiter.client import RemoteClient
from arbiter.protocol.errors import OutOfOrder


def independent_2020_score(env_path: str, seed: int, actions: list[dict[int, int]]) -> tuple[float, float, int]:
    """docs/formats/flatland.md computed from flatland's own loader, without any arbiter code.

    After every step each agent whose state is not DONE gets −1; normalized by
    max_episode_steps × agents. Returns (normalized_return, arrived_fraction, steps).
    """
    env, _ = RailEnvPersister.load_new(env_path)
    env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=seed)
    total = 0
    steps = 0
    for step_actions in actions:
        _, _, done, _ = env.step(step_actions)
        steps += 1
        total -= sum(1 for agent in env.agents if agent.state != TrainState.DONE)
        if done["__all__"]:
            break
    n = env.get_num_agents()
    arrived = sum(1 for agent in env.agents if agent.state == TrainState.DONE)
    return total / (env._max_episode_steps * n), arrived / n, steps


def test_full_evaluation_scores_match_the_2020_formula(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "results")
    played: list[list[dict[int, int]]] = []
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert client.server_info["protocol"] == 1
        while True:
            observation, info = client.env_create()
            if not observation:
                break
            played.append([])
            play_episode(client, len(played) - 1, played[-1])
        scores = client.submit()
        summary = finish(outcome)

    episodes = read_episodes(results)
    assert [e["env"] for e in episodes] == ["Test_0/Level_0.pkl", "Test_0/Level_1.pkl", "Test_0/Level_2.pkl"]
    for record, actions in zip(episodes, played, strict=True):
        expected, arrived, steps = independent_2020_score(os.path.join(tiny_tests, record["env"]), 1001, actions)
        assert record["steps"] == steps == len(actions)
        assert record["normalized_return"] == pytest.approx(expected, abs=1e-12)
        assert -1.0 <= record["normalized_return"] <= 0.0
        assert record["arrived_fraction"] == arrived
        assert record["timed_out"] is False

    mean = math.fsum(e["normalized_return"] for e in episodes) / len(episodes)
    assert summary["state"] == "SUCCESS"
    assert summary["score"]["primary"] == pytest.approx(mean, abs=1e-12)
    assert summary["score"]["secondary"] == pytest.approx(sum(e["arrived_fraction"] for e in episodes) / 3)
    assert summary["score"]["per_test"]["primary"]["Test_0"] == pytest.approx(mean)
    assert scores["mean_normalized_reward"] == pytest.approx(mean)
    assert scores["score"] == summary["score"]["primary"]
    assert read_summary(results)["score"] == summary["score"]


def test_results_files_have_the_documented_fields(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "results")
    with running_service(
        spec(debug=True, max_episodes=2), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for episode in range(2):
            client.env_create()
            play_episode(client, episode)
        assert client.env_create() == (False, False)
        client.submit()
        finish(outcome)

    summary = read_summary(results)
    for key in ("state", "debug", "score", "termination_cause", "episodes", "budgets", "versions"):
        assert key in summary
    assert summary["debug"] is True and summary["episodes"]["total"] == 2
    assert set(summary["budgets"]) >= {"planning_s", "step_s", "overall_s", "max_successive_timeouts"}
    assert summary["versions"]["flatland-rl"] == "4.3.0"
    for record in read_episodes(results):
        assert {"env", "steps", "normalized_return", "arrived_fraction", "timed_out"} <= set(record)
        assert record["debug"] is True
    with open(os.path.join(results, "results.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    assert {"test_id", "env_id", "n_agents", "reward", "normalized_reward", "percentage_complete", "steps"} <= set(
        rows[0]
    )
    assert rows[0]["test_id"] == "Test_0" and rows[0]["env_id"] == "Level_0"


def test_flatland3_rule_adds_one_per_finished_episode_and_sums(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "results")
    with running_service(
        spec(scoring="flatland3"), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        rewards_seen = []
        episode = 0
        while client.env_create()[0]:
            total = 0.0
            step = 0
            while True:
                from harness import seeded_actions

                _, rewards, done, _ = client.env_step(seeded_actions(episode, step, client.env.get_num_agents()))
                total += sum(rewards.values())
                step += 1
                if done["__all__"]:
                    break
            rewards_seen.append((total, client.env._max_episode_steps * client.env.get_num_agents()))
            episode += 1
        client.submit()
        summary = finish(outcome)
    episodes = read_episodes(results)
    for record, (total, norm) in zip(episodes, rewards_seen, strict=True):
        # The client's local env applies flatland's own rewards, exactly as the server's does.
        assert record["reward"] == pytest.approx(total)
        assert record["normalized_return"] == pytest.approx(total / norm + 1.0)
    assert summary["score"]["primary"] == pytest.approx(math.fsum(r["normalized_return"] for r in episodes))


def test_step_before_create_is_a_clear_error(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, _):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        with pytest.raises(OutOfOrder):
            client.env_step({0: 2})
        client.step_replies = True
        client.env = object()  # pretend to have an env: the server must still refuse the step
        with pytest.raises(OutOfOrder, match="env_create"):
            client.env_step({0: 2})
        assert service.evaluation.counters["errors_out_of_order"] == 1


def test_step_replies_report_progress_and_invalid_actions(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, _):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        client.env_create()
        client.env_step({0: 2, 1: 2})
        assert service.evaluation.current.steps == 1
        # Unknown handle 7 and out-of-range action 9: dropped and counted, the step still applies.
        client.env.step = lambda actions: (None, {}, {"__all__": False}, {})  # the local env would reject them
        client.env_step({0: 9, 7: 1})
        assert service.evaluation.current.steps == 2
        assert service.evaluation.counters["invalid_actions"] == 2


def csv_rows(results: str) -> list[dict]:
    path = os.path.join(results, "results.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_results_csv_never_lags_behind_the_finished_episodes(redis_url, service_id, tiny_tests, tmp_path):
    """flatland-rl wrote each episode's row only when the next one started."""
    from harness import wait_for

    results = str(tmp_path / "results")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for episode in range(3):
            client.env_create()
            play_episode(client, episode)
            # No env_create is sent until the row is there: a CSV that lags to the next episode fails.
            rows = wait_for(lambda n=episode + 1: csv_rows(results) if len(csv_rows(results)) == n else None,
                            timeout_s=5, what=f"row {episode + 1} of results.csv")  # fmt: skip
            assert rows[-1]["env_id"] == f"Level_{episode}"
        client.env_create()
        client.submit()
        finish(outcome)


def test_a_broken_test_file_fails_the_evaluation_cleanly(redis_url, service_id, tiny_tests, tmp_path):
    import shutil

    from arbiter.protocol.errors import EvaluationError

    tests = tmp_path / "tests"
    shutil.copytree(tiny_tests, tests)
    (tests / "Test_0" / "Level_1.pkl").write_bytes(b"this is not a Flatland env")
    results = str(tmp_path / "results")
    with running_service(spec(), tests=str(tests), results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, 0)
        with pytest.raises(EvaluationError, match="the evaluator failed"):
            client.env_create()
        summary = finish(outcome)
    assert summary["state"] == "FAILED"
    assert summary["termination_cause"].startswith("internal error:")
    assert "ENV_CREATE" in summary["termination_cause"]
    assert [e["env"] for e in read_episodes(results)] == ["Test_0/Level_0.pkl"]
