"""client/remote_client.py: RemoteClient, flatland's client API over arbiter's wire. What it puts on
the wire for the actions an agent hands to env_step, and a whole evaluation played with it against
a real evaluator (the session's redis-server, the tiny Flatland test set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from flatland.envs.rail_env_action import RailEnvActions
from harness import finish, play_episode, read_episodes, running_service, spec

from arbiter.client.remote_client import RemoteClient, _plain_actions
from arbiter.protocol.errors import OutOfOrder


def test_plain_ints_pass_through_unchanged():
    actions = {0: 2, 1: 0, 7: 4}
    assert _plain_actions(actions) == actions


def test_flatland_actions_and_numpy_scalars_go_as_plain_values_the_rest_as_it_is():
    actions = _plain_actions(
        {np.int64(0): RailEnvActions.MOVE_FORWARD, 1: np.int32(3), "2": RailEnvActions.STOP_MOVING, 3.0: "1"}
    )
    assert actions == {0: 2, 1: 3, "2": 4, 3.0: "1"}  # "2" is no handle to flatland's env.get(2)
    assert [type(v) for v in actions.values()] == [int, int, int, str]


def test_what_is_no_action_reaches_both_copies_alike_and_never_raises():
    """Each agent's action, read from the sent map the way flatland's env reads it, is the same
    one the evaluator applies (its own reading is checked against flatland's in the Flatland
    format's tests); nothing here raises."""
    from arbiter.server.formats.flatland.episodes import sanitize_actions

    sent = _plain_actions({0: "forward", 1: None, 2: [2, 2], 3: 2.7, 4: True, 5: "MOVE_RIGHT", object(): 2})
    assert sent == {0: "forward", 1: None, 2: None, 3: 2.7, 4: True, 5: "MOVE_RIGHT"}
    clean, invalid = sanitize_actions(sent, num_agents=6)
    for handle in range(6):
        assert clean.get(handle, 0) == RailEnvActions.from_value(sent.get(handle, RailEnvActions.DO_NOTHING)).value
    assert invalid == 4  # "forward", None, the list, 2.7


@pytest.mark.parametrize("actions", [[2, 2], (2, 2), np.array([2, 2]), "MOVE_FORWARD", None])
def test_an_action_map_that_is_no_map_is_refused_before_anything_is_sent(actions):
    """flatland's env.step needs a map too: a list of actions would otherwise be no action for any
    agent, an evaluation of DO_NOTHING without a word."""
    with pytest.raises(TypeError, match="env_step takes a map of agent handle to action") as refused:
        _plain_actions(actions)
    assert ("dict(enumerate(actions))" in str(refused.value)) is isinstance(actions, (list, tuple, np.ndarray))
    assert _plain_actions({}) == {}


def test_a_policy_s_one_element_arrays_are_its_actions():
    actions = _plain_actions({0: np.array(2), 1: np.array([3], np.uint8), 2: np.array([1, 2])})
    assert actions == {0: 2, 1: 3, 2: None}  # two actions for one agent is none
    assert [type(v) for v in actions.values()][:2] == [int, int]


# -- RemoteClient against a real evaluator (the tiny Flatland test set) ----------------------------


def test_the_client_plays_every_episode_the_evaluator_hands_out(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(spec(), tests=tiny_tests, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert client.time_left_s() is None  # no running episode
        played = []
        while True:
            observation, info = client.env_create()
            if observation is False:
                break
            played.append(client.episode_index)
            assert client.env.get_num_agents() == 2 and client.time_left_s() > 0
            play_episode(client, client.episode_index)
        assert (observation, info) == (False, False) and client.env is None
        scores = client.submit()
        client.close()
        summary = finish(outcome)
    assert played == [0, 1, 2]
    assert summary["state"] == "SUCCESS" and scores["score"] == summary["score"]["primary"]
    assert [record["index"] for record in read_episodes(str(tmp_path))] == [0, 1, 2]


def test_a_step_before_an_episode_is_refused_on_the_client(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(spec(), tests=tiny_tests, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        with pytest.raises(OutOfOrder, match="before env_create"):
            client.env_step({0: 2, 1: 2})
        client.close()
        service.request_stop("the test is over")
        assert finish(outcome)["counters"].get("errors_out_of_order", 0) == 0  # nothing was sent


def test_flatland_actions_reach_the_evaluator_as_the_moves_they_name(redis_url, service_id, tiny_tests, tmp_path):
    """The same episode played with RailEnvActions and with their ints ends the same on both sides."""
    ends = []
    for run, as_enum in enumerate((False, True)):
        results = str(tmp_path / f"run-{run}")
        sid = f"{service_id}-{run}"
        with running_service(spec(max_episodes=1), tests=tiny_tests, results=results, redis_url=redis_url,
                             service_id=sid) as (_, outcome):  # fmt: skip
            client = RemoteClient(redis_url=redis_url, service_id=sid, reply_timeout_s=10)
            client.env_create()
            done = {"__all__": False}
            while not done["__all__"]:
                move = RailEnvActions.MOVE_FORWARD if as_enum else 2
                _, _, done, _ = client.env_step({np.int64(0): move, 1: move} if as_enum else {0: move, 1: move})
            assert client.env_create() == (False, False)
            client.submit()
            client.close()
            finish(outcome)
        [record] = read_episodes(results)
        ends.append((record["steps"], record["reward"], record["invalid_actions"]))
    assert ends[0] == ends[1] and ends[0][2] == 0


# -- the agent's garbage collector --------------------------------------------------------------

FREEZING_AGENT = """
import gc, json, sys
from arbiter.client.remote_client import RemoteClient
before = gc.get_freeze_count()
keywords = json.loads(sys.argv[3])
client = RemoteClient(redis_url=sys.argv[1], service_id=sys.argv[2], reply_timeout_s=10, **keywords)
frozen = gc.get_freeze_count()
made_after = [[index] for index in range(1000)]
from arbiter.client.remote_client import set_aside_what_is_loaded
set_aside_what_is_loaded()  # as a second client would: once per process, what came after stays collectable
print(json.dumps([before, frozen, gc.get_freeze_count()]))
client.close()
"""


@pytest.mark.parametrize(
    ("environment", "keywords", "freezes"),
    [({}, {}, True), ({"ARBITER_FREEZE_GC": "0"}, {}, False), ({}, {"freeze_gc": False}, False)],
    ids=["by-default", "ARBITER_FREEZE_GC=0", "freeze_gc=False"],
)
def test_the_client_sets_aside_what_its_process_loaded_once(
    redis_url, service_id, tiny_tests, tmp_path, environment, keywords, freezes
):
    with running_service(spec(), tests=tiny_tests, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (service, _):  # fmt: skip
        agent = subprocess.run(
            [sys.executable, "-c", FREEZING_AGENT, redis_url, service_id, json.dumps(keywords)],
            env={**os.environ, **environment}, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        service.request_stop("the test is over")
    assert agent.returncode == 0, agent.stderr
    before, after_client, after_second_call = json.loads(agent.stdout)
    assert before == 0
    if freezes:
        # flatland, numpy, redis and the rest: many thousands of objects no full collection walks again
        assert after_client > 10_000 and after_second_call == after_client
    else:
        # The opt-outs are RemoteClient's: the function itself always freezes.
        assert after_client == 0 and after_second_call > 10_000


def test_a_step_after_the_episode_ended_is_out_of_order_and_sends_nothing(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(spec(), tests=tiny_tests, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, client.episode_index)
        with pytest.raises(OutOfOrder, match="after the episode ended: call env_create"):
            client.env_step({0: 2, 1: 2})
        client.env_create()  # the next episode plays on
        client.env_step({0: 2, 1: 2})
        client.close()
        service.request_stop("the test is over")
        summary = finish(outcome)
    assert summary["counters"].get("errors_out_of_order", 0) == 0


def test_a_closed_client_lets_the_next_one_in_at_once(redis_url, service_id, tiny_tests, tmp_path):
    """close() releases the evaluation: the next client (a second one in the same process, an
    agent started again) is served at once, not after the first has been silent for its step
    budget (5 s, ten times the second client's reply timeout)."""
    with running_service(spec(step_s=5.0), tests=tiny_tests, results=str(tmp_path), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        first = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        first.env_create()
        play_episode(first, first.episode_index)
        first.close()
        second = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=0.5)
        second.env_create()
        assert second.episode_index == 1
        play_episode(second, second.episode_index)
        service.request_stop("the test is over")
        summary = finish(outcome)
        second.close()
    assert summary["counters"]["releases"] == 1 and summary["counters"].get("takeovers") == 1
    assert read_episodes(str(tmp_path))[0]["ended"] == "finished"
