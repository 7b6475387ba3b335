"""``flatland3`` against flatland-rl 4.3.0's own evaluation service, run unmodified on the same
test folder with the same agent: the figures agree to the last digit (docs/formats/flatland.md).

Each test plays one agent, flatland's own ``FlatlandRemoteClient``, once against flatland's
service (a process of its own: it times out with SIGALRM) and once against arbiter's evaluator,
and compares what each reports: the ENV_SUBMIT reply, results.csv's per-episode figures, and
where the evaluation ends before its last episode, the scores flatland's service keeps."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import paths
import pytest
from flatland.core.env_observation_builder import DummyObservationBuilder
from flatland.envs.rail_env_policies import ShortestPathPolicy
from flatland.evaluators.client import FlatlandRemoteClient
from flatland.evaluators.client import TimeoutException as FlatlandTimeoutException
from harness import finish, read_episodes, running_service

from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import resolve_spec
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.core.rescore import rescore
from arbiter.server.formats.flatland.generate import generate_test_set

LEGACY = ("mean_reward", "sum_normalized_reward", "mean_percentage_complete", "mean_normalized_reward")


@pytest.fixture(scope="session")
def two_tests(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two Tests, three and two levels: enough for a Test to end and the next to begin."""
    folder = tmp_path_factory.mktemp("two-tests") / "tests"
    levels = [{"test": 0, "level": level, "n_agents": 2 + level, "dim": 25} for level in range(3)]
    levels += [{"test": 1, "level": level, "n_agents": 3, "dim": 25} for level in range(2)]
    generate_test_set(folder, seed=3, levels=levels)
    return str(folder)


def shortest_path(env: Any) -> dict[int, int]:
    """Every train on its shortest path: trains arrive, others are late, rewards vary."""
    handles = list(env.get_agent_handles())
    actions = ShortestPathPolicy().act_many(handles, [env] * len(handles))
    return {handle: int(getattr(action, "value", action)) for handle, action in actions.items()}


def standing_still(env: Any) -> dict[int, int]:
    return dict.fromkeys(env.get_agent_handles(), 4)  # STOP_MOVING: no train ever arrives


def play(
    client: FlatlandRemoteClient, policy: Callable[[Any], dict[int, int]], silent_at: tuple[int, int] | None = None
) -> tuple[int, dict[str, Any] | None]:
    """A starter kit's loop; at ``silent_at`` (episode, step) the agent stops sending, as a
    crashed one does. Returns the episodes handed out and the submit reply (None if silent)."""
    episode = 0
    while True:
        observation, _ = client.env_create(obs_builder_object=DummyObservationBuilder())
        if not observation:
            return episode, client.submit()
        step = 0
        try:
            while True:
                if (episode, step) == silent_at:
                    return episode + 1, None
                _, _, done, _ = client.env_step(policy(client.env))
                step += 1
                if done["__all__"]:
                    break
        except FlatlandTimeoutException:
            pass
        episode += 1


def flatland_client(tests: str, port: int, sid: str) -> FlatlandRemoteClient:
    return FlatlandRemoteClient(test_env_folder=tests, flatland_rl_service_id=sid, remote_port=port)


