"""Pickled requests end to end (docs/design/reliability.md#f5, the pickle path), against a real redis-server.

flatland-rl's ``FlatlandRemoteClient(use_pickle=True)`` pickles its whole request map and
unpickles what it gets back. These tests run that unmodified client against arbiter's evaluator:
it completes an evaluation with the msgpack path's scores, timeouts included; it fails fast with
a readable error when pickle is refused; and thousands of hostile pickles queued before it and
around it run no code and change nothing.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import uuid
from typing import Any

import hostile_pickles as hp
import paths
import pytest
from flatland.core.env_observation_builder import DummyObservationBuilder
from flatland.envs.rail_env_action import RailEnvActions
from flatland.evaluators.client import FlatlandRemoteClient
from flatland.evaluators.client import TimeoutException as FlatlandTimeoutException
from harness import finish, read_episodes, read_summary, running_service, seeded_actions, spec, wait_for

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import ConfigError, DecodeError
from arbiter.protocol.legacy import safe_pickle
from arbiter.protocol.messages import FLATLAND_RL, REQUEST_TYPES
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import resolve_spec
from arbiter.server.core.competition import spec_from_dict

REPO = str(paths.REPO)
OUTCOME_FIELDS = ("env", "steps", "reward", "normalized_return", "arrived", "timed_out", "timeout", "abandoned")


def outcomes(episodes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(e[field] for field in OUTCOME_FIELDS) for e in episodes]


def new_service_id() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def member_actions(episode: int, step: int, num_agents: int) -> dict[int, Any]:
    """The seeded agent, acting with RailEnvActions members as flatland-rl 4 agents do."""
    return {handle: RailEnvActions(a) for handle, a in seeded_actions(episode, step, num_agents).items()}


def play_legacy(client: FlatlandRemoteClient, between_steps: Any = None, stall: Any = None) -> tuple | None:
    """Every episode with the seeded agent; ``stall(episode, step)`` may hold the agent up until
    the evaluator times it out. Returns (episode, step, message) of the timeout, if any."""
    timed_out = None
    episode = 0
    while client.env_create(obs_builder_object=DummyObservationBuilder())[0]:
        step = 0
        try:
            while True:
                if stall is not None:
                    stall(episode, step)
                _, _, done, _ = client.env_step(member_actions(episode, step, client.env.get_num_agents()))
                step += 1
                if between_steps is not None:
                    between_steps()
                if done["__all__"]:
                    break
        except FlatlandTimeoutException as exc:
            timed_out = (episode, step, str(exc))
        episode += 1
    return timed_out


def legacy_client(redis_server: Any, service_id: str, tests: str, use_pickle: bool) -> FlatlandRemoteClient:
    return FlatlandRemoteClient(
        test_env_folder=tests, flatland_rl_service_id=service_id, remote_port=redis_server.port, use_pickle=use_pickle
    )


@pytest.fixture(scope="module")
def clean_reference(redis_server, tiny_tests, tmp_path_factory) -> dict[str, Any]:
    """flatland's client in msgpack mode, the seeded agent, nothing in the way: the scores to match."""
    service_id = new_service_id()
    results = str(tmp_path_factory.mktemp("reference"))
    with running_service(
        spec(), tests=tiny_tests, results=results, redis_url=redis_server.url, service_id=service_id
    ) as (_, outcome):
        client = legacy_client(redis_server, service_id, tiny_tests, use_pickle=False)
        assert play_legacy(client) is None
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    return {"summary": summary, "episodes": read_episodes(results)}


# --- the legacy client in pickle mode ----------------------------------------------------------


def test_the_pickling_legacy_client_scores_as_the_msgpack_one_timeouts_included(
    redis_server, redis_conn, tiny_tests, tmp_path
):
    runs = {}
    for use_pickle in (False, True):
        service_id = new_service_id()
        results = str(tmp_path / f"pickle-{use_pickle}")
        errors_key = keys.errors_key(service_id)
        entries: list[bytes] = []

        def stall(episode: int, step: int) -> None:
            if (episode, step) == (1, 2):  # the agent stops until the evaluator times the episode out
                wait_for(lambda: redis_conn.llen(errors_key) > 0, what="the step timeout")  # noqa: B023
                entries.append(redis_conn.lindex(errors_key, 0))  # noqa: B023

        with running_service(
            spec(step_s=1.0, planning_s=5),
            tests=tiny_tests,
            results=results,
            redis_url=redis_server.url,
            service_id=service_id,
        ) as (service, outcome):
            client = legacy_client(redis_server, service_id, tiny_tests, use_pickle)
            timed_out = play_legacy(client, stall=stall)
            scores = client.submit()
            summary = finish(outcome)
        runs[use_pickle] = {
            "timed_out": timed_out,
            "errors_list": entries,
            "scores": scores,
            "summary": summary,
            "episodes": read_episodes(results),
            "counters": service.evaluation.counters,
        }

    msgpack_run, pickle_run = runs[False], runs[True]
    # The timeout reached the pickling client through the errors list, pickled.
    assert pickle_run["timed_out"] == msgpack_run["timed_out"] == (1, 2, FLATLAND_RL.ENV_STEP_TIMEOUT)
    (entry,) = pickle_run["errors_list"]
    assert safe_pickle.is_pickle(entry) and pickle.loads(entry) == {"type": FLATLAND_RL.ENV_STEP_TIMEOUT}
    assert not safe_pickle.is_pickle(msgpack_run["errors_list"][0])
    # Same evaluation, same scores.
    summary, episodes, scores = pickle_run["summary"], pickle_run["episodes"], pickle_run["scores"]
    assert summary["state"] == "SUCCESS"
    assert [e["timed_out"] for e in episodes] == [False, True, False]
    assert outcomes(episodes) == outcomes(msgpack_run["episodes"])
    assert summary["score"] == msgpack_run["summary"]["score"]
    assert scores == msgpack_run["scores"]
    assert scores["mean_normalized_reward"] == pytest.approx(summary["score"]["primary"])
    steps = sum(e["steps"] for e in episodes)
    counters = pickle_run["counters"]
    assert counters["pickled_requests"] == 1 + (len(episodes) + 1) + steps + 1  # ping, creates, steps, submit
    assert counters["bad_messages"] == 0 and counters["invalid_actions"] == 0
    assert msgpack_run["counters"]["pickled_requests"] == 0


