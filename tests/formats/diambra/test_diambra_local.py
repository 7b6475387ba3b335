"""A DIAMBRA evaluation played in process, and the example agent script that plays it."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

pytest.importorskip("diambra.arena")

import paths

from arbiter.protocol.errors import OutOfOrder  # noqa: E402
from arbiter.server.formats.diambra.env import episode_seed  # noqa: E402
from arbiter.server.formats.diambra.local import LocalEvaluation  # noqa: E402
from arbiter.server.formats.diambra.scoring import DifficultyWeightedRule, rescore  # noqa: E402
from arbiter.server.formats.diambra.settings import DiambraSettings  # noqa: E402

FAST = {"fps": 1_000_000}
EXAMPLE = os.path.join(paths.EXAMPLES, "diambra_agent", "agent.py")


def agent_loop(env: LocalEvaluation) -> list[dict]:
    """DIAMBRA's documented agent loop: reset on terminated or truncated, leave on env_done."""
    infos = []
    observation, info = env.reset()
    step = 0
    while True:
        observation, reward, terminated, truncated, info = env.step([step % 9, step % 8])
        step += 1
        if terminated or truncated:
            infos.append(info)
            observation, info = env.reset()
            if info["env_done"]:
                break
    return infos


def test_an_evaluation_of_three_episodes_ends_with_env_done():
    settings = DiambraSettings(game="samsh5sp", difficulty="hard", episodes=3, frame_shape=[64, 64, 1])
    env = LocalEvaluation(settings, seed=77, **FAST)
    try:
        ends = agent_loop(env)
        assert [info["env_done"] for info in ends] == [False, False, True]
        assert [info["arbiter"]["episode"] for info in ends] == [0, 1, 2]
        records = env.records
        assert [r["episode"] for r in records] == [0, 1, 2]
        assert [r["seed"] for r in records] == [episode_seed(77, i) for i in range(3)]
        assert all(r["finished"] and r["engine"] == "mock" and r["bounds_source"] == "env" for r in records)
        assert all(r["level"] == 8 and r["easy_level"] == 4 and r["steps"] > 0 for r in records)
        result = env.result()
        assert result["primary"] == pytest.approx(sum(rescore(r)[1] for r in records) / 3)
        # the records alone give the same figures, after a trip through JSON
        offline = json.loads(json.dumps(records))
        assert DifficultyWeightedRule().aggregate(offline)["primary"] == result["primary"]
        with pytest.raises(OutOfOrder):
            env.step([0, 0])
        assert env.reset()[1]["env_done"] is True
    finally:
        env.close()


def test_the_same_seed_and_agent_give_the_same_records():
    settings = DiambraSettings(game="umk3", difficulty="medium", episodes=2, frame_shape=[64, 64, 1])
    runs = []
    for _ in range(2):
        env = LocalEvaluation(settings, seed=5, **FAST)
        try:
            agent_loop(env)
            runs.append([{k: r[k] for k in ("reward", "steps", "seed", "drawn", "score")} for r in env.records])
        finally:
            env.close()
    assert runs[0] == runs[1]


def test_leaving_an_episode_early_scores_its_lowest_reward():
    settings = DiambraSettings(game="doapp", difficulty="medium", episodes=2, frame_shape=[64, 64, 1])
    env = LocalEvaluation(settings, seed=3, **FAST)
    try:
        env.reset()
        for _ in range(5):
            env.step([0, 1])
        env.reset()  # the first episode is left after 5 steps
        first = env.records[0]
        assert first["abandoned"] and not first["finished"]
        assert first["reward"] == env.bounds.low and first["score"] == env.bounds.low
        assert first["steps"] == 5
        with pytest.raises(ValueError, match="chooses each episode's seed"):
            env.reset(seed=1)
    finally:
        env.close()


def test_invalid_actions_are_counted_in_the_record():
    settings = DiambraSettings(game="doapp", frame_shape=[64, 64, 1])
    env = LocalEvaluation(settings, seed=1, **FAST)
    try:
        env.reset()
        assert env.step("uppercut")[4]["invalid_action"] is True
        assert env.step([99, 99])[4]["invalid_action"] is True
        step = 0
        while True:
            *_, terminated, truncated, info = env.step([step % 9, 1])
            step += 1
            if terminated or truncated:
                break
        assert info["env_done"] and env.records[0]["invalid_actions"] == 2
    finally:
        env.close()


def test_the_example_agent_script_runs_an_evaluation(monkeypatch, capsys):
    monkeypatch.delenv("DIAMBRA_ENVS", raising=False)
    spec = importlib.util.spec_from_file_location("diambra_example_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(["--game", "doapp", "--difficulty", "hard", "--episodes", "2", "--seed", "11"])
    assert [e["episode"] for e in summary["episodes"]] == [0, 1]
    assert all(e["engine"] == "mock" for e in summary["episodes"])
    assert summary["score"] == pytest.approx(sum(e["score"] for e in summary["episodes"]) / 2)
    assert capsys.readouterr().out == f"{module.score_line(summary)} over 2 episodes\n"
