"""diambra-arena's real gymnasium env, made and stepped by the DIAMBRA format, on the engine mock."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("diambra.arena")

from arbiter.server.formats.diambra.env import DiambraEnv, episode_seed  # noqa: E402
from arbiter.server.formats.diambra.games import GAMES, SCORED_GAMES  # noqa: E402
from arbiter.server.formats.diambra.scoring import episode_record  # noqa: E402
from arbiter.server.formats.diambra.settings import DiambraSettings  # noqa: E402

# The mock sleeps 1 / (step_ratio × fps) per step to stand in for the emulator: made negligible.
FAST = {"fps": 1_000_000}
SMALL = [64, 64, 1]


def button_sequence(step: int) -> list[int]:
    """A deterministic agent: every move in turn, an attack every other step."""
    return [step % 9, (step // 2) % 8 if step % 2 else 0]


def play(env: DiambraEnv, seed: int, disturb: bool = False) -> tuple[list[float], dict]:
    env.reset(seed=seed)
    rewards = []
    for step in range(20_000):
        if disturb:  # other users of the process-wide generators, between the env's steps
            random.random()
            np.random.rand(3)
        _, reward, terminated, truncated, _ = env.step(button_sequence(step))
        rewards.append(reward)
        if terminated or truncated:
            return rewards, env.drawn
    raise AssertionError("the episode never ended")


def test_one_episode_end_to_end_on_the_mock():
    settings = DiambraSettings(game="doapp", difficulty="hard", frame_shape=SMALL)
    env = DiambraEnv(settings, **FAST)
    try:
        described = env.describe()
        assert described["engine"] == "mock" and env.engine == "mock" and env.engine_address is None
        assert described["level"] == 4 and described["frame_shape"] == SMALL
        observation, info = env.reset(seed=11)
        assert env.seed_used == 11
        assert env.observation_space.contains(observation)
        assert observation["frame"].shape == (64, 64, 1) and observation["frame"].dtype == np.uint8
        assert not info["episode_done"] and set(info) == {
            "round_done",
            "stage_done",
            "game_done",
            "episode_done",
            "invalid_action",
            "settings",  # diambra-arena's episode settings, without the seed
        }
        assert info["settings"]["episode_settings"]["difficulty"] == 4
        assert "random_seed" not in info["settings"]["episode_settings"]
        env.action_space.seed(11)
        total, steps, rounds = 0.0, 0, 0
        while True:
            observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert env.observation_space.contains(observation)
            assert isinstance(reward, float) and all(type(v) is bool for v in info.values())
            total += reward
            steps += 1
            rounds += info["round_done"]
            if terminated or truncated:
                break
        assert info["episode_done"] and info["game_done"] and rounds >= 2
        bounds = env.reward_bounds()
        assert bounds.source == "env" and bounds.low <= total <= bounds.high
        rec = episode_record(settings, reward=total, bounds=bounds, seed=env.seed_used, engine=env.engine, steps=steps)
        assert rec["engine"] == "mock" and rec["reward"] == total and rec["level"] == 4 and rec["finished"]
        assert rec["score"] == pytest.approx(total * rec["k"])
    finally:
        env.close()


@pytest.mark.parametrize("game", SCORED_GAMES)
def test_bounds_the_mock_reports(game):
    env = DiambraEnv(DiambraSettings(game=game, frame_shape=SMALL), **FAST)
    try:
        bounds = env.reward_bounds()
        formula = GAMES[game].formula_bounds()
        assert bounds.source == "env"
        if GAMES[game].chars_per_round == 1:
            assert (bounds.low, bounds.high) == formula
        else:
            # The mock leaves the characters per round (N_c) out of its bounds: for tektagt's tag
            # pairs it reports half the documented ones.
            assert game == "tektagt"
            assert (bounds.low, bounds.high) == (formula[0] / 2, formula[1] / 2)
    finally:
        env.close()


def test_a_seed_replays_an_episode_exactly_whatever_else_draws_random_numbers():
    env = DiambraEnv(DiambraSettings(game="sfiii3n", difficulty="medium", frame_shape=SMALL), **FAST)
    try:
        first = play(env, seed=5)
        random.seed(123)
        np.random.seed(123)
        again = play(env, seed=5, disturb=True)
        other = play(env, seed=6)
    finally:
        env.close()
    assert again == first
    assert other != first


def test_the_env_leaves_the_process_generators_alone():
    random.seed(42)
    np.random.seed(42)
    expected = [random.random() for _ in range(5)], np.random.rand(5).tolist()
    random.seed(42)
    np.random.seed(42)
    env = DiambraEnv(DiambraSettings(frame_shape=SMALL), **FAST)
    try:
        seen_python, seen_numpy = [], []
        env.reset(seed=1)
        for step in range(5):
            seen_python.append(random.random())
            seen_numpy.extend(np.random.rand(1).tolist())
            env.step(button_sequence(step))
    finally:
        env.close()
    assert (seen_python, seen_numpy) == expected


def test_invalid_actions_become_the_no_op_and_are_counted():
    env = DiambraEnv(DiambraSettings(frame_shape=SMALL), **FAST)
    try:
        env.reset(seed=3)
        bad_actions = ([9, 0], [0, -1], [0, 8], "kick", [1.5, 0], None, [0, 0, 0], {"move": 1}, float("nan"))
        for bad in bad_actions:
            observation, _, terminated, _, info = env.step(bad)
            assert info["invalid_action"] is True
            assert env.observation_space.contains(observation)
            assert not terminated or info["episode_done"]
        assert env.invalid_actions == len(bad_actions)
        _, _, _, _, info = env.step(np.array([3, 2]))
        assert info["invalid_action"] is False and env.invalid_actions == len(bad_actions)
        assert env.sanitize(np.array([3, 2], dtype=np.int64)) == ([3, 2], 0)
        assert all(type(v) is int for v in env.sanitize(np.array([3, 2]))[0])
        assert env.sanitize([9, 0]) == ([0, 0], 1)
        # the episode plays on to its end after the replaced actions
        for step in range(20_000):
            *_, terminated, truncated, info = env.step(button_sequence(step))
            if terminated or truncated:
                break
        assert info["episode_done"]
        env.reset(seed=4)
        assert env.invalid_actions == 0  # counted per episode
    finally:
        env.close()


def test_discrete_action_space():
    env = DiambraEnv(DiambraSettings(action_space="discrete", frame_shape=SMALL), **FAST)
    try:
        assert env.action_space.n == 9 + 8 - 1
        assert env.no_op_action() == 0
        assert env.sanitize(np.int64(12)) == (12, 0)
        assert env.sanitize(16) == (0, 1)
        assert env.sanitize(True) == (0, 1)
        env.reset(seed=2)
        assert env.step(12)[4]["invalid_action"] is False
    finally:
        env.close()


@pytest.mark.parametrize(("difficulty", "cluster_odds"), [("easy", 0.75), ("medium", 0.5), ("hard", 0.25)])
def test_the_mock_fights_at_the_chosen_difficulty(difficulty, cluster_odds):
    env = DiambraEnv(DiambraSettings(game="doapp", difficulty=difficulty, frame_shape=SMALL), **FAST)
    try:
        env.reset(seed=1)
        mock = env._env.arena_engine.mock
        # the mock's odds of winning a game come from the difficulty it was initialised with
        assert mock.base_round_winning_probability == pytest.approx(cluster_odds ** (1 / 8))
        assert mock.settings.episode_settings.difficulty == env.level == GAMES["doapp"].levels[difficulty]
        assert env.drawn["level"] == env.level
    finally:
        env.close()


def test_chosen_role_and_characters_reach_the_env_and_unset_ones_are_drawn_and_recorded():
    chosen = DiambraSettings(
        game="kof98umh", role="P1", characters=["Kyo", "Iori"], fighting_style=2, frame_shape=SMALL
    )
    env = DiambraEnv(chosen, **FAST)
    try:
        env.reset(seed=9)
        assert env.drawn["role"] == "P1" and env.drawn["fighting_style"] == 2
        assert env.drawn["characters"][:2] == ["Kyo", "Iori"] and len(env.drawn["characters"]) == 3
        assert env.drawn["characters"][2] in GAMES["kof98umh"].selectable()
        assert len(env.drawn["ultimate_style"]) == 3
        first = dict(env.drawn)
        env.reset(seed=9)
        assert env.drawn == first
    finally:
        env.close()


def test_the_mock_is_given_to_its_env_only_and_stays_quiet(capsys):
    from diambra.arena import arena_gym
    from diambra.arena.engine import interface

    env = DiambraEnv(DiambraSettings(frame_shape=SMALL), **FAST)
    try:
        play(env, seed=1)
    finally:
        env.close()
    assert arena_gym.DiambraEngine is interface.DiambraEngine
    assert interface.DiambraEngine.__init__.__module__ == "diambra.arena.engine.interface"
    assert capsys.readouterr().out == ""  # the mock's round-by-round prints go to logging


def test_reset_refuses_bad_seeds_and_options():
    env = DiambraEnv(DiambraSettings(frame_shape=SMALL), **FAST)
    try:
        for seed in (-1, 2**31, 1.5, "7"):
            with pytest.raises(ValueError, match="seed must be a whole number"):
                env.reset(seed=seed)
        with pytest.raises(ValueError, match="takes no reset options"):
            env.reset(seed=1, options={"difficulty": 1})
        env.reset()
        assert isinstance(env.seed_used, int) and 0 <= env.seed_used < 2**31
    finally:
        env.close()
    with pytest.raises(ValueError, match="mock options"):
        DiambraEnv(DiambraSettings(), engine_address="127.0.0.1:50051", fps=10)


def test_episode_seeds_fit_the_engine():
    seeds = [episode_seed(2024, i) for i in range(200)]
    assert all(0 <= s < 2**31 for s in seeds) and len(set(seeds)) == 200
    assert seeds == [episode_seed(2024, i) for i in range(200)]
    assert episode_seed(None, 0) is None


@pytest.mark.slow
def test_an_engine_address_with_no_engine_is_a_clear_error():
    from arbiter.protocol.errors import EvaluationError

    # 127.0.0.1:1 has no listener; 1 s is the shortest connection timeout diambra-arena takes
    with pytest.raises(EvaluationError, match=r"no DIAMBRA engine answered at 127\.0\.0\.1:1"):
        DiambraEnv(DiambraSettings(engine_timeout_s=1), engine_address="127.0.0.1:1")
