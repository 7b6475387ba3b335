"""The DIAMBRA format end to end: a real redis-server, the evaluator (in this process, or
``arbiter run`` in a subprocess), diambra-arena's real env on its engine mock, and agents on
``RemoteEnv`` (the shipped example script in a subprocess, or loops here).

Scores are recomputed from episodes.jsonl with this file's own arithmetic (docs/formats/diambra.md), never
with the format's code; seeds are checked against the derivation the plan documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import msgpack
import pytest
from harness import finish, read_episodes, read_summary, running_service, wait_for

pytest.importorskip("diambra.arena")

import paths

from arbiter.client.remote_env import RemoteEnv  # noqa: E402
from arbiter.protocol import codec, keys, messages  # noqa: E402
from arbiter.protocol.errors import TimeoutException  # noqa: E402
from arbiter.protocol.messages import FLATLAND_RL  # noqa: E402
from arbiter.protocol.redis_conn import LARGE_READ_CHUNK, READ_CHUNK  # noqa: E402
from arbiter.server.core.competition import load_competition  # noqa: E402
from arbiter.server.formats.base import reset_seed  # noqa: E402

REPO = str(paths.REPO)
EXAMPLE = os.path.join(REPO, "examples", "diambra_agent", "agent.py")
SMALL = "frame_shape=[64, 64, 1]"
# docs/formats/diambra.md: Easy / Medium / Hard levels of the games played here.
LEVELS = {"doapp": (2, 3, 4), "sfiii3n": (4, 6, 8), "umk3": (3, 4, 5)}


def own_score(record: dict[str, Any]) -> float:
    """R × k(R) from the record's R, bounds, game and difficulty alone."""
    easy, medium, hard = LEVELS[record["game"]]
    level = {"easy": easy, "medium": medium, "hard": hard}[record["difficulty"]]
    low, high = record["bounds"]
    k = 1 + (level / easy - 1) * (record["reward"] - low) / (high - low)
    return record["reward"] * min(max(k, 1.0), level / easy)


