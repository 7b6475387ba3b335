"""protocol/spin_wait.SpinWait: a side polls its socket for a reply before sleeping on it, only
while replies come within the window, and only where it has a CPU to spare; replies are the
same either way. Against a real redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from typing import Any

import numpy as np
import pytest
import redis
from harness import finish, read_episodes, remote_episode, running_service, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.client.wire import Wire
from arbiter.protocol import spin_wait
from arbiter.protocol.redis_conn import Packets, connect
from arbiter.protocol.spin_wait import MIN_HIT_RATE, SpinWait, usable_cpus, window_from_environment
from arbiter.server.core.competition import spec_from_dict

pytestmark = pytest.mark.alone  # what a poller does with its CPU depends on what else runs


@pytest.fixture
def client(redis_url):
    client = connect(redis_url, socket_timeout_s=5.0)
    yield client
    client.close()


def is_blocked(redis_conn: redis.Redis, client_id: int) -> bool:
    return any(c["id"] == str(client_id) and "b" in c["flags"] for c in redis_conn.client_list())


def push_once_blocked(redis_conn: redis.Redis, packets: Packets, key: str, value: bytes) -> threading.Thread:
    """A thread that pushes ``value`` once ``packets``' connection is blocked waiting for it."""
    client_id = packets.run([("CLIENT", "ID")])[0]

    def push() -> None:
        wait_for(lambda: is_blocked(redis_conn, client_id), what="the blocking pop")
        redis_conn.rpush(key, value)

    pusher = threading.Thread(target=push)
    pusher.start()
    return pusher


def test_replies_that_come_within_the_window_are_polled_for(client):
    spin = SpinWait(window_s=1.0)
    packets = Packets(client, waiter=spin)
    for i in range(20):
        assert packets.run([("ECHO", f"m{i}"), ("PING",)]) == [f"m{i}".encode(), b"PONG"]
    assert spin.polled >= 20 and spin.slept == 0
    assert spin.hit_rate == 1.0 and spin.polling
    packets.close()


# Asked, it answers a moment later, off the CPU meanwhile: the poller's first looks find nothing.
# (Answering at once, it can be in before the poller's first look: the kernel may run a task it
# wakes ahead of the one running there, and the poller then has no cause to give its CPU away.)
SENDER = """
import os, sys, time, redis
os.sched_setaffinity(0, {int(sys.argv[2])})
r = redis.Redis.from_url(sys.argv[1], socket_timeout=10)
r.client_setname("sender")
r.blpop("go", 10)
time.sleep(0.1)
r.rpush("reply", b"z")
"""


def test_the_poller_gives_its_cpu_away_to_a_sender_that_shares_it(client, redis_conn, redis_url, monkeypatch):
    """The reply's sender runs on the poller's only CPU and answers a moment after it is asked:
    the poller gives that CPU away between its looks at the socket, and the wait is still a
    polled hit."""
    yields = []

    def counted_yield() -> None:
        yields.append(1)
        os.sched_yield()

    monkeypatch.setattr(spin_wait, "yield_cpu", counted_yield)
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    sender = subprocess.Popen([sys.executable, "-c", SENDER, redis_url, str(cpu)])
    try:
        wait_for(lambda: any(c["name"] == "sender" and "b" in c["flags"] for c in redis_conn.client_list()),
                 what="the sender's blocking pop")  # fmt: skip
        spin = SpinWait(window_s=10.0)
        packets = Packets(client, waiter=spin)
        os.sched_setaffinity(0, {cpu})
        try:
            assert packets.run([("RPUSH", "go", b"1"), ("BLPOP", "reply", 10)]) == [1, [b"reply", b"z"]]
        finally:
            os.sched_setaffinity(0, allowed)
        assert sender.wait(timeout=10) == 0
        assert spin.polled >= 1 and spin.slept == 0 and spin.hit_rate == 1.0
        assert yields, "the poller never gave its CPU away while it waited"
        packets.close()
    finally:
        sender.kill()
        sender.wait()


def test_polling_stops_while_replies_come_later_than_the_window_and_resumes_when_they_are_quick(client, redis_conn):
    spin = SpinWait(window_s=1e-6)  # no reply comes back from Redis within a microsecond
    packets = Packets(client, waiter=spin)
    for i in range(12):  # 12 misses take the hit rate from 1 below 0.5: (15/16)**11 = 0.49
        assert packets.run([("ECHO", f"m{i}")]) == [f"m{i}".encode()]
    assert not spin.polling and spin.hit_rate < MIN_HIT_RATE
    polled = spin.polled
    assert packets.run([("ECHO", "asleep")]) == [b"asleep"]
    assert spin.polled == polled and spin.slept >= 1
    # a reply that another client sends later is read whole, polled for or not
    pusher = push_once_blocked(redis_conn, packets, "late", b"x")
    assert packets.run([("BLPOP", "late", 5)]) == [[b"late", b"x"]]
    pusher.join()
    # replies that come within the window again (a generous one now) bring polling back
    spin.window_s = 1.0
    for i in range(12):
        packets.run([("ECHO", f"quick{i}")])
    assert spin.polling and spin.polled > polled
    packets.close()


