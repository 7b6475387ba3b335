"""A restarted agent gets back into its evaluation; a second live client never does.

The rule (server/clients.py): only a handshake (PING, or ENV_CREATE) binds an evaluation, and
what was queued before a resumed evaluator started never does. A new client's handshake takes
over from the bound client once that one has been silent for longer than the evaluator waits for
it (the running episode's planning or step budget plus the rest of its time bank; the step budget
between episodes); before that it is refused with OTHER_CLIENT, and arbiter's client asks again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import paths
import pytest
from harness import finish, play_episode, read_episodes, read_summary, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import ClientConflict
from arbiter.protocol.messages import FLATLAND_RL
from arbiter.server.service.build import build_service
from arbiter.server.service.events import EventLog

REPO = str(paths.REPO)
AGENT = os.path.join(paths.SUPPORT, "seeded_agent_main.py")


class Processes:
    """The evaluators and agents one test starts; each killed (by its pid) if still running."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str]) -> subprocess.Popen:
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.started.append(process)
        return process

    def serve(self, tests: str, redis_url: str, service_id: str, results: str, *options: str) -> subprocess.Popen:
        return self.start(
            [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tests, "--redis-url", redis_url,
             "--service-id", service_id, "--results", results, "--quiet", *options]
        )  # fmt: skip

    def agent(self, redis_url: str, service_id: str, *options: str) -> subprocess.Popen:
        return self.start([sys.executable, AGENT, redis_url, service_id, *options])

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait()
            for stream in (process.stdout, process.stderr):
                stream.close()


@pytest.fixture
def processes():
    started = Processes()
    try:
        yield started
    finally:
        started.stop_all()


def sigkill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def completed(process: subprocess.Popen, what: str, timeout_s: float = 60) -> str:
    """Wait for ``process`` to exit 0; returns its stdout."""
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, f"{what} exited with {process.returncode}: {err[-3000:]}"
    return out


def reference_run(redis_url: str, service_id: str, tiny_tests: str, results: str) -> list[dict]:
    """The episodes of an uninterrupted run of the same deterministic agent."""
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        assert finish(outcome)["state"] == "SUCCESS"
    return read_episodes(results)


def test_evaluator_and_agent_killed_then_resume_with_a_fresh_agent_completes(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, processes
):
    reference = reference_run(redis_url, service_id + "-ref", tiny_tests, str(tmp_path / "reference"))
    results = str(tmp_path / "r")
    evaluator = processes.serve(tiny_tests, redis_url, service_id, results)
    agent = processes.agent(redis_url, service_id, "--step-delay", "0.01")
    wait_for(lambda: len(read_episodes(results, missing_ok=True)) >= 2, timeout_s=60, what="two finished episodes")
    sigkill(evaluator)
    # The agent goes on stepping into the queue with nobody reading it, then dies too: these
    # fire-and-forget steps of a session that no longer exists are what the resumed evaluator finds.
    commands = keys.commands_key(service_id)
    wait_for(lambda: redis_conn.llen(commands) >= 3, what="the dead evaluator's queue to fill")
    sigkill(agent)
    leftovers = redis_conn.llen(commands)

    resumed = processes.serve(tiny_tests, redis_url, service_id, results, "--resume")
    fresh = processes.agent(redis_url, service_id)
    scores = json.loads(completed(fresh, "the fresh agent").strip().splitlines()[-1])
    completed(resumed, "the resumed evaluator")

    summary = read_summary(results)
    episodes = read_episodes(results)
    assert summary["state"] == "SUCCESS"
    assert [e["index"] for e in episodes] == [0, 1, 2]
    assert [(e["steps"], e["normalized_return"]) for e in episodes] == [
        (e["steps"], e["normalized_return"]) for e in reference
    ]
    assert scores["score"] == summary["score"]["primary"]
    counters = summary["counters"]
    # (a PING of the fresh agent that came before the resumed evaluator looked is one too: resent)
    assert counters["leftover_requests"] >= leftovers
    assert "foreign_requests" not in counters and "takeovers" not in counters  # the fresh agent was never refused