def button(step: int) -> list[int]:
    return [step % 9, (step // 2) % 8 if step % 2 else 0]


def play_to_end(env: RemoteEnv, start: int = 0) -> tuple[int, float, dict[str, Any]]:
    """Step the running episode to its end; returns (steps, collected reward, last info)."""
    step, total = start, 0.0
    while True:
        _, reward, terminated, truncated, info = env.step(button(step))
        step += 1
        total += reward
        if terminated or truncated:
            return step, total, info


def test_the_example_agent_plays_to_success_under_arbiter_run(redis_url, service_id, tmp_path):
    """The README's command, on the session's redis-server, with the shipped example script."""
    results = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "diambra",
         "--set", "game=doapp", "--set", "difficulty=hard", "--set", "episodes=2", "--set", SMALL,
         "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--",
         sys.executable, EXAMPLE],
        capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine: mock" in done.stderr  # the progress lines and the table say it
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["format"] == "diambra" and summary["scoring"] == "diambra"
    assert "engine: mock" in summary["tests"] and summary["score"]["engine"] == "mock"
    assert summary["options"]["difficulty"] == "hard" and summary["versions"]["diambra-arena"] == "2.2.7"
    records = read_episodes(str(results))
    assert [r["episode"] for r in records] == [0, 1]
    assert [r["seed"] for r in records] == [reset_seed(1001, i) % 2**31 for i in range(2)]
    assert all(r["engine"] == "mock" and r["finished"] and not r["timed_out"] for r in records)
    assert all(r["level"] == 4 and r["bounds"] == [-1872.0, 3328.0] and r["steps"] > 0 for r in records)
    scores = [own_score(r) for r in records]
    assert summary["score"]["primary"] == pytest.approx(sum(scores) / 2, abs=1e-9)
    assert summary["score"]["secondary"] == pytest.approx(sum(r["reward"] for r in records) / 2, abs=1e-9)
    assert [e["score"] for e in summary["score"]["per_episode"]] == pytest.approx(scores, abs=1e-9)
    assert f"submitted: score {summary['score']['primary']:.6g}, " in done.stdout  # what the agent printed
    assert "(engine: mock)" in done.stdout
    rescored = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "rescore", str(results)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert rescored.returncode == 0 and "matches summary.json" in rescored.stdout, rescored.stdout + rescored.stderr


def test_remote_env_gives_diambras_observation_spaces_and_env_done(redis_url, service_id, tmp_path):
    competition = load_competition("diambra", ["game=sfiii3n", "difficulty=medium", "episodes=2", SMALL, "seed=31"])
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        plan_env = service.evaluation.plan.env
        assert env.observation_space == plan_env.observation_space and env.action_space == plan_env.action_space
        assert env.server_info["engine"] == "mock" and env.server_info["level"] == 6
        assert set(env.observation_space.spaces) == {"frame", "stage", "timer", "P1", "P2"}
        ends = []
        observation, info = env.reset()
        while True:
            assert env.observation_space.contains(observation)
            assert info["env_done"] is False and info["arbiter"]["engine"] == "mock"
            _, _, last = play_to_end(env)
            ends.append(last["env_done"])
            observation, info = env.reset()
            if info["env_done"]:
                break
        env.submit()
        env.close()
        summary = finish(outcome)
    assert ends == [False, True]  # DIAMBRA's flag on the last step of the last episode, and at reset
    records = read_episodes(results)
    assert [r["seed"] for r in records] == [reset_seed(31, i) % 2**31 for i in range(2)]
    assert summary["state"] == "SUCCESS"
    assert summary["score"]["primary"] == pytest.approx(sum(own_score(r) for r in records) / 2, abs=1e-9)


def test_a_sub_second_step_timeout_scores_the_lowest_reward(redis_url, service_id, tmp_path):
    competition = load_competition(
        "diambra", ["game=umk3", "difficulty=hard", "episodes=2", SMALL, "budgets.step_s=0.3", "budgets.planning_s=5"]
    )
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.reset()
        collected = 0.0
        for step in range(30):  # attacks only: some reward is collected before the agent stalls
            collected += env.step([0, 1 + step % 7])[1]
        wait_for(lambda: service.evaluation.counters["step_timeouts"] == 1, timeout_s=5, what="the step timeout")
        with pytest.raises(TimeoutException):
            env.step([0, 0])
        env.reset()
        steps, _, _ = play_to_end(env)
        _, info = env.reset()
        assert info["env_done"]
        env.submit()
        env.close()
        summary = finish(outcome)
    first, second = read_episodes(results)
    assert first["timed_out"] and first["timeout"] == "step" and first["ended"] == "step_timeout"
    assert first["reward"] == first["bounds"][0] == -1992.0 and first["score"] == -1992.0 and first["k"] == 1.0
    assert first["partial_reward"] == collected and first["steps"] == 30
    assert second["finished"] and second["steps"] == steps
    assert summary["state"] == "SUCCESS" and summary["score"]["timed_out"] == 1
    assert summary["score"]["primary"] == pytest.approx((-1992.0 + own_score(second)) / 2, abs=1e-9)


def test_invalid_actions_play_the_no_op_and_are_counted(redis_url, service_id, tmp_path):
    competition = load_competition("diambra", ["game=doapp", SMALL])
    results = str(tmp_path / "r")
    bad = ("uppercut", [99, 0], [0, -1], None, {"move": 1}, [1.5, 0], [0, 0, 0])
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        env.reset()
        for action in bad:
            _, _, terminated, _, info = env.step(action)
            assert info["invalid_action"] is True and info["arbiter"]["stage_over"] is False and not terminated
        assert env.step([1, 0])[4]["invalid_action"] is False
        steps, _, _ = play_to_end(env, start=len(bad) + 1)
        env.submit()
        env.close()
        summary = finish(outcome)
    (record,) = read_episodes(results)
    assert record["invalid_actions"] == len(bad) and record["finished"] and record["steps"] == steps
    assert summary["state"] == "SUCCESS" and summary["counters"]["invalid_actions"] == len(bad)


def test_reset_tells_the_agent_its_role_and_characters_as_diambras_info_settings(redis_url, service_id, tmp_path):
    """With the role drawn at each reset, an agent knows which of P1 and P2 it plays only from
    the reset's ``info["settings"]`` (diambra-arena's episode settings), which never holds the
    episode's seed. Seed 42 draws P1, then P2."""
    competition = load_competition("diambra", ["game=kof98umh", "episodes=2", SMALL, "seed=42"])
    results = str(tmp_path / "r")
    seen = []
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        observation, info = env.reset()
        while not info["env_done"]:
            episode = info["settings"]["episode_settings"]
            assert "random_seed" not in episode and info["settings"]["game_id"] == "kof98umh"
            player = episode["player_settings"][0]
            own = observation[player["role"]]  # the agent's own RAM states, role-relative
            assert env.observation_space[player["role"]].contains(own)
            seen.append((player["role"], player["characters"], player["outfits"], episode["difficulty"]))
            _, _, last = play_to_end(env)
            assert "settings" not in last  # a reset's, as the episode's settings do not change
            observation, info = env.reset()
        env.submit()
        env.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    drawn = [r["drawn"] for r in read_episodes(results)]
    assert seen == [(d["role"], d["characters"], d["outfits"], d["level"]) for d in drawn]
    assert {role for role, *_ in seen} == {"P1", "P2"}  # drawn: the agent could not have assumed one


def test_a_frame_sized_request_is_refused_while_frame_sized_replies_flow(redis_url, redis_conn, service_id, tmp_path):
    """Native frames (480×512×3, ~740 KB) travel in every reply; an agent sending one back as its
    action is still held to the request limit, and the episode plays on untouched."""
    competition = load_competition("diambra", ["game=doapp"])
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        observation, _ = env.reset()
        assert observation["frame"].shape == (480, 512, 3)
        env.step(button(0))
        channel = keys.response_key(service_id, "0" * 32)
        frame_as_action = codec.encode(
            messages.request(FLATLAND_RL.ENV_STEP, {"action": observation["frame"]}, channel)
        )
        junk = [frame_as_action, b"\xc1\xff not msgpack", msgpack.packb({"type": msgpack.ExtType(5, b"x")})]
        assert len(frame_as_action) > codec.COMMAND_LIMITS.max_bytes
        for data in junk:
            redis_conn.lpush(keys.commands_key(service_id), data)
        env.step(button(1))  # answered after the junk: the evaluator is alive
        assert service.evaluation.counters["bad_messages"] == len(junk)
        assert service.evaluation.current.steps == 2
        steps, _, _ = play_to_end(env, start=2)
        env.submit()
        env.close()
        summary = finish(outcome)
    (record,) = read_episodes(results)
    assert summary["state"] == "SUCCESS" and record["finished"] and record["steps"] == steps
    assert record["invalid_actions"] == 0 and redis_conn.llen(channel) == 0


@pytest.mark.parametrize("through_redis", [False, True], ids=["shared-frames", "frames-through-redis"])
def test_the_benchmark_plays_the_same_episodes_in_process_and_through_remote_env(tmp_path, through_redis):
    """scripts/bench_diambra.py, small: its remote runs (``arbiter serve`` and RemoteEnv over its own
    redis-server) must play exactly the in-process runs' episodes, or it exits 1."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench_diambra.py", "--steps", "300", "--warmup", "20", "--rounds", "1",
         "--shapes", "gray", "--json", str(out), *(["--frames-through-redis"] if through_redis else [])],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "trajectories: every in-process and remote run played the same episodes" in done.stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    gray = report["shapes"]["128x128 gray"]
    assert gray["frame_shape"] == [128, 128, 1] and gray["frame_bytes"] == 128 * 128
    if through_redis:  # every step's reply carried its frame
        assert gray["redis_in_bytes_per_step"] > gray["frame_bytes"] and "frames: through Redis" in done.stdout
    else:  # the frames came through shared memory
        assert gray["redis_in_bytes_per_step"] < gray["frame_bytes"] and "shared memory" in done.stdout
    assert all(rate > 0 for rate in gray["steps_per_s"].values())


@pytest.mark.parametrize(("frame", "large"), [("frame_shape=[0, 0, 0]", True), (SMALL, False)])
def test_native_frames_arrive_whole_and_are_read_in_large_chunks(redis_url, service_id, tmp_path, frame, large):
    """Through Redis (no shared frames: see tests/test_shared_frames.py for those)."""
    competition = load_competition("diambra", ["game=doapp", "difficulty=easy", "episodes=1", frame, "seed=5"])
    results = str(tmp_path / "r")
    with running_service(competition, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, shared_frames=False)
        frame_space = env.observation_space["frame"]
        assert (frame_space.shape[:2] == (480, 512)) is large  # doapp's native frame, or the small one
        # a client whose observations are frames reads its replies 1 MiB at a time (hiredis parses
        # a large reply fed in 64 KiB reads about 15 times slower)
        read_size = env.wire.packets._pool.connection_kwargs["socket_read_size"]
        assert read_size == (LARGE_READ_CHUNK if large else READ_CHUNK)
        observation, _ = env.reset()
        for _ in range(5):
            assert env.observation_space.contains(observation)
            assert observation["frame"].shape == frame_space.shape and observation["frame"].flags.writeable
            observation, *_ = env.step(env.action_space.sample())
        plan_frame = service.evaluation.current.last_step[0]["frame"]  # the evaluator waits for the next step
        assert (observation["frame"] == plan_frame).all()  # byte for byte what the evaluator's env produced
        env.submit()
        env.close()
        finish(outcome)
