"""The evaluator polls its socket for the agent's next request before sleeping on it: by default
where it has two CPUs, in a window of its own (``arbiter run`` and ``serve`` read
``ARBITER_EVALUATOR_SPIN_US``; 0 turns it off), whatever the format, and a stop still ends a
polling wait at once. Against the session's redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from fake_envs import counting_competition
from harness import finish, remote_episode, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol import keys, spin_wait
from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.settings import EVALUATOR_SPIN_VARIABLE, resolve_poll_window_us
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.service.build import build_service
from arbiter.server.service.transport import EVALUATOR_WINDOW_US, RedisTransport, StopRequested

pytestmark = pytest.mark.alone  # what a poller does with its CPU depends on what else runs


def wait_until_blocked(redis_conn) -> None:
    """Redis holds the evaluator's wait (its BLMOVE) for a request."""
    wait_for(lambda: any(c.get("cmd") == "blmove" for c in redis_conn.client_list()), what="the evaluator's wait")


@pytest.fixture
def two_cpus(monkeypatch):
    """Polling is off with fewer than two usable CPUs: these tests say what happens with two."""
    monkeypatch.setattr(spin_wait, "usable_cpus", lambda: 2.0)


def test_the_evaluator_polls_in_its_own_window_unless_it_is_zero(two_cpus, redis_url, service_id):
    polling = RedisTransport(redis_url, service_id)
    assert polling.spin is not None and polling.spin.window_s == pytest.approx(EVALUATOR_WINDOW_US / 1e6)
    assert polling.packets._waiter is polling.spin
    assert EVALUATOR_WINDOW_US < spin_wait.DEFAULT_WINDOW_US  # shorter than the agent's wait for a reply
    sleeping = RedisTransport(redis_url, service_id, spin_us=0)
    assert sleeping.spin is None and sleeping.packets._waiter is None
    narrow = RedisTransport(redis_url, service_id, spin_us=80)
    assert narrow.spin.window_s == pytest.approx(80e-6)
    with pytest.raises(ValueError, match="0 or more microseconds"):
        RedisTransport(redis_url, service_id, spin_us=-1)
    for transport in (polling, sleeping, narrow):
        transport.close()


def test_no_polling_with_one_cpu(redis_url, service_id, monkeypatch):
    monkeypatch.setattr(spin_wait, "usable_cpus", lambda: 1.0)
    transport = RedisTransport(redis_url, service_id, spin_us=300)
    assert transport.spin is None
    transport.close()


def test_the_command_line_reads_the_window_from_arbiter_evaluator_spin_us(monkeypatch):
    monkeypatch.delenv(EVALUATOR_SPIN_VARIABLE, raising=False)
    assert resolve_poll_window_us() == EVALUATOR_WINDOW_US
    monkeypatch.setenv("ARBITER_SPIN_US", "0")  # the agent's window is not the evaluator's
    assert resolve_poll_window_us() == EVALUATOR_WINDOW_US
    monkeypatch.setenv(EVALUATOR_SPIN_VARIABLE, "80")
    assert resolve_poll_window_us() == 80.0
    monkeypatch.setenv(EVALUATOR_SPIN_VARIABLE, "0")
    assert resolve_poll_window_us() == 0.0
    monkeypatch.setenv(EVALUATOR_SPIN_VARIABLE, "soon")
    with pytest.raises(ConfigError, match="ARBITER_EVALUATOR_SPIN_US='soon' is not a number of microseconds"):
        resolve_poll_window_us()
    monkeypatch.setenv(EVALUATOR_SPIN_VARIABLE, "-5")
    with pytest.raises(ConfigError, match="ARBITER_EVALUATOR_SPIN_US='-5' must be 0 or more"):
        resolve_poll_window_us()


