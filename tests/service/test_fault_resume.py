"""Nothing finished is lost (F11): a killed evaluator resumes after its last finished episode.

The F-numbers are the rows of the fault table, docs/design/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import paths
import pytest
from harness import finish, read_episodes, read_events, read_summary, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol.errors import ConfigError, EvaluationError
from arbiter.server.service.results import ResultsStore

REPO = str(paths.REPO)


def deterministic_agent(client: RemoteClient, step_delay_s: float = 0.0) -> dict:
    """Actions are a pure function of (the evaluator's episode index, step, handle)."""
    while client.env_create()[0]:
        step = 0
        while True:
            actions = seeded_actions(client.episode_index, step, client.env.get_num_agents())
            if step_delay_s:
                time.sleep(step_delay_s)  # a slow agent, so the kills land mid-episode
            if client.env_step(actions)[2]["__all__"]:
                break
            step += 1
    return client.submit()


def test_a_torn_last_line_is_cut_off_on_resume(tmp_path):
    store = ResultsStore(str(tmp_path), ["test_id", "env_id"], lambda record: {})
    for index in range(2):
        store.add_episode(
            {
                "index": index,
                "env": f"Test_0/Level_{index}.pkl",
                "test": "Test_0",
                "level": f"Level_{index}",
                "reward": -1.0,
                "normalized_return": -0.5,
                "arrived_fraction": 0.0,
                "steps": 3,
                "wall_s": 0.1,
                "timed_out": False,
            }
        )
    whole = os.path.getsize(store.episodes_path)
    with open(store.episodes_path, "ab") as handle:
        handle.write(b'{"index": 2, "env": "Test_0/Lev')  # SIGKILL in the middle of an append
    records = ResultsStore(str(tmp_path), ["test_id", "env_id"], lambda record: {}).load_for_resume()
    assert [r["index"] for r in records] == [0, 1]
    assert os.path.getsize(store.episodes_path) == whole
    with open(store.csv_path) as handle:
        assert len(handle.readlines()) == 3  # header + the two finished episodes


def serve(tiny_tests: str, redis_url: str, service_id: str, results: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", results, "--resume", "--quiet"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ended_with_success(results: str) -> bool:
    """Whether the evaluation in ``results`` has ended well (its summary says so)."""
    try:
        return read_summary(results).get("state") == "SUCCESS"
    except (OSError, ValueError):  # no summary yet
        return False


def test_sigkill_at_random_points_then_resume_gives_the_uninterrupted_scores(
    redis_url, service_id, tiny_tests, tmp_path, record_property
):
    reference_results = str(tmp_path / "reference")
    with running_service(
        spec(), tests=tiny_tests, results=reference_results, redis_url=redis_url, service_id=service_id + "-ref"
    ) as (_, outcome):
        deterministic_agent(RemoteClient(redis_url=redis_url, service_id=service_id + "-ref", reply_timeout_s=10))
        reference = finish(outcome)

    results = str(tmp_path / "killed")
    agent_outcome: dict = {}

    def agent() -> None:
        try:
            client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=60, resend_after_s=0.3)
            agent_outcome["scores"] = deterministic_agent(client, step_delay_s=0.004)
        except BaseException as exc:
            agent_outcome["error"] = exc

    evaluator = serve(tiny_tests, redis_url, service_id, results)
    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    rng = random.Random(11)
    kills = 0
    killed_once_ended = False
    try:
        for _ in range(3):
            try:
                evaluator.wait(timeout=rng.uniform(1.5, 2.5))  # imports take ~1 s, then it serves
                break  # the evaluation ended before this kill
            except subprocess.TimeoutExpired:
                evaluator.send_signal(signal.SIGKILL)
                evaluator.wait()
                kills += 1
                if ended_with_success(results):
                    # The kill came after the evaluation ended, while its process was closing: a
                    # resume would rightly refuse (nothing to resume), and the scores stand.
                    killed_once_ended = True
                    break
                evaluator = serve(tiny_tests, redis_url, service_id, results)
        if not killed_once_ended:
            assert evaluator.wait(timeout=60) == 0, evaluator.stderr.read()
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    thread.join(timeout=30)
    assert "error" not in agent_outcome, agent_outcome.get("error")
    assert kills >= 1

    summary = read_summary(results)
    record_property("sigkills", kills)
    record_property("score_diff", summary["score"]["primary"] - reference["score"]["primary"])
    assert summary["state"] == "SUCCESS"
    assert summary["score"]["primary"] == reference["score"]["primary"]
    assert summary["score"]["secondary"] == reference["score"]["secondary"]
    with open(os.path.join(results, "episodes.jsonl"), "rb") as handle:
        lines = handle.read().split(b"\n")
    assert lines[-1] == b""  # ends with a complete line
    records = [json.loads(line) for line in lines[:-1]]  # every line parses: nothing torn
    assert [r["index"] for r in records] == [0, 1, 2]  # no duplicate, none lost
    assert [(r["steps"], r["normalized_return"]) for r in records] == [
        (r["steps"], r["normalized_return"]) for r in read_episodes(reference_results)
    ]
    assert agent_outcome["scores"]["score"] == reference["score"]["primary"]


def test_resume_refuses_a_finished_evaluation_and_a_foreign_results_folder(redis_url, service_id, tiny_tests, tmp_path):
    from arbiter.server.service.build import build_service

    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        deterministic_agent(RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10))
        finish(outcome)
    with pytest.raises(ConfigError, match="already ended"):
        build_service(spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id,
                      resume=True)  # fmt: skip
    summary_path = os.path.join(results, "summary.json")
    os.remove(summary_path)  # as if killed before the end
    other = tmp_path / "other"
    from arbiter.server.formats.flatland.generate import generate_test_set

    generate_test_set(other, preset="tiny", seed=2)
    os.rename(os.path.join(other, "Test_0"), os.path.join(other, "Test_5"))
    with open(os.path.join(other, "metadata.csv")) as handle:
        text = handle.read().replace("Test_0", "Test_5")
    with open(os.path.join(other, "metadata.csv"), "w") as handle:
        handle.write(text)
    with pytest.raises(ConfigError, match="does not belong to this test set"):
        build_service(spec(), tests=str(other), results_dir=results, redis_url=redis_url, service_id=service_id,
                      resume=True)  # fmt: skip


