"""Bad input on the two-phase format (faults F5 to F7, docs/design/reliability.md#f5), for its
messages: hostile ENV_CREATE extensions, actions of every wrong shape, raw garbage. A real
redis-server; the evaluator runs in this process, so its state can be looked at between requests."""

from __future__ import annotations

import os
import pickle
import random
import statistics
import struct
import sys
from typing import Any

import gymnasium
import msgpack
import numpy as np
import paths
import pytest
from harness import finish, read_episodes, remote_episode, running_service, train_until_the_run_ends, wait_for

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import InvalidAction, ProtocolError
from arbiter.protocol.messages import FLATLAND_RL, REQUEST_TYPES
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.formats.base import reset_seed

REPO = str(paths.REPO)
TESTS_DIR = str(paths.SUPPORT)
EXAMPLE = os.path.join(REPO, "examples", "reinforcelab_cartpole")
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
# Small CartPole settings: 2 episodes per evaluation stage, 2 runs, a short streak, bounded runs.
SMALL = ["num_episodes=2", "phase2.num_runs=2", "phase2.stability_window=2", "phase2.max_steps=3000"]
CARTPOLE_SEED = 1001  # the preset's
RUN_ITEMS = ("train", "eval/0", "eval/1")  # one phase-2 run's items with num_episodes = 2


def competition(env_id: str = "fake_envs:CountingEnv", **extra: Any) -> Any:
    data: dict[str, Any] = {
        "format": "two-phase", "seed": 7, "env_id": env_id, "num_episodes": 2,
        "phase2": {"max_steps": 200, "goal_reward": 9.0, "stability_window": 2, "num_runs": 2,
                   "step_s": 5.0, "planning_s": 5.0, "run_budget_s": 60.0},
        "budgets": {"step_s": 5.0, "planning_s": 5.0, "idle_s": 10.0, "overall_s": 300.0},
    }  # fmt: skip
    if env_id.startswith("fake_envs:"):
        data.update(env_kwargs={"length": 5, "bonus": 1.0}, reward_per_step=[1.0, 2.0], worst_return=0.0)
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return spec_from_dict("faults", data)


def cartpole_policy(observation: Any) -> int:
    return int(observation[2] > 0)


def pendulum_policy(observation: Any) -> np.ndarray:
    return np.array([np.clip(-2.0 * observation[2], -2.0, 2.0)], dtype=np.float32)


def local_episode(env_id: str, seed: int, policy: Any) -> tuple[float, list[Any]]:
    """The episode the evaluator must have played: the same env, seed and policy, in process."""
    env = gymnasium.make(env_id)
    observation, _ = env.reset(seed=seed)
    seen, total, done = [observation], 0.0, False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(policy(observation))
        seen.append(observation)
        total += float(reward)
        done = terminated or truncated
    env.close()
    return total, seen


def same_trajectory(got: list[Any], want: list[Any]) -> bool:
    pairs = zip(got, want, strict=False)
    return len(got) == len(want) and all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in pairs)


# --- F7 for the new messages: ENV_CREATE extensions, actions of every wrong shape ----------------

# Not a later item of the plan: wrong types, earlier items, one the plan does not have, odd sizes.
JUNK_ITEMS = ["2", [2], {"item": 2}, 2.5, -1, 0, 1, True, 10**18, "x" * 4000, {"a": {"b": {"c": [[2]]}}}]