def test_a_reply_that_comes_after_the_window_is_still_read(client, redis_conn):
    spin = SpinWait(window_s=10e-6)  # another client's push takes longer than that to arrive
    packets = Packets(client, waiter=spin)
    pusher = push_once_blocked(redis_conn, packets, "slow", b"y")
    assert packets.run([("RPOP", "none"), ("BLPOP", "slow", 5), ("ECHO", "after")]) == [None, [b"slow", b"y"], b"after"]
    pusher.join()
    assert spin.hit_rate < 1.0  # the blocking pop's reply was a miss, learnt from
    packets.close()


def test_the_window_comes_from_the_keyword_else_arbiter_spin_us_else_the_default(monkeypatch):
    monkeypatch.setattr(spin_wait, "usable_cpus", lambda: 2.0)
    monkeypatch.delenv("ARBITER_SPIN_US", raising=False)
    assert window_from_environment() == spin_wait.DEFAULT_WINDOW_US / 1e6
    monkeypatch.setenv("ARBITER_SPIN_US", "250")
    assert window_from_environment() == pytest.approx(250e-6)
    assert window_from_environment(40) == pytest.approx(40e-6)
    monkeypatch.setenv("ARBITER_SPIN_US", "0")
    assert window_from_environment() == 0.0
    monkeypatch.setenv("ARBITER_SPIN_US", "fast")
    with pytest.raises(ValueError, match="ARBITER_SPIN_US must be a number of microseconds, got 'fast'"):
        window_from_environment()
    with pytest.raises(ValueError, match="0 or more microseconds"):
        window_from_environment(-1)


def test_no_polling_with_fewer_than_two_usable_cpus(monkeypatch, tmp_path):
    monkeypatch.setattr(spin_wait.os, "sched_getaffinity", lambda pid: {0})
    assert usable_cpus() == 1
    assert window_from_environment(1000) == 0.0
    # a container's CPU quota (cgroup v2 cpu.max: quota and period in µs) caps the affinity
    monkeypatch.setattr(spin_wait.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(spin_wait, "CGROUP_CPU_MAX", cpu_max)
    cpu_max.write_text("150000 100000\n")
    assert usable_cpus() == 1.5
    assert window_from_environment(1000) == 0.0
    cpu_max.write_text("max 100000\n")
    assert usable_cpus() == 4
    assert window_from_environment(1000) == pytest.approx(0.001)
    cpu_max.unlink()
    assert usable_cpus() == 4


def test_the_wire_polls_unless_spin_us_is_zero(redis_url, service_id, monkeypatch):
    monkeypatch.setattr(spin_wait, "usable_cpus", lambda: 2.0)
    assert Wire(redis_url, service_id, spin_us=0).spin is None
    polling = Wire(redis_url, service_id, spin_us=300)
    assert polling.spin is not None and polling.spin.window_s == pytest.approx(300e-6)
    assert polling.packets._waiter is polling.spin


def cartpole_phase1() -> Any:
    return spec_from_dict(
        "spin",
        {"format": "two-phase", "seed": 11, "env_id": "CartPole-v1", "num_episodes": 3, "phase": 1,
         "budgets": {"step_s": 5.0, "planning_s": 5.0, "idle_s": 10.0, "overall_s": 300.0}},
    )  # fmt: skip


def test_a_polling_remote_env_plays_exactly_what_a_sleeping_one_plays(redis_url, tmp_path, monkeypatch):
    spin_us = 1000
    monkeypatch.setattr(spin_wait, "usable_cpus", lambda: 2.0)
    played: dict[int, list[Any]] = {}
    results_of: dict[int, str] = {}
    for window in (0, spin_us):
        service_id = f"spin-{window}-{uuid.uuid4().hex[:8]}"
        results = results_of[window] = str(tmp_path / service_id)
        with running_service(cartpole_phase1(), tests=None, results=results, redis_url=redis_url,
                             service_id=service_id) as (_, outcome):  # fmt: skip
            env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, spin_us=window)
            episodes = [remote_episode(env, lambda obs: int(obs[2] > 0), {}) for _ in range(3)]
            assert (env.wire.spin is None) == (window == 0)
            if window:
                assert env.wire.spin.polled > 0
            env.submit()
            env.close()
            assert finish(outcome)["state"] == "SUCCESS"
        played[window] = [(total, np.stack(seen)) for total, seen in episodes]
    for (total_a, seen_a), (total_b, seen_b) in zip(played[0], played[spin_us], strict=True):
        assert total_a == total_b and np.array_equal(seen_a, seen_b)
    for window, results in results_of.items():  # and the evaluator recorded what the agent saw
        assert [r["return"] for r in read_episodes(results)] == [total for total, _ in played[window]]
