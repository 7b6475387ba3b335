"""DIAMBRA's agent scripts under arbiter with one change: ``make`` from ``arbiter.client.diambra``
instead of ``diambra.arena``. diambra-arena's own wrappers (its ``env_wrapping``, from the
script's ``wrappers_settings``) on the evaluation's env give the spaces, observations and rewards
they give on diambra-arena's own env on its engine mock, for the same seed and actions; and the
evaluation scores the unwrapped env's rewards, whatever the agent wraps.

Each evaluation runs in this process on a real redis-server; the reference (diambra-arena's own
``DiambraGym1P`` on the mock) is played after it, with the seed the evaluation recorded."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium
import numpy as np
import pytest
from harness import finish, read_episodes, running_service

pytest.importorskip("diambra.arena")

from diambra.arena import WrappersSettings  # noqa: E402
from diambra.arena.wrappers.arena_wrappers import env_wrapping  # noqa: E402

from arbiter.client.diambra import make  # noqa: E402
from arbiter.server.core.competition import load_competition  # noqa: E402
from arbiter.server.formats.diambra.env import DiambraEnv  # noqa: E402

SMALL = ["frame_shape=[64, 64, 1]"]
FILTER = ["stage", "timer", "own_health", "opp_health", "own_side", "opp_side", "own_character"]
# Each wrapper family of diambra-arena's WrappersSettings: (the evaluation's keys, the script's wrappers).
FAMILIES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "normalize_reward": (SMALL, {"normalize_reward": True, "normalization_factor": 0.5}),
    "clip_reward": (SMALL, {"clip_reward": True}),
    "no_attack_combinations": (SMALL, {"no_attack_buttons_combinations": True}),
    "no_attack_combinations_discrete": (
        [*SMALL, 'action_space="discrete"'],
        {"no_attack_buttons_combinations": True, "add_last_action": True},
    ),
    "last_action_stacked": (SMALL, {"add_last_action": True, "stack_actions": 4}),
    "role_relative": (SMALL, {"role_relative": True}),
    "resize_grayscale": (["frame_shape=[64, 64, 0]"], {"frame_shape": (32, 32, 1)}),
    "resize": (SMALL, {"frame_shape": (40, 48, 0)}),
    "stack_frames": (SMALL, {"stack_frames": 4, "dilation": 2}),
    "flatten": (SMALL, {"role_relative": True, "flatten": True, "filter_keys": FILTER}),
    "typical": (  # DIAMBRA's reinforcement-learning examples' set
        ['game="sfiii3n"', *SMALL],
        {
            "normalize_reward": True,
            "no_attack_buttons_combinations": True,
            "stack_frames": 4,
            "dilation": 1,
            "add_last_action": True,
            "stack_actions": 12,
            "role_relative": True,
            "flatten": True,
            "filter_keys": [*FILTER, "action"],
        },
    ),
}


def same(a: Any, b: Any) -> bool:
    """Equal observations: the same keys and values (the evaluator sends RAM states as the space's
    int16 where diambra-arena's env gives int64)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    x, y = np.asarray(a), np.asarray(b)
    return x.shape == y.shape and np.array_equal(x, y)


def diambra_script(game_id: str, wrappers: dict[str, Any], seed: int = 7) -> dict[str, Any]:
    """DIAMBRA's single-player example, with ``make`` from arbiter.client.diambra: the env's own
    action sampler, ``reset`` after the episode, a break at ``env_done``, then ``close``."""
    env = make(game_id, None, WrappersSettings(**wrappers))
    env.action_space.seed(seed)
    played: dict[str, Any] = {"observations": [], "rewards": [], "actions": [], "wrapped": env}
    observation, info = env.reset(seed=42)
    played["settings"], played["observations"] = info["settings"], [copy.deepcopy(observation)]
    while True:
        action = env.action_space.sample()
        observation, reward, terminated, truncated, info = env.step(action)
        played["actions"].append(action)
        played["rewards"].append(reward)
        played["observations"].append(copy.deepcopy(observation))
        if terminated or truncated:
            played["seed"] = info["arbiter"]["seed"]
            observation, info = env.reset()
            played["last"] = (observation, info)
            if info["env_done"]:
                break
    env.close()
    return played


class RawRewards(gymnasium.Wrapper):
    """Under diambra-arena's wrappers: the env's rewards as the env gave them."""

    def __init__(self, env: Any):
        super().__init__(env)
        self.rewards: list[float] = []

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        self.rewards.append(float(result[1]))
        return result


def diambra_own(competition: Any, wrappers: dict[str, Any], seed: int, actions: list[Any]) -> dict[str, Any]:
    """The same wrappers on diambra-arena's own env (the one arbiter's DiambraEnv holds, made on the
    engine mock from the same settings), reset with ``seed``, stepped with ``actions``."""
    holder = DiambraEnv(competition.options)
    try:
        raw = RawRewards(holder._env)
        env = env_wrapping(raw, WrappersSettings(**wrappers))
        observation, info = env.reset(seed=seed)
        played: dict[str, Any] = {"observations": [copy.deepcopy(observation)], "rewards": [], "wrapped": env}
        played["settings"] = copy.deepcopy(info["settings"])
        for action in actions:
            observation, reward, terminated, truncated, _ = env.step(action)
            played["rewards"].append(reward)
            played["observations"].append(copy.deepcopy(observation))
        assert terminated or truncated, "diambra-arena's env did not end the episode where the evaluation did"
        played["raw"] = raw.rewards
        played["bounds"] = env.unwrapped.get_cumulative_reward_bounds()
        played["normalization"] = env.unwrapped.reward_normalization_value
        played["health_range"] = env.unwrapped.max_delta_health
        return played
    finally:
        holder.close()


@pytest.fixture
def agent_environ(monkeypatch, redis_url, service_id):
    """What ``arbiter run`` sets for the agent: make() is called as DIAMBRA's scripts call it."""
    monkeypatch.setenv("ARBITER_REDIS_URL", redis_url)
    monkeypatch.setenv("AICROWD_SUBMISSION_ID", service_id)
    monkeypatch.setenv("ARBITER_REPLY_TIMEOUT", "10")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_diambras_wrappers_on_the_evaluations_env_are_as_on_diambras_own(
    family, agent_environ, redis_url, service_id, tmp_path
):
    keys, wrappers = FAMILIES[family]
    competition = load_competition("diambra", [*keys, "seed=5"])
    game = competition.options.game
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        remote = diambra_script(game, wrappers)
        service.agent_exited(0)  # as arbiter run tells it: DIAMBRA's scripts end without a submit()
        summary = finish(outcome)
    (record,) = read_episodes(results)
    own = diambra_own(competition, wrappers, remote["seed"], remote["actions"])

    mine, theirs = remote["wrapped"], own["wrapped"]
    assert mine.observation_space == theirs.observation_space and mine.action_space == theirs.action_space
    assert len(remote["observations"]) == len(own["observations"]) == record["steps"] + 1
    for step, (a, b) in enumerate(zip(remote["observations"], own["observations"], strict=True)):
        assert same(a, b), f"{family}: observation {step} differs from diambra-arena's own env's"
    assert remote["rewards"] == own["rewards"]
    # the evaluation scores the env's rewards, not the wrapped ones the agent saw
    assert record["finished"] and record["reward"] == sum(own["raw"])
    assert summary["state"] == "SUCCESS" and summary["score"]["secondary"] == sum(own["raw"])
    assert mine.unwrapped.get_cumulative_reward_bounds() == own["bounds"]
    assert mine.unwrapped.reward_normalization_value == own["normalization"]
    assert mine.unwrapped.max_delta_health == own["health_range"] > 0
    if wrappers.get("normalize_reward"):
        assert own["normalization"] == 0.5 * own["health_range"]
        assert remote["rewards"] != own["raw"]
    # info["settings"] is diambra-arena's protobuf, as its env gives it, without the seed
    expected = copy.deepcopy(own["settings"])
    expected.episode_settings.random_seed = 0
    assert remote["settings"] == expected and own["settings"].episode_settings.random_seed == remote["seed"]
    # the reset that says env_done goes through the wrappers too, and gives one of their observations
    last, info = remote["last"]
    assert info["env_done"] is True and info["settings"] == expected
    assert same(last, remote["observations"][0])


def test_scale_fares_as_on_diambras_own_env(redis_url, service_id, tmp_path):
    """NormalizeObservation builds MultiBinary(Discrete.n): whether the installed gymnasium takes
    its numpy integer or not, the evaluation's env fares as diambra-arena's own does."""

    def outcome_of(env: Any) -> tuple[str, Any]:
        try:
            wrapped = env_wrapping(env, WrappersSettings(scale=True, exclude_image_scaling=True))
        except Exception as exc:  # noqa: BLE001 - the outcome compared is any failure's
            return type(exc).__name__, str(exc)
        return "wrapped", wrapped.observation_space

    competition = load_competition("diambra", SMALL)
    holder = DiambraEnv(competition.options)
    try:
        theirs = outcome_of(holder._env)
    finally:
        holder.close()
    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        env = make("doapp", redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        try:
            mine = outcome_of(env.unwrapped)
        finally:
            env.close()
    assert mine == theirs