@pytest.mark.parametrize("command", [["run"], ["serve"]])
def test_run_and_serve_refuse_a_window_that_is_not_a_number_before_starting_anything(tmp_path, command):
    results = tmp_path / "results"
    agent = ["--", sys.executable, "-c", "0"] if command == ["run"] else []
    run = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", *command, "--results", str(results), *agent],
        env={**os.environ, EVALUATOR_SPIN_VARIABLE: "fast"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "ARBITER_EVALUATOR_SPIN_US='fast' is not a number of microseconds" in run.stderr
    assert not results.exists()


def test_a_request_that_comes_within_the_window_is_polled_for(two_cpus, redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id, spin_us=2_000_000)  # 2 s: any push here comes within it
    try:
        popped: list[bytes | None] = []
        waiting = threading.Thread(target=lambda: popped.append(transport.pop(time.monotonic() + 10.0)))
        waiting.start()
        wait_until_blocked(redis_conn)  # Redis holds the wait; the evaluator polls its socket for the answer
        redis_conn.lpush(keys.commands_key(service_id), b"the next step")
        waiting.join(timeout=5.0)
        assert popped == [b"the next step"]
        assert transport.spin.polled >= 1 and transport.spin.slept == 0 and transport.spin.hit_rate == 1.0
    finally:
        transport.close()


def test_a_stop_from_another_thread_ends_a_polling_wait_at_once(two_cpus, redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id, spin_us=10_000_000)  # it would poll for 10 s
    outcome: list[BaseException | bytes | None] = []

    def pop() -> None:
        try:
            outcome.append(transport.pop(time.monotonic() + 30.0))
        except BaseException as exc:  # noqa: BLE001 - what ended the wait is the outcome
            outcome.append(exc)

    waiting = threading.Thread(target=pop)
    waiting.start()
    try:
        wait_until_blocked(redis_conn)
        stopped_at = time.monotonic()
        transport.request_stop()
        waiting.join(timeout=5.0)
        assert not waiting.is_alive()
        assert time.monotonic() - stopped_at < 1.0
        assert len(outcome) == 1 and (outcome[0] is None or isinstance(outcome[0], StopRequested))
        assert transport.spin.polled >= 1
    finally:
        transport.close()


def test_a_polling_evaluator_plays_the_episodes_a_sleeping_one_plays(redis_url, tmp_path, monkeypatch):
    played = {}
    for window in (0, 300):
        # the evaluator's default window, where it has the two CPUs polling needs and where it has one
        monkeypatch.setattr(spin_wait, "usable_cpus", lambda window=window: 2.0 if window else 1.0)
        service_id = f"polls-{window}"
        with running_service(counting_competition(), tests=None, results=str(tmp_path / service_id),
                             redis_url=redis_url, service_id=service_id) as (service, outcome):  # fmt: skip
            assert (service.transport.spin is None) == (window == 0)
            env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
            played[window] = [remote_episode(env, lambda observation: int(observation[0]) % 2, {}) for _ in range(3)]
            env.submit()
            env.close()
            assert finish(outcome)["state"] == "SUCCESS"
            if window:
                assert service.transport.spin.polled > 0
    for (total_asleep, seen_asleep), (total_polled, seen_polled) in zip(played[0], played[300], strict=True):
        assert total_asleep == total_polled and np.array_equal(np.stack(seen_asleep), np.stack(seen_polled))


def test_every_format_is_served_by_an_evaluator_that_polls_unless_its_window_is_zero(
    two_cpus, redis_url, service_id, tmp_path
):
    """MetaLC's included: its runner sleeps while its fold's process plays, so the evaluator's
    polling takes no CPU they need (the docs' performance log has the pairs that decided it)."""
    meta = tmp_path / "meta"
    write_meta_dataset(str(meta), GeneratorSettings(datasets=6, algorithms=2, seed=1))
    metalc_spec = load_competition("metalc-wcci2022", [])
    metalc = build_service(metalc_spec, tests=str(meta), results_dir=str(tmp_path / "metalc"), redis_url=redis_url,
                           service_id=service_id)  # fmt: skip
    gym = build_service(counting_competition(), tests=None, results_dir=str(tmp_path / "gym"), redis_url=redis_url,
                        service_id=service_id + "-gym")  # fmt: skip
    off = build_service(counting_competition(), tests=None, results_dir=str(tmp_path / "off"), redis_url=redis_url,
                        service_id=service_id + "-off", poll_window_us=0)  # fmt: skip
    try:
        for polling in (metalc, gym):
            assert polling.transport.spin is not None
            assert polling.transport.spin.window_s == pytest.approx(EVALUATOR_WINDOW_US / 1e6)
        assert off.transport.spin is None
    finally:
        for service in (metalc, gym, off):
            service.close()