class RawPickleClient:
    """Pickled requests as flatland-rl clients before 4.x sent them: RailEnvActions members in the
    action map itself (today's client turns them into ints before pickling)."""

    def __init__(self, conn: Any, service_id: str):
        self.conn = conn
        self.service_id = service_id

    def call(self, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
        channel = keys.response_key(self.service_id, uuid.uuid4().hex)
        request = {"type": type_, "payload": payload, "response_channel": channel, "timestamp": 1.0}
        self.conn.lpush(keys.commands_key(self.service_id), pickle.dumps(request))
        found = self.conn.blpop([channel], timeout=10)
        assert found is not None, f"no reply to {type_}"
        assert safe_pickle.is_pickle(found[1])
        return pickle.loads(found[1])


def test_rail_env_actions_inside_the_pickle_count_as_their_values(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, clean_reference
):
    results = str(tmp_path / "r")
    invalid = []
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        raw = RawPickleClient(redis_conn, service_id)
        assert raw.call(FLATLAND_RL.PING, {"version": "3.0.15"})["type"] == FLATLAND_RL.PONG
        episode = 0
        while raw.call(FLATLAND_RL.ENV_CREATE, {})["payload"]["observation"]:
            step, done = 0, False
            while not done:
                actions = member_actions(episode, step, service.evaluation.current.num_agents)
                payload = {"action": actions, "inference_time": 0.01, "arbiter": {"reply": True}}
                reply = raw.call(FLATLAND_RL.ENV_STEP, payload)
                assert reply["type"] == FLATLAND_RL.ENV_STEP_RESPONSE, reply
                invalid.append(reply["payload"]["invalid_actions"])
                done = reply["payload"]["done"]
                step += 1
            episode += 1
        submitted = raw.call(FLATLAND_RL.ENV_SUBMIT, {})
        summary = finish(outcome)
    assert episode == 3 and len(invalid) == sum(e["steps"] for e in read_episodes(results))
    assert set(invalid) == {0}
    assert outcomes(read_episodes(results)) == outcomes(clean_reference["episodes"])
    assert summary["score"] == clean_reference["summary"]["score"]
    assert submitted["payload"]["mean_normalized_reward"] == pytest.approx(summary["score"]["primary"])


# --- refusing pickle ------------------------------------------------------------------------------

# flatland's client in pickle mode, in its own process: its handshake either fails (printed, with
# the time it took) or succeeds (exit 3). A client that hung would be killed by the timeout.
PICKLE_CLIENT = """
import sys, time
from flatland.evaluators.client import FlatlandRemoteClient
started = time.monotonic()
try:
    FlatlandRemoteClient(flatland_rl_service_id=sys.argv[1], remote_port=int(sys.argv[2]), use_pickle=True)
except Exception as exc:
    print(f"{time.monotonic() - started:.4f}")
    print(exc)
    sys.exit(0)
sys.exit(3)
"""


def run_pickle_client(service_id: str, port: int) -> tuple[float, str]:
    done = subprocess.run(
        [sys.executable, "-c", PICKLE_CLIENT, service_id, str(port)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    elapsed, message = done.stdout.split("\n", 1)
    return float(elapsed), message


def assert_readable_refusal(message: str) -> None:
    assert "refuses pickled requests" in message
    assert "--refuse-pickle" in message and "accept_pickle = false" in message
    assert "use_pickle=False" in message


def test_a_refused_pickling_client_fails_fast_and_the_evaluation_goes_on(
    redis_server, redis_url, service_id, tiny_tests, tmp_path, clean_reference
):
    refusing = dataclasses.replace(spec(), accept_pickle=False)
    results = str(tmp_path / "r")
    with running_service(refusing, tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        elapsed_s, message = run_pickle_client(service_id, redis_server.port)
        print(f"\nrefused pickling client failed after {elapsed_s * 1000:.1f} ms: {message.strip()}")
        assert_readable_refusal(message)
        assert service.evaluation.counters["refused_pickles"] == 1
        # The refusal bound nothing: a msgpack client runs the evaluation.
        client = legacy_client(redis_server, service_id, tiny_tests, use_pickle=False)
        assert play_legacy(client) is None
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert summary["counters"]["refused_pickles"] == 1
    assert outcomes(read_episodes(results)) == outcomes(clean_reference["episodes"])


def test_arbiter_serve_refuse_pickle_answers_the_pickling_client(
    redis_server, redis_url, service_id, tiny_tests, tmp_path
):
    results = tmp_path / "results"
    serve = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--refuse-pickle", "--tests", tiny_tests,
         "--redis-url", redis_url, "--service-id", service_id, "--results", str(results)],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "waiting for the agent" in serve.stderr.readline() + serve.stderr.readline()
        _, message = run_pickle_client(service_id, redis_server.port)
        assert_readable_refusal(message)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=10) == 130
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    summary = read_summary(str(results))
    assert summary["state"] == "INTERRUPTED"
    assert summary["counters"]["refused_pickles"] == 1


def test_the_option_from_the_command_line_and_the_competition_file(tmp_path):
    parser = build_parser()
    assert resolve_spec(parser.parse_args(["serve"])).accept_pickle is True
    assert resolve_spec(parser.parse_args(["serve", "--refuse-pickle"])).accept_pickle is False
    assert resolve_spec(parser.parse_args(["run", "--refuse-pickle", "--", "true"])).accept_pickle is False
    competition = tmp_path / "no-pickle.toml"
    competition.write_text('scoring = "neurips2020"\naccept_pickle = false\n')
    assert resolve_spec(parser.parse_args(["serve", "--competition", str(competition)])).accept_pickle is False
    assert spec_from_dict("x", {"accept_pickle": True}).accept_pickle is True
    with pytest.raises(ConfigError, match="accept_pickle must be true or false"):
        spec_from_dict("x", {"accept_pickle": "no"})


# --- hostile pickles around a legitimate evaluation -------------------------------------------------


@pytest.fixture
def extensions():
    hp.register_extensions()
    try:
        yield
    finally:
        hp.unregister_extensions()


def classify(data: bytes) -> str:
    """What the evaluator must make of ``data``: bad (undecodable, or not a map) or unknown."""
    try:
        message, _ = codec.decode_request(data)
    except DecodeError:
        return "bad"
    if not isinstance(message, dict):
        return "bad"
    assert message.get("type") not in REQUEST_TYPES  # the corpus holds nothing the evaluator could act on
    return "unknown"


def test_hostile_pickles_run_no_code_and_the_pickling_client_queued_after_them_completes(
    redis_server, redis_conn, service_id, tiny_tests, tmp_path, clean_reference, extensions
):
    markers = tmp_path / "markers"
    markers.mkdir()
    corpus = [data for _, data in hp.corpus(service_id, markers)]
    kinds = [classify(data) for data in corpus]
    expected = {kind: kinds.count(kind) for kind in ("bad", "unknown")}
    assert len(corpus) > 5000 and expected["unknown"] > 0
    commands = keys.commands_key(service_id)
    before, around = corpus[: len(corpus) // 2], corpus[len(corpus) // 2 :]
    results = str(tmp_path / "r")
    with running_service(
        spec(), tests=tiny_tests, results=results, redis_url=redis_server.url, service_id=service_id
    ) as (service, outcome):
        for start in range(0, len(before), 500):
            redis_conn.lpush(commands, *before[start : start + 500])
        client = legacy_client(redis_server, service_id, tiny_tests, use_pickle=True)  # its PING queues last

        def push_some() -> None:  # the rest arrives between the client's steps
            if around:
                redis_conn.lpush(commands, *[around.pop() for _ in range(min(40, len(around)))])

        assert play_legacy(client, between_steps=push_some) is None
        pushed_while_playing = len(corpus) - len(before) - len(around)
        while around:
            push_some()
        scores = client.submit()
        summary = finish(outcome)
        counters = service.evaluation.counters
    print(
        f"\npickle fuzz end to end: {len(corpus)} hostile pickles {expected}; evaluator {summary['state']}, "
        f"counters bad_messages={counters['bad_messages']} unknown_types={counters['unknown_types']}; "
        f"code ran: {sorted(os.listdir(markers)) or 'no'}"
    )
    assert list(markers.iterdir()) == [] and hp.CODE_RAN == []
    assert pushed_while_playing > 1000
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["score"] == clean_reference["summary"]["score"]
    assert outcomes(read_episodes(results)) == outcomes(clean_reference["episodes"])
    assert scores["mean_normalized_reward"] == pytest.approx(summary["score"]["primary"])
    assert counters["bad_messages"] == expected["bad"]
    assert counters["unknown_types"] == expected["unknown"]
    assert counters["foreign_requests"] == 0 and counters["invalid_actions"] == 0
    assert redis_conn.llen(commands) == 0 and redis_conn.llen(keys.errors_key(service_id)) == 0
