"""The measured processes of scripts/bench_diambra.py, one per ``--worker PATH``.

Each builds its env first, then plays untimed warm-up steps and the timed steps with the same
deterministic agent, resetting each episode with the evaluator's seeds, and prints its result as
one line (harness.emit): the rate, every episode played (the trajectory check) and the size of one
step's observation.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from harness import BenchError, emit

SHAPES = {"native": [0, 0, 0], "128x128 colour": [128, 128, 0], "128x128 gray": [128, 128, 1]}
PATHS = ("raw", "inprocess", "remote")
SEED = 1234
DIFFICULTY = "medium"


def action_at(step: int, nvec: list[int]) -> list[int]:
    """A deterministic button sequence: every move and attack in turn, attacks a third of the time."""
    return [step % nvec[0], (step // 3) % nvec[1] if step % 3 == 0 else 0]


def play(reset: Any, step: Any, nvec: list[int], warmup: int, steps: int) -> dict[str, Any]:
    """``warmup`` untimed steps, then ``steps`` timed ones; episode k starts with ``reset(k)``.
    Returns the rate and every episode played (its seed, steps and reward: the trajectory check)."""
    episodes: list[dict[str, Any]] = []
    total = warmup + steps
    done = 0
    started = time.perf_counter()
    while done < total:
        seed = reset(len(episodes))
        episode = {"seed": seed, "steps": 0, "reward": 0.0}
        episodes.append(episode)
        while done < total:
            if done == warmup:
                started = time.perf_counter()  # first steps pay for allocations and caches
            reward, ended = step(action_at(done, nvec))
            done += 1
            episode["steps"] += 1
            episode["reward"] += reward
            if ended:
                break
    wall = time.perf_counter() - started
    return {"steps_per_s": steps / wall, "wall_s": wall, "episodes": episodes}


def observation_bytes(observation: dict[str, Any]) -> dict[str, int]:
    """The frame's bytes, and the bytes of one step reply's observation as arbiter's codec encodes it."""
    from arbiter.protocol import codec

    return {"frame": int(observation["frame"].nbytes), "encoded": len(codec.encode({"observation": observation}))}


def worker_local(args: argparse.Namespace) -> int:
    logging.disable(logging.INFO)  # diambra-arena logs its whole settings at every env creation
    from arbiter.server.formats.diambra.engine import MockEngine, build_single_player_env
    from arbiter.server.formats.diambra.env import DiambraEnv, arena_settings, episode_seed
    from arbiter.server.formats.diambra.settings import DiambraSettings

    settings = DiambraSettings(game=args.game, difficulty=DIFFICULTY, frame_shape=SHAPES[args.shape])
    if args.worker == "raw":
        env = build_single_player_env(arena_settings(settings, None), lambda *_: MockEngine(settings.level))
    else:
        env = DiambraEnv(settings)
    seen: dict[str, Any] = {}

    def reset(episode: int) -> int | None:
        seed = episode_seed(SEED, episode)
        seen["observation"] = env.reset(seed=seed)[0]
        return seed

    def step(action: list[int]) -> tuple[float, bool]:
        _, reward, terminated, truncated, _ = env.step(action)
        return float(reward), terminated or truncated

    played = play(reset, step, [int(n) for n in env.action_space.nvec], args.warmup, args.steps)
    observation = seen["observation"]
    env.close()
    emit({**played, "frame_shape": list(observation["frame"].shape), "bytes": observation_bytes(observation)})
    return 0


def worker_remote(args: argparse.Namespace) -> int:
    logging.disable(logging.INFO)
    from arbiter.client.remote_env import RemoteEnv
    from arbiter.server.formats.diambra.env import episode_seed

    env = RemoteEnv(
        redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=60,
        shared_frames=not args.frames_through_redis,
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def reset(episode: int) -> int | None:
        observation, info = env.reset()
        if info["env_done"]:
            raise BenchError("the evaluation ran out of episodes before the benchmark's steps")
        seen["observation"] = observation
        return episode_seed(SEED, episode)  # the evaluator names a seed only once its episode is over

    def step(action: list[int]) -> tuple[float, bool]:
        _, reward, terminated, truncated, _ = env.step(action)
        return reward, terminated or truncated

    played = play(reset, step, [int(n) for n in env.action_space.nvec], args.warmup, args.steps)
    env.submit()
    env.close()
    observation = seen["observation"]
    emit({**played, "frame_shape": list(observation["frame"].shape), "bytes": observation_bytes(observation),
          "engine": env.server_info.get("engine")})  # fmt: skip
    return 0


WORKERS = {"raw": worker_local, "inprocess": worker_local, "remote": worker_remote}
