"""server/service/service_claim.py: one evaluator per service id on a Redis. A second evaluator is
refused, naming the first, and leaves its lists alone; one started again after its predecessor
was killed on this machine takes the claim at once; one that lost its claim stops; the claim is
given up at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import paths
import pytest
from fake_envs import counting_competition
from harness import finish, play_episode, running_service, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import DEFAULT_COMPETITION, load_competition
from arbiter.server.service import service_claim
from arbiter.server.service.build import build_service
from arbiter.server.service.events import first_start_recorded

REPO = str(paths.REPO)


def serving(tiny_tests: str, redis_url: str, service_id: str, results) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", str(results), "--quiet"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def holder_pid(redis_conn, service_id: str) -> int | None:
    held = redis_conn.get(keys.evaluator_key(service_id))
    return None if held is None else json.loads(held)["pid"]


@pytest.fixture
def short_waits(monkeypatch):
    """This test process's evaluators wait a short lease for a claim (the serve processes it
    starts keep the default one, several seconds)."""
    monkeypatch.setattr(service_claim, "CLAIM_LEASE_S", 0.3)


def test_a_second_evaluator_on_the_service_id_is_refused_and_leaves_the_first_alone(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, short_waits
):
    first = serving(tiny_tests, redis_url, service_id, tmp_path / "first")
    try:
        wait_for(lambda: redis_conn.xlen(keys.events_key(service_id)), what="the first evaluator to start")
        assert holder_pid(redis_conn, service_id) == first.pid
        queued = b"a timeout the first evaluator's client has yet to read"
        redis_conn.rpush(keys.errors_key(service_id), queued)  # the first's list: a fresh evaluation clears it
        refused = f"another evaluator is serving service id '{service_id}'.*pid {first.pid}"
        with pytest.raises(ConfigError, match=refused):
            build_service(counting_competition(), tests=None, results_dir=str(tmp_path / "second"),
                          redis_url=redis_url, service_id=service_id)  # fmt: skip
        assert redis_conn.lrange(keys.errors_key(service_id), 0, -1) == [queued]
        assert not any((tmp_path / "second").iterdir())  # nothing was written there
        assert first.poll() is None and holder_pid(redis_conn, service_id) == first.pid
    finally:
        first.kill()
        first.wait()
        first.stderr.close()


def test_a_resume_of_a_running_evaluations_folder_is_refused_before_it_writes_there(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, short_waits
):
    """`serve --resume` of the folder an evaluator is writing (the same service id): refused by
    the claim with the folder as the first left it, its table not replaced under it."""
    results = tmp_path / "results"
    first = serving(tiny_tests, redis_url, service_id, results)
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30)
        client.env_create()
        play_episode(client, 0)
        # The item's event is the last thing its evaluator writes for it: the folder stays as it is
        # until the next item starts.
        events = results / "events.jsonl"
        wait_for(lambda: events.exists() and b'"event":"episode"' in events.read_bytes(), what="the item's event")
        before = {path.name: (path.read_bytes(), path.stat().st_ino) for path in results.iterdir()}
        with pytest.raises(ConfigError, match=f"another evaluator is serving service id '{service_id}'"):
            build_service(load_competition(DEFAULT_COMPETITION), tests=tiny_tests, results_dir=str(results),
                          redis_url=redis_url, service_id=service_id, resume=True)  # fmt: skip
        assert {path.name: (path.read_bytes(), path.stat().st_ino) for path in results.iterdir()} == before
        assert first.poll() is None
    finally:
        first.kill()
        first.wait()
        first.stderr.close()


def test_an_evaluator_killed_on_this_machine_leaves_its_claim_to_the_next_at_once(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, short_waits
):
    """Its lease (several seconds) has not run out, and this test's evaluator would give up waiting
    for it after 0.3 s: it takes the claim because its holder's process is gone. Killed once it has
    started its evaluation, resumed under the competition it started with (serve's default)."""
    results = tmp_path / "results"
    killed = serving(tiny_tests, redis_url, service_id, results)
    wait_for(lambda: holder_pid(redis_conn, service_id) == killed.pid, what="the evaluator's claim")
    started = lambda: first_start_recorded(str(results / "events.jsonl"))  # noqa: E731
    wait_for(started, what="the evaluation's started event in its folder")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    killed.stderr.close()
    assert holder_pid(redis_conn, service_id) == killed.pid  # still held: its lease runs on
    resumed = build_service(load_competition(DEFAULT_COMPETITION), tests=tiny_tests, results_dir=str(results),
                            redis_url=redis_url, service_id=service_id, resume=True)  # fmt: skip
    try:
        assert holder_pid(redis_conn, service_id) == os.getpid()
    finally:
        resumed.close()
    assert redis_conn.get(keys.evaluator_key(service_id)) is None  # given up at the end


def test_an_evaluator_whose_claim_another_took_stops_interrupted(
    redis_url, redis_conn, service_id, tmp_path, short_waits
):
    with running_service(counting_competition(), tests=None, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        wait_for(lambda: holder_pid(redis_conn, service_id) == os.getpid(), what="the claim")
        other = {"host": "elsewhere", "pids": "pid:[1]", "pid": 4242, "since": "2026-11-29T12:00:00Z", "token": "x"}
        redis_conn.set(keys.evaluator_key(service_id), json.dumps(other))  # held up past its lease, then this
        summary = finish(outcome)
    assert summary["state"] == "INTERRUPTED"
    assert "another evaluator took over service id" in summary["termination_cause"]
    assert "pid 4242 on elsewhere" in summary["termination_cause"]
    assert json.loads(redis_conn.get(keys.evaluator_key(service_id)))["pid"] == 4242  # the other's, kept


def test_evaluators_of_other_service_ids_share_a_redis(redis_url, redis_conn, service_id, tmp_path, short_waits):
    with running_service(counting_competition(), tests=None, results=str(tmp_path / "a"), redis_url=redis_url,
                         service_id=service_id) as (first, _):  # fmt: skip
        with running_service(counting_competition(), tests=None, results=str(tmp_path / "b"), redis_url=redis_url,
                             service_id=service_id + "-b") as (second, _):  # fmt: skip
            assert first.claim.held and second.claim.held


def test_serve_gives_the_claim_up_when_its_evaluation_ends(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    from harness import play_episode

    from arbiter.client import RemoteClient

    server = serving(tiny_tests, redis_url, service_id, tmp_path / "r")
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()
        server.stderr.close()
    assert redis_conn.get(keys.evaluator_key(service_id)) is None
