"""Finished episodes' envs are freed: flatland's class-level caches must not keep them alive; and
the evaluator's process keeps the pages it frees for the next step (server/process_memory.py).

Without ``release_flatland_caches`` each env of an evaluation stays referenced (~9 MiB apiece),
on the evaluator and in the agent; scripts/bench.py measures the RSS over many episodes.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import weakref

import pytest
from harness import finish, play_episode, running_service, spec

from arbiter.client import RemoteClient
from arbiter.server.formats.flatland.episodes import FlatlandTestFolder
from arbiter.server.service.process_memory import MMAP_THRESHOLD, TRIM_THRESHOLD


def test_the_evaluator_frees_each_finished_episodes_env(tiny_tests):
    adapter = FlatlandTestFolder(tiny_tests, seed=1001)
    released = []
    for spec_ in adapter.episodes:
        episode = adapter.open(spec_, "neurips2020")
        if released:
            assert released[-1]() is None, "the previous episode's env is still alive"
        while not episode.step({0: 2, 1: 2}):
            pass
        released.append(weakref.ref(episode.env))
        del episode
    adapter.open(adapter.episodes[0], "neurips2020")
    assert all(ref() is None for ref in released)


def test_the_client_frees_each_finished_episodes_env(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        envs = []
        for episode in range(3):
            client.env_create()
            play_episode(client, episode)
            envs.append(weakref.ref(client.env))
        assert client.env_create() == (False, False)
        client.submit()
        finish(outcome)
    gc.collect()  # the agent's process collects its cycles on its own schedule; here, now
    assert [ref() is None for ref in envs] == [True, True, True]


def test_a_closed_episode_frees_its_env_at_once_without_a_collection(tiny_tests):
    adapter = FlatlandTestFolder(tiny_tests, seed=1001)
    episode = adapter.open(adapter.episodes[0], "neurips2020")
    while not episode.step({0: 2, 1: 2}):
        pass
    steps, reward = episode.steps, episode.reward
    env = weakref.ref(episode.env)
    gc.disable()  # only reference counting may free it
    try:
        episode.close()
        assert env() is None
    finally:
        gc.enable()
    assert (episode.steps, episode.reward) == (steps, reward)


# A step of an env with a 480×512×3 frame, as the evaluator's process sees it: the DIAMBRA mock's
# frame, its bytes, and a reply message holding them; then the same with the thresholds applied.
FRAME_STEPS = """
import json, os, resource, sys
import numpy as np
applied = None
if sys.argv[1] == "keep":
    from arbiter.server.service.process_memory import keep_freed_memory
    applied = keep_freed_memory()

def step(k):
    frame = np.ones((480, 512, 3), dtype=np.int8) * (k % 100)
    data = frame.tobytes()
    message = bytearray(len(data) + 64)
    message[64:] = data
    return len(message)

for k in range(20):
    step(k)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(200):
    step(k)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200
print(json.dumps({"applied": applied, "faults_per_step": faults}))
"""


def frame_steps(mode: str, **env: str) -> dict:
    # glibc's own defaults, whatever this shell set
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", FRAME_STEPS, mode], capture_output=True, text=True, timeout=60,
                          check=True, env={**clean, **env})  # fmt: skip
    return json.loads(done.stdout)


glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")


@glibc_only
def test_the_evaluators_process_reuses_the_pages_of_its_last_step():
    default, kept = frame_steps("default"), frame_steps("keep")
    assert kept["applied"] == {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
    # glibc's defaults map and unmap (or trim) the frame-sized buffers at every step
    assert default["faults_per_step"] > 100, default
    assert kept["faults_per_step"] < 1, kept


@glibc_only
def test_an_operators_malloc_settings_are_left_alone():
    assert frame_steps("keep", MALLOC_TRIM_THRESHOLD_="131072")["applied"] is None
    assert frame_steps("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")["applied"] is None
    assert frame_steps("keep", GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F")["applied"] is not None
