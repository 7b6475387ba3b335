"""F17: the legacy faults listed at the end of docs/design/wire.md, each reproduced against arbiter.

Most have a test of their own elsewhere, named here so the list can be checked in one place:

- a pause after the last step overwrote the score:
  test_budgets.py::test_the_wait_after_the_last_step_is_not_a_step_window
- no client within the idle time crashed the service: test_budgets.py::test_no_client_ends_after_the_idle_budget
- unknown or out-of-order messages ended it: test_fault_bad_input.py (F5) and
  test_evaluation.py::test_step_before_create_is_a_clear_error
- the results CSV lagged one episode: test_evaluation.py::test_results_csv_never_lags_behind_the_finished_episodes
- nothing could resume: test_fault_resume.py (F11)
- stale errors broke the next handshake:
  test_budgets.py::test_stale_errors_from_an_earlier_evaluation_do_not_break_the_handshake
- SIGALRM timeouts lost commands near the deadline: test_fault_deadlines.py (F16)

This file covers the rest in one scenario: a timeout in the very first episode, a Test whose
episodes all timed out, and the raw reward a timed-out episode records.

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from harness import finish, play_episode, read_episodes, running_service, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol import keys


def two_test_folder(tiny_tests: str, out: Path) -> str:
    """Test_0 with one level and Test_1 with two, built from the tiny set's three envs."""
    layout = {"Level_0": ("Test_0", "Level_0"), "Level_1": ("Test_1", "Level_0"), "Level_2": ("Test_1", "Level_1")}
    with open(Path(tiny_tests) / "metadata.csv", newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns, rows = reader.fieldnames, list(reader)
    for row in rows:
        test, level = layout[row["env_id"]]
        (out / test).mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tiny_tests) / "Test_0" / f"{row['env_id']}.pkl", out / test / f"{level}.pkl")
        row["test_id"], row["env_id"] = test, level
    with open(out / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return str(out)


def test_first_episode_timeout_and_an_all_timeout_test_are_scored_not_crashed(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    tests = two_test_folder(tiny_tests, tmp_path / "tests")
    results = str(tmp_path / "r")
    planning_s = 0.3
    with running_service(
        spec(planning_s=planning_s, step_s=5), tests=tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert client.env_create()[0] is not False
        # The agent plans past the budget in the first episode, which is all of Test_0.
        # The error the client will find is pushed after the evaluator counts the timeout: await it.
        wait_for(lambda: redis_conn.llen(keys.errors_key(service_id)) > 0, what="the planning timeout")
        with pytest.raises(TimeoutException):
            client.env_step({0: 2, 1: 2})
        for episode in (1, 2):  # Test_1 is played to the end
            assert client.env_create()[0] is not False
            play_episode(client, episode)
        assert client.env_create()[0] is False
        scores = client.submit()
        summary = finish(outcome)

    episodes = read_episodes(results)
    assert [(e["test"], e["timed_out"]) for e in episodes] == [("Test_0", True), ("Test_1", False), ("Test_1", False)]
    first = episodes[0]
    # flatland 4.3.0 recorded +max_steps x agents as the raw reward of a timed-out episode.
    assert first["reward"] <= 0 and first["normalized_return"] == -1.0
    assert summary["state"] == "SUCCESS"
    per_test = summary["score"]["per_test"]["primary"]
    assert set(per_test) == {"Test_0", "Test_1"}
    assert per_test["Test_0"] == -1.0
    assert per_test["Test_1"] == pytest.approx(
        (episodes[1]["normalized_return"] + episodes[2]["normalized_return"]) / 2
    )
    assert summary["score"]["primary"] == pytest.approx(sum(e["normalized_return"] for e in episodes) / 3)
    assert scores["score"] == pytest.approx(summary["score"]["primary"])
