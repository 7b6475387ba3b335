"""Finished episodes' envs are freed: flatland's class-level caches must not keep them alive.
(The evaluator's process keeping the pages it frees is in tests/service/test_process_memory.py.)

Without ``release_flatland_caches`` each env of an evaluation stays referenced (~9 MiB apiece),
on the evaluator and in the agent; scripts/bench.py measures the RSS over many episodes.
"""

from __future__ import annotations

import gc
import weakref

from harness import finish, play_episode, running_service, spec

from arbiter.client import RemoteClient
from arbiter.protocol.legacy.flatland_env import release_flatland_caches
from arbiter.server.formats.flatland.episodes import FlatlandTestFolder


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


def test_a_closed_episode_is_freed_when_the_next_open_clears_flatlands_caches_without_a_collection(tiny_tests):
    adapter = FlatlandTestFolder(tiny_tests, seed=1001)
    episode = adapter.open(adapter.episodes[0], "neurips2020")
    while not episode.step({0: 2, 1: 2}):
        pass
    steps, reward = episode.steps, episode.reward
    env = weakref.ref(episode.env)
    gc.disable()  # only reference counting may free it
    try:
        episode.close()
        assert env() is not None, "flatland's caches hold it until the next open clears them"
        release_flatland_caches()  # what the next open does first, before its collection
        assert env() is None
    finally:
        gc.enable()
    assert (episode.steps, episode.reward) == (steps, reward)