def test_an_agent_killed_mid_episode_is_replaced_by_a_fresh_one_while_the_evaluator_runs(
    redis_url, service_id, tiny_tests, tmp_path, processes
):
    reference = reference_run(redis_url, service_id + "-ref", tiny_tests, str(tmp_path / "reference"))
    results = str(tmp_path / "r")
    marker = str(tmp_path / "hung")
    evaluator = processes.serve(
        tiny_tests, redis_url, service_id, results, "--step-timeout", "0.5", "--max-successive-timeouts", "1000"
    )
    crashing = processes.agent(redis_url, service_id, "--hang-at", "1", "5", marker)
    wait_for(lambda: os.path.exists(marker), timeout_s=60, what="the first agent to reach episode 1, step 5")
    sigkill(crashing)

    fresh = processes.agent(redis_url, service_id)
    scores = json.loads(completed(fresh, "the fresh agent").strip().splitlines()[-1])
    completed(evaluator, "the evaluator")

    summary = read_summary(results)
    episodes = read_episodes(results)
    assert summary["state"] == "SUCCESS"
    assert [e["index"] for e in episodes] == [0, 1, 2]
    # The killed agent's episode timed out after its 5 steps; the others are exactly the reference's.
    assert episodes[1]["timed_out"] and episodes[1]["timeout"] == "step" and episodes[1]["steps"] == 5
    assert episodes[1]["normalized_return"] == -1.0
    for index in (0, 2):
        assert (episodes[index]["steps"], episodes[index]["normalized_return"]) == (
            reference[index]["steps"],
            reference[index]["normalized_return"],
        )
    assert scores["score"] == summary["score"]["primary"]
    assert summary["counters"]["takeovers"] == 1


def test_a_second_live_client_is_refused_until_the_first_goes_silent_then_takes_over(
    redis_url, service_id, tiny_tests, tmp_path, record_property
):
    step_s = 0.5
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=5, step_s=step_s), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        evaluation = service.evaluation
        first = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        first.env_create()
        first.env_step(seeded_actions(0, 0, 2))  # past planning: the first waits on the step budget
        steps = 1
        second: dict = {}

        def connect_second() -> None:
            try:
                second["client"] = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
                second["admitted_at"] = time.monotonic()
            except BaseException as exc:
                second["error"] = exc

        thread = threading.Thread(target=connect_second, daemon=True)
        thread.start()
        # The first client stays live (a step every 50 ms, far within the 0.5 s budget) through
        # three refusals of the second one; the second never gets in meanwhile.
        while evaluation.counters["foreign_requests"] < 3:
            assert "admitted_at" not in second and "error" not in second
            first.env_step(seeded_actions(0, steps, 2))
            last_sent = time.monotonic()  # before the send: the evaluator heard it later
            steps += 1
            time.sleep(0.05)  # the first agent's thinking time
        # The first goes silent: the second takes over once the step budget has passed.
        thread.join(timeout=10)
        assert "error" not in second, second.get("error")
        silence_s = second["admitted_at"] - last_sent
        record_property("silence_before_takeover_s", round(silence_s, 4))
        assert step_s < silence_s < step_s + 1.0
        episode = read_episodes(results)[0]
        assert episode["timed_out"] and episode["timeout"] == "step"
        assert episode["steps"] == steps  # every step was the first client's: none interleaved
        # The first client, back, is now the one refused; its step is not applied.
        with pytest.raises(ClientConflict):
            first.env_step(seeded_actions(0, steps, 2))
        client = second["client"]
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert [e["steps"] for e in read_episodes(results)][0] == steps
    assert summary["counters"]["takeovers"] == 1 and summary["episodes"]["timed_out"] == 1