def test_resume_keeps_the_overall_budget_already_used(redis_url, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        _,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        while not client.env_step(seeded_actions(0, 0, 2))[2]["__all__"]:
            pass
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        service.request_stop("simulated crash")
    used = read_episodes(results)[0]["elapsed_s"]
    assert used > 0
    from arbiter.server.service.build import build_service

    resumed = build_service(
        spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id, resume=True
    )
    try:
        assert resumed.evaluation.next_index == 1 and resumed.evaluation.used_before_s == used
        assert resumed.evaluation.time_left_s(time.monotonic()) == pytest.approx(8 * 3600 - used)
    finally:
        resumed.close()


def test_f12_sigterm_mid_episode_leaves_an_interrupted_summary_and_resumes(
    redis_url, service_id, tiny_tests, tmp_path, record_property
):
    results = str(tmp_path / "r")
    evaluator = serve(tiny_tests, redis_url, service_id, results)  # --resume on a new folder: a fresh start
    client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.3)
    try:
        client.env_create()
        step = 0
        while not client.env_step(seeded_actions(client.episode_index, step, 2))[2]["__all__"]:
            step += 1
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        client.env_create()
        client.env_step(seeded_actions(client.episode_index, 0, 2))  # episode 1 is under way
        sent = time.monotonic()
        evaluator.send_signal(signal.SIGTERM)
        status = evaluator.wait(timeout=10)
        shutdown_s = time.monotonic() - sent
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    record_property("shutdown_s", round(shutdown_s, 3))
    assert status == 130 and shutdown_s < 10
    summary = read_summary(results)
    assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == "stopped by SIGTERM"
    assert summary["score"]["primary"] is None
    assert [r["index"] for r in read_episodes(results)] == [0]  # every finished episode, nothing else
    # The agent asking while no evaluator runs is told at once that it was stopped.
    with pytest.raises(EvaluationError, match=r"the evaluation has ended \(INTERRUPTED\): stopped by SIGTERM"):
        client.env_step(seeded_actions(client.episode_index, 1, 2))

    # The interrupted evaluation resumes: episode 1 is played again from its start, by the agent
    # that was told of the stop (the resumed evaluator took the notice back).
    evaluator = serve(tiny_tests, redis_url, service_id, results)
    try:
        wait_for(lambda: sum(e["event"] == "started" for e in read_events(results)) == 2, what="the resumed start")
        scores = deterministic_agent(client)
        assert evaluator.wait(timeout=30) == 0, evaluator.stderr.read()
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    assert [r["index"] for r in read_episodes(results)] == [0, 1, 2]
    assert read_summary(results)["state"] == "SUCCESS" and scores["score"] == read_summary(results)["score"]["primary"]


def test_counters_add_up_over_the_runs_and_every_resume_is_counted(redis_url, service_id, tiny_tests, tmp_path):
    """A run stopped (its summary written) hands its counters to the next; a run killed outright
    writes none, but its resume is counted all the same (its started event says so)."""
    from arbiter.server.service.build import build_service

    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        _,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        client.env_step({0: 99, 1: 99})  # actions no train has: counted
        wait_for(lambda: service.evaluation.counters["invalid_actions"] == 2, what="the invalid actions counted")
        service.request_stop("stopped by the test")
    assert read_summary(results)["counters"]["invalid_actions"] == 2
    for resumes in (1, 2):  # the first resumed run is killed: it writes no summary
        resumed = build_service(
            spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id, resume=True
        )
        try:
            assert resumed.evaluation.counters["resumed"] == resumes
            assert resumed.evaluation.counters["invalid_actions"] == 2
        finally:
            resumed.close()