def test_an_env_create_naming_no_later_item_is_refused_and_the_training_run_goes_on(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    spec = competition(phase=2, num_episodes=1)  # items: run 0 train, eval; run 1 train, eval
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        evaluation = service.evaluation
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.begin_stage(env.stages[0])
        train_until_the_run_ends(env, 1)
        env.begin_stage(env.stages[1])
        remote_episode(env, lambda _: 1, {})
        env.begin_stage(env.stages[2])
        env.reset()
        env.step(1)
        run, written = evaluation.current, len(evaluation.records)
        refused = []
        for junk in JUNK_ITEMS:
            try:
                opened = env.wire.request(FLATLAND_RL.ENV_CREATE, {"arbiter": {"item": junk}})["payload"]["arbiter"]
                pytest.fail(f"ENV_CREATE naming item {junk!r} in run 1's training was not refused; it opened {opened}")
            except ProtocolError as error:
                refused.append(str(error))
            assert evaluation.current is run and run.total_steps == 1 and run.episode == 0, f"item {junk!r} applied"
            assert evaluation.next_index == 3 and len(evaluation.records) == written
        assert all("item" in message for message in refused), refused
        for _ in range(4):
            env.step(1)
        train_until_the_run_ends(env, 1)
        env.begin_stage(env.stages[3])
        remote_episode(env, lambda _: 1, {})
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert [r["convergence_step"] for r in summary["score"]["runs"]] == [15, 15]
    assert not any(r["abandoned"] for r in read_episodes(results))


def test_the_client_cannot_choose_the_seed_the_env_or_its_options(redis_url, service_id, tmp_path):
    results = str(tmp_path / "r")
    with running_service(competition(phase=1), tests=None, results=results, redis_url=redis_url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        wishes = {"seed": 5, "env_id": "CartPole-v1", "options": {"length": 1}, "env_kwargs": {"length": 1}}
        created = env.wire.request(FLATLAND_RL.ENV_CREATE, {**wishes, "arbiter": {**wishes, "item": 0}})["payload"]
        assert "random_seed" not in created and "seed" not in created["arbiter"]  # secret while it runs
        assert created["info"]["seed_seen"] == reset_seed(7, 1, 0)  # the env's own info: the server's seed
        env.episode = created["arbiter"]
        assert [env.step(1)[2] for _ in range(5)] == [False] * 4 + [True]  # still 5 steps long
        _, info = env.reset(seed=5, options={"length": 1})
        assert info["seed_seen"] == reset_seed(7, 1, 1)
        assert [env.step(0)[2] for _ in range(5)] == [False] * 4 + [True]
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["score"]["phase1"] == (10.0 + 5.0) / 2


DISCRETE_BAD = [2, -1, 1.0, 0.0, "1", b"\x01", [1], [[1]], {"a": 1}, {0: 1}, True, False, None, 2**63, -(2**63),
                2**64 - 1, np.array([1]), np.array(1.5), np.float32(1.0), float("nan"), [0] * 5000]  # fmt: skip
BOX_BAD = [None, 1.0, 0, True, "1.0", b"\x00" * 4, [], [0.5, 0.5], [[0.5]], [2.5], [-2.5], [float("nan")],
           [float("inf")], ["0.5"], [None], {"0": 0.5}, np.zeros((1, 1), np.float32), np.array([3.0]),
           np.array(0.5), [2**63], [1e39], [0.0] * 5000, [[[[0.5]]]]]  # fmt: skip
SPACES = {
    # env id, policy, bad actions, accepted other forms of the policy's action, extra competition keys
    "discrete": ("CartPole-v1", cartpole_policy, DISCRETE_BAD, (np.int64, np.array), {}),
    "box": ("Pendulum-v1", pendulum_policy, BOX_BAD, (lambda a: [float(a[0])], lambda a: a.astype(np.float64)),
            {"worst_return": -2000.0}),
}  # fmt: skip


@pytest.mark.parametrize("space", sorted(SPACES))
def test_actions_of_every_wrong_shape_are_refused_and_the_env_is_never_touched(space, redis_url, service_id, tmp_path):
    env_id, policy, bad_actions, other_forms, extra = SPACES[space]
    results = str(tmp_path / "r")
    with running_service(competition(env_id, phase=1, **extra), tests=None, results=results, redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        evaluation = service.evaluation
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)

        def refuse_all(action: Any) -> Any:
            steps = evaluation.current.steps
            for bad in bad_actions:
                with pytest.raises(InvalidAction, match="not in the action space .*nothing was applied"):
                    env.step(bad)
                assert evaluation.current.steps == steps, f"{bad!r} was applied"
            with pytest.raises(InvalidAction):
                env.wire.request(FLATLAND_RL.ENV_STEP, {"arbiter": {"reply": True}})  # no action at all
            return other_forms[steps % 2](action)  # the policy's action, in another accepted form

        # Refused in the planning window of episode 0 and mid-episode in episode 1.
        played = [remote_episode(env, policy, {0: refuse_all}), remote_episode(env, policy, {3: refuse_all})]
        env.submit()
        env.close()
        summary = finish(outcome)
    expected = [local_episode(env_id, reset_seed(7, 1, i), policy) for i in range(2)]
    for (got_return, got_seen), (want_return, want_seen) in zip(played, expected, strict=True):
        assert same_trajectory(got_seen, want_seen) and got_return == want_return
    assert summary["state"] == "SUCCESS"
    assert summary["score"]["phase1"] == statistics.fmean(r for r, _ in expected)
    assert summary["counters"]["errors_invalid_action"] == 2 * (len(bad_actions) + 1)
    assert summary["counters"].get("invalid_actions", 0) == 0  # refused, never replaced by another action


# --- F5/F6 on the two-phase evaluator: raw msgpack garbage ----------------------------------------


class _TouchMarker:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def garbage(rng: random.Random, service_id: str, marker: str) -> tuple[list[bytes], list[str], int]:
    """(messages, the reply lists of the well-formed ones, how many of those are of another client).
    A well-formed request is another client's (it has no session); the rest cannot be decoded."""
    answered: list[str] = []

    def channel() -> str:
        return keys.response_key(service_id, f"{rng.getrandbits(128):032x}")

    def request(type_: Any, payload: Any, answer: bool = True) -> bytes:
        chan = channel()
        if answer:
            answered.append(chan)
        return codec.encode({"type": type_, "payload": payload, "response_channel": chan, "timestamp": 1.0})

    payloads = [{"action": a} for a in (1, [0.5], np.zeros(4), "left", None, [[[1]]], {"0": 1})]
    payloads += [{"arbiter": {"item": i, "reply": True}} for i in (0, 3, "x", [1], None)] + [{}, {"arbiter": [1]}]
    foreign = [request(t, p) for t in sorted(REQUEST_TYPES) for p in payloads]
    unknown = [request(t, {"action": 1}) for t in ("FLATLAND_RL.ENV_RESET", "ARBITER.TRAIN", "", "x" * 100)]
    templates = foreign + unknown
    bomb = {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": pickle.dumps(_TouchMarker(marker))}
    nested: Any = 0.5
    for _ in range(20):
        nested = [nested]
    big = struct.pack(">I", 0xFFFFFFFF)
    corrupt = [rng.randbytes(rng.randrange(0, 300)) for _ in range(600)]
    corrupt += [t[: rng.randrange(1, len(t))] for t in rng.choices(templates, k=600)]  # truncated
    corrupt += [b"\x91" * depth + b"\xc0" for depth in (17, 100, 30_000)]
    corrupt += [b"\xdd" + big + b"\xc0" * 8, b"\xdf" + big + b"\xc0" * 8, b"\xdb" + big + b"abc", b"\xc1"]
    corrupt += [request(FLATLAND_RL.ENV_STEP, {"action": a}, answer=False)
                for a in (bomb, nested, msgpack.ExtType(1, b"\x02"), [0.0] * 10_001)]  # fmt: skip
    corrupt += [request(FLATLAND_RL.ENV_CREATE, {"arbiter": {"item": i}}, answer=False)
                for i in ("x" * 5000, "x" * 70_000, [0] * 10_001, {str(k): k for k in range(10_001)})]  # fmt: skip
    corrupt += [request(FLATLAND_RL.ENV_STEP, {"action": 1}, answer=False) + b"\xc0"]  # trailing bytes
    messages = foreign + unknown + corrupt
    rng.shuffle(messages)
    return messages, answered, len(foreign)


def test_raw_garbage_is_rejected_and_counted_and_the_evaluation_scores_as_if_it_never_came(
    redis_url, redis_conn, service_id, tmp_path
):
    results, marker = str(tmp_path / "r"), str(tmp_path / "code-ran")
    spec = competition("CartPole-v1", phase=1, budgets={"step_s": 30.0})  # no timeout while the garbage is read
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        evaluation = service.evaluation
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        messages, answered, foreign = garbage(random.Random(10), service_id, marker)

        def flood(_: Any) -> None:
            steps, counted = evaluation.current.steps, ("bad_messages", "unknown_types", "foreign_requests")
            before = sum(evaluation.counters[c] for c in counted)
            replies_before = set(redis_conn.scan_iter(keys.response_prefix(service_id) + "*"))
            redis_conn.lpush(keys.commands_key(service_id), *messages)
            wait_for(lambda: sum(evaluation.counters[c] for c in counted) - before == len(messages),
                     timeout_s=30, what="every message handled")  # fmt: skip
            assert service_thread.is_alive() and not evaluation.finished
            assert evaluation.current.steps == steps and evaluation.records == [] and evaluation.next_index == 1
            assert evaluation.counters["foreign_requests"] == foreign
            replies = set(redis_conn.scan_iter(keys.response_prefix(service_id) + "*")) - replies_before
            assert replies == {c.encode() for c in answered}  # an error for each request that could be read
            for chan in answered:
                reply = codec.decode(redis_conn.lpop(chan), codec.REPLY_LIMITS)
                assert reply["type"] == FLATLAND_RL.ERROR and reply["payload"]["message"]
                assert reply["payload"]["code"] in ("OTHER_CLIENT", "UNKNOWN_TYPE")

        service_thread = outcome["thread"]
        played = [remote_episode(env, cartpole_policy, {3: flood}), remote_episode(env, cartpole_policy, {})]
        env.submit()
        env.close()
        summary = finish(outcome)
    assert not os.path.exists(marker)
    expected = [local_episode("CartPole-v1", reset_seed(7, 1, i), cartpole_policy) for i in range(2)]
    assert all(same_trajectory(got[1], want[1]) for got, want in zip(played, expected, strict=True))
    assert summary["state"] == "SUCCESS" and summary["score"]["phase1"] == statistics.fmean(r for r, _ in expected)


# --- real processes: SIGKILL + --resume, SIGTERM, a killed agent -----------------------------------