def test_stray_requests_never_bind_an_evaluation(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    """A step, or anything else but a handshake, from a client nobody bound is refused, and the
    client that then says PING gets the evaluation."""
    ghost = RemoteClient.__new__(RemoteClient)
    ghost.session, ghost._seq = "ghost", 0
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        for _ in range(3):
            redis_conn.lpush(
                keys.commands_key(service_id), ghost._tagged(FLATLAND_RL.ENV_STEP, {"action": {0: 2}}, "x")
            )
        redis_conn.lpush(keys.commands_key(service_id), ghost._tagged(FLATLAND_RL.ENV_SUBMIT, {}, "x"))
        wait_for(lambda: service.evaluation.counters["unbound_requests"] == 4, what="the stray requests refused")
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert service.gate.owner == client.session
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3
    assert "foreign_requests" not in summary["counters"]


def test_a_leftover_env_create_from_before_a_resume_hands_out_no_episode(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        _,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, 0)
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        service.request_stop("killed")
    # What the client sent to an evaluator that was gone: an ENV_CREATE and a PING, then it died.
    commands = keys.commands_key(service_id)
    redis_conn.lpush(commands, client._tagged(FLATLAND_RL.ENV_CREATE, {}, client._new_channel()))
    redis_conn.lpush(commands, client._tagged(FLATLAND_RL.PING, {}, client._new_channel()))

    resumed = build_service(
        spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id, resume=True
    )
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=resumed.run()), daemon=True)
    thread.start()
    try:
        fresh = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        while fresh.env_create()[0]:
            play_episode(fresh, fresh.episode_index)
        fresh.submit()
        thread.join(timeout=20)
    finally:
        resumed.request_stop("test finished")
        thread.join(timeout=10)
        resumed.close()
    summary = outcome["summary"]
    assert summary["state"] == "SUCCESS"
    assert summary["counters"]["leftover_requests"] == 2
    assert summary["episodes"] == {
        "total": 3, "recorded": 3, "finished": 3, "timed_out": 0, "abandoned": 0, "skipped": 0
    }  # fmt: skip


def test_a_request_sent_once_the_resumed_evaluator_has_announced_itself_is_served_at_once(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, monkeypatch
):
    """The started event says the evaluator serves: what an agent that lived through the restart
    sends from then on is answered, never taken for a request to the evaluator that was killed
    (which the agent would have to send again, a resend interval later)."""
    results = str(tmp_path / "r")
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        _,
    ):
        # Resent only after a minute: a dropped request would go unanswered within this test.
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, resend_after_s=60)
        client.env_create()
        play_episode(client, 0)
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        service.request_stop("killed")

    # The agent sends its next ENV_CREATE the instant the resumed evaluator's started event is out.
    channels: list[str] = []
    announce = EventLog.started

    def announce_then_the_agent_sends(self: EventLog, *args: object, **kwargs: object) -> None:
        announce(self, *args, **kwargs)
        channels.append(client._new_channel())
        redis_conn.lpush(keys.commands_key(service_id), client._tagged(FLATLAND_RL.ENV_CREATE, {}, channels[0]))

    monkeypatch.setattr(EventLog, "started", announce_then_the_agent_sends)
    with running_service(
        spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id, resume=True
    ) as (resumed, _):
        assert len(channels) == 1, "the resumed evaluator announced itself once"
        found = redis_conn.blpop([channels[0]], timeout=3)  # within the connection's own 5 s
        assert found is not None, "the request sent after the started event was dropped as a leftover"
        reply = codec.decode(found[1], codec.REPLY_LIMITS)
        assert reply["type"] == FLATLAND_RL.ENV_CREATE_RESPONSE, reply
        assert resumed.evaluation.counters.get("leftover_requests", 0) == 0


# A RemoteEnv agent that plays two steps of its first episode, creates MARKER, then hangs until
# killed. argv: REDIS_URL SERVICE_ID MARKER.
HANGING_REMOTE_ENV_AGENT = """
import sys, threading
from arbiter.client.remote_env import RemoteEnv
env = RemoteEnv(redis_url=sys.argv[1], service_id=sys.argv[2], reply_timeout_s=10)
env.reset()
env.step(1)
env.step(1)
open(sys.argv[3], "w").close()
threading.Event().wait()
"""