def run_flatland(
    tests: str, port: int, sid: str, out: str, policy: Any, environment: dict[str, str], **play_kw: Any
) -> dict[str, Any]:
    """flatland's service and the agent: what the agent saw, the service's results table and
    the scores it keeps (its evaluation state)."""
    os.makedirs(out, exist_ok=True)
    results = os.path.join(out, "results.csv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLATLAND_", "AICROWD_", "TEST_"))}
    service = subprocess.Popen(
        [sys.executable, str(paths.SUPPORT / "flatland_service_main.py"), tests, sid, str(port), results],
        env={**env, **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        episodes, submitted = play(flatland_client(tests, port, sid), policy, **play_kw)
        output, _ = service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert "FLATLAND_SERVICE_RESULT FLATLAND_RL.ENV_SUBMIT_RESPONSE" in output, output[-3000:]
    with open(results.replace(".csv", ".json"), encoding="utf-8") as handle:
        state = json.load(handle)
    return {"episodes": episodes, "submit": submitted, "csv": read_csv(results), "state": state}


def run_arbiter(
    tests: str, redis_url: str, port: int, sid: str, out: str, competition: CompetitionSpec, policy: Any, **play_kw: Any
) -> dict[str, Any]:
    with running_service(competition, tests=tests, results=out, redis_url=redis_url, service_id=sid) as (_, outcome):
        episodes, submitted = play(flatland_client(tests, port, sid), policy, **play_kw)
        summary = finish(outcome)
    return {
        "episodes": episodes,
        "submit": submitted,
        "csv": read_csv(os.path.join(out, "results.csv")),
        "summary": summary,
        "records": read_episodes(out),
        "rescored": rescore(out),
    }


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def flatland3(**budgets: Any) -> CompetitionSpec:
    """The flatland3 preset, as `arbiter run --competition flatland3` resolves it, with budgets."""
    argv = ["serve", "--competition", "flatland3"]
    for flag, value in budgets.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return resolve_spec(build_parser().parse_args(argv))


def column(rows: list[dict[str, str]], key: str) -> dict[str, float | None]:
    """A results.csv column by env file, as numbers (None: an empty cell, flatland's NaN)."""
    return {row["filename"]: (float(row[key]) if row[key] not in ("", "nan") else None) for row in rows}


def both(redis_server, service_id, tests, tmp_path, policy, *, environment=None, competition=None, **play_kw):
    environment = environment or {}
    flatland = run_flatland(
        tests, redis_server.port, f"{service_id}-f", str(tmp_path / "f"), policy, environment, **play_kw
    )
    arbiter = run_arbiter(
        tests,
        redis_server.url,
        redis_server.port,
        f"{service_id}-a",
        str(tmp_path / "a"),
        competition or flatland3(),
        policy,
        **play_kw,
    )
    return flatland, arbiter


def test_a_full_evaluation_scores_as_flatlands_service_to_the_last_digit(redis_server, service_id, two_tests, tmp_path):
    flatland, arbiter = both(redis_server, service_id, two_tests, tmp_path, shortest_path)
    assert flatland["episodes"] == arbiter["episodes"] == 5
    assert {k: arbiter["submit"][k] for k in LEGACY} == flatland["submit"]
    for key in ("normalized_reward", "percentage_complete", "reward", "steps", "nb_deadlocked_trains"):
        assert column(arbiter["csv"], key) == column(flatland["csv"], key), key
    score = arbiter["summary"]["score"]
    assert score["primary"] == flatland["state"]["score"]["score"]
    assert round(score["secondary"], 3) == flatland["state"]["score"]["score_secondary"]
    assert arbiter["submit"]["score"] == flatland["submit"]["sum_normalized_reward"]
    # recomputed from the results folder's records alone: the same digits
    rescored = arbiter["rescored"]
    assert rescored.matches and rescored.recomputed["primary"] == flatland["state"]["score"]["score"]


def test_a_test_played_too_poorly_stops_the_evaluation_as_flatlands_does(redis_server, service_id, two_tests, tmp_path):
    flatland, arbiter = both(redis_server, service_id, two_tests, tmp_path, standing_still)
    # No train arrives in Test_0: neither hands out Test_1's episodes; the score is Test_0's.
    assert flatland["episodes"] == arbiter["episodes"] == 3
    assert {k: arbiter["submit"][k] for k in LEGACY} == flatland["submit"]
    assert arbiter["summary"]["state"] == "SUCCESS"
    assert "below 0.25" in arbiter["summary"]["termination_cause"]
    assert [r["ended"] for r in arbiter["records"]] == ["finished"] * 3 + ["not_played"] * 2
    assert column(arbiter["csv"], "normalized_reward") == column(flatland["csv"], "normalized_reward")
    assert arbiter["rescored"].recomputed["primary"] == flatland["state"]["score"]["score"]


def test_flatlands_threshold_variable_is_honoured_as_flatlands_service_honours_it(
    redis_server, service_id, two_tests, tmp_path
):
    environment = {"TEST_MIN_PERCENTAGE_COMPLETE_MEAN": "0"}  # never stop
    os.environ.update(environment)
    try:
        competition = flatland3()
    finally:
        del os.environ["TEST_MIN_PERCENTAGE_COMPLETE_MEAN"]
    flatland, arbiter = both(
        redis_server, service_id, two_tests, tmp_path, standing_still, environment=environment, competition=competition
    )
    assert flatland["episodes"] == arbiter["episodes"] == 5
    assert {k: arbiter["submit"][k] for k in LEGACY} == flatland["submit"]


def test_the_figures_of_an_evaluation_cut_short_count_the_played_episodes_only(
    redis_server, service_id, two_tests, tmp_path
):
    """The agent goes silent in the second episode: that one times out, the next wait for it too,
    and the evaluation ends after two timeouts in a row; the figures are over the two it played."""
    environment = {"FLATLAND_PER_STEP_TIMEOUT": "1", "FLATLAND_MAX_SUCCESSIVE_TIMEOUTS": "2"}
    flatland, arbiter = both(
        redis_server,
        service_id,
        two_tests,
        tmp_path,
        shortest_path,
        environment=environment,
        competition=flatland3(step_timeout=0.5, max_successive_timeouts=2),
        silent_at=(1, 3),
    )
    state, score = flatland["state"], arbiter["summary"]["score"]
    assert score["primary"] == state["score"]["score"]
    assert round(score["secondary"], 3) == state["score"]["score_secondary"]
    assert round(score["secondary"], 3) != round((score["secondary"] * 2) / 5, 3)  # not over all five
    assert column(arbiter["csv"], "percentage_complete") == column(flatland["csv"], "percentage_complete")
    assert arbiter["rescored"].recomputed["secondary"] == score["secondary"]
    # under this rule the three episodes not played are in no figure, and the ending says so
    assert arbiter["summary"]["termination_cause"].endswith("3 episodes not played count in no figure")


def test_flatlands_seed_variable_seeds_the_envs_as_flatlands_service(redis_server, service_id, two_tests, tmp_path):
    environment = {"FLATLAND_EVALUATION_RANDOM_SEED": "7"}
    os.environ.update(environment)
    try:
        competition = flatland3()
    finally:
        del os.environ["FLATLAND_EVALUATION_RANDOM_SEED"]
    assert competition.seed == 7
    flatland, arbiter = both(
        redis_server, service_id, two_tests, tmp_path, shortest_path, environment=environment, competition=competition
    )
    assert {k: arbiter["submit"][k] for k in LEGACY} == flatland["submit"]
    assert column(arbiter["csv"], "steps") == column(flatland["csv"], "steps")
