"""Huge requests cannot blow up the evaluator's memory.

The participant's ACL user may LPUSH values of any size Redis accepts onto its commands list.
The evaluator takes requests through a script that runs inside Redis and hands over at most
TAKE_BYTES at once, cutting an oversized request to one byte over the request limit
(server/transport.py): the rest never leaves Redis. Measured on a real `arbiter serve` process
(/proc/<pid>/status VmHWM, its peak resident memory): when the evaluator took a batch of
requests whatever their size, its peak grew by about the whole attack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import paths
import pytest
import redis
from harness import play_episode, read_summary

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.server.service.acl import participant_acl
from arbiter.server.service.transport import TAKE_BYTES

REPO = str(paths.REPO)
EPISODES = 3  # the tiny test set's
ATTACK_REQUESTS = 64  # one take's worth of requests before the bound, by count
ATTACK_BYTES = 4 << 20  # each: 4 MiB, 256 MiB in all
# The evaluator's peak may grow by one take (TAKE_BYTES, 64 KiB) and the socket read buffer
# (64 KiB) while a request is decoded and refused, plus the allocator's rounding: 4 MiB is
# ample for that, and 64 times less than the attack.
PEAK_GROWTH_BOUND_MIB = 4.0


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.fixture
def participant(redis_conn, redis_url, service_id):
    """A connection as the evaluation's participant, with exactly its hosted ACL user's rights."""
    password = uuid.uuid4().hex
    tokens = participant_acl(service_id, password)
    redis_conn.execute_command(*tokens)
    user = tokens[2]
    conn = redis.Redis.from_url(redis_url.replace("redis://", f"redis://{user}:{password}@", 1), socket_timeout=30)
    try:
        yield conn
    finally:
        conn.close()
        redis_conn.acl_deluser(user)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the evaluator's peak memory from /proc")
def test_huge_requests_leave_the_evaluators_peak_memory_where_it_was(
    redis_url, service_id, participant, tiny_tests, tmp_path
):
    results = tmp_path / "results"
    evaluator = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", str(results), "--quiet"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=60)
        for episode in range(EPISODES):
            client.env_create()
            play_episode(client, episode)
        # Every item is played: the evaluator has nothing left to load, and waits for the agent.
        assert client.env_create() == (False, False)
        baseline_mib = peak_rss_mib(evaluator.pid)

        attack = [os.urandom(16) + bytes(ATTACK_BYTES - 16) for _ in range(ATTACK_REQUESTS)]
        participant.lpush(keys.commands_key(service_id), *attack)
        del attack
        # Queued behind the attack, so answered once every huge request was handled.
        assert client.env_create() == (False, False)
        growth_mib = peak_rss_mib(evaluator.pid) - baseline_mib
        print(f"\nevaluator peak RSS {baseline_mib:.1f} MiB, +{growth_mib:.1f} MiB under {ATTACK_REQUESTS} requests "
              f"of {ATTACK_BYTES >> 20} MiB (take bound {TAKE_BYTES} bytes)")  # fmt: skip
        assert growth_mib < PEAK_GROWTH_BOUND_MIB

        scores = client.submit()
        assert evaluator.wait(timeout=30) == 0, evaluator.stderr.read()[-3000:]
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and scores["score"] == summary["score"]["primary"]
    assert summary["counters"]["bad_messages"] == ATTACK_REQUESTS  # each refused as too large, and counted