def test_a_remote_env_started_after_a_killed_one_takes_over_the_two_phase_evaluation(
    redis_url, service_id, tmp_path, processes, record_property
):
    from fake_envs import fake_spec

    from arbiter.client.remote_env import RemoteEnv

    step_s = 0.5
    results = str(tmp_path / "r")
    marker = str(tmp_path / "hung")
    competition = fake_spec(phase=1, budgets={"step_s": step_s, "planning_s": step_s})
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        crashing = processes.start([sys.executable, "-c", HANGING_REMOTE_ENV_AGENT, redis_url, service_id, marker])
        wait_for(lambda: os.path.exists(marker), timeout_s=60, what="the first agent's two steps")
        hung_at = time.monotonic()  # after its last step was answered
        sigkill(crashing)
        # Within the killed agent's step budget: refused (OTHER_CLIENT), asked again when the
        # evaluator said, then bound; the timeout of the killed agent's episode is not raised.
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        waited_s = time.monotonic() - hung_at
        record_property("remote_env_admitted_after_s", round(waited_s, 4))
        assert service.gate.owner == env.wire.session
        assert service.evaluation.counters["foreign_requests"] >= 1
        assert waited_s < step_s + 1.0
        returns = []
        _, info = env.reset()
        while not info["env_done"]:
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, info = env.step(1)
                total += reward
                done = terminated or truncated
            returns.append(total)
            _, info = env.reset()
        scores = env.submit()
        env.close()
        summary = finish(outcome)
    records = read_episodes(results)
    assert summary["state"] == "SUCCESS"
    assert summary["counters"]["takeovers"] == 1
    assert [(r["timed_out"], r["steps"]) for r in records] == [(True, 2), (False, 5)]
    assert records[0]["timeout"] == "step" and returns == [10.0]
    assert scores["score"] == summary["score"]["phase1"] == (0.0 + 10.0) / 2


def test_a_new_agent_never_plays_the_evaluation_episodes_of_a_run_it_did_not_train(redis_url, service_id, tmp_path):
    """A runner that crashed between a run's training and its evaluation episodes is replaced
    (a takeover, the evaluator alive): the run's evaluation episodes are recorded as not played
    (they could only be played by an untrained agent, and playing the run again would reward the
    crash with a second try), and the new agent goes on with the next run."""
    from harness import train_until_the_run_ends

    from arbiter.client.remote_env import RemoteEnv
    from arbiter.server.core.competition import load_competition

    settings = ["phase=2", "num_episodes=2", "phase2.num_runs=2", "phase2.max_steps=40", "phase2.goal_reward=20",
                "phase2.stability_window=1", "budgets.step_s=0.3", "phase2.step_s=0.3", "seed=5"]  # fmt: skip
    competition = load_competition("two-phase-cartpole", settings)
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        crashed = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        run0, eval0, run1, eval1 = crashed.stages
        crashed.begin_stage(run0)
        train_until_the_run_ends(crashed, 0)
        wait_for(lambda: read_episodes(results, missing_ok=True), what="run 0's training recorded")
        # The crashed runner sends nothing more; a new one takes over once it has been silent
        # for a step budget, and is handed the next run.
        new = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert new.next_item == run1["items"][0]
        new.begin_stage(run1)
        train_until_the_run_ends(new, 0)
        new.begin_stage(eval1)
        for _ in range(2):
            new.reset()
            done = False
            while not done:
                _, _, terminated, truncated, _ = new.step(0)
                done = terminated or truncated
        new.submit()
        new.close()
        summary = finish(outcome)
    records = read_episodes(results)
    skipped = [r for r in records if r["skipped"]]
    assert [r["index"] for r in skipped] == list(range(*eval0["items"]))
    assert all(r["client"] is None for r in skipped)
    played = {r["client"] for r in records if not r["skipped"]}
    assert played == {crashed.wire.session, new.wire.session}
    assert summary["counters"]["takeovers"] == 1
    assert summary["counters"]["items_not_played_after_takeover"] == 2
    assert summary["state"] == "SUCCESS"
