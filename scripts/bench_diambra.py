#!/usr/bin/env python3
"""Benchmark the DIAMBRA format's env in process, on diambra-arena's engine mock.

    python scripts/bench_diambra.py [--game doapp] [--steps 3000] [--rounds 3] [--warmup 300]
                                     [--mock-fps 1000] [--json PATH]

For each frame shape (the game's native frame, 128×128 in colour, 128×128 grayscale) one
deterministic agent (its action a pure function of the step number) plays ``--steps`` steps,
resetting at each episode's end, two ways:

  raw     diambra-arena's own ``DiambraGym1P`` on the mock, nothing of arbiter around it;
  arbiter ``DiambraEnv``: the same env with arbiter's action check, observation conversion and
          private random generators, i.e. what the server steps for an evaluation.

Each path runs in a subprocess of its own (the paths alternate within a round). Reported per
shape: steps per second (median over rounds),
the bytes of one observation (the frame, and the whole observation as numpy data) and the bytes of
that observation encoded by arbiter's codec, as a step reply would carry it.

The mock sleeps 1 / (step_ratio × fps) seconds per step to stand in for the emulator
(``--mock-fps``, diambra-arena's default 1000: 0.17 ms at step ratio 6); a real engine's step
costs far more (the emulator, gRPC, the frame's transfer), so these figures bound arbiter's own
cost, not a real evaluation's speed. Needs ``pip install -e ".[diambra]"``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from arbiter.protocol import codec
from arbiter.server.formats.diambra.engine import MockEngine, build_single_player_env
from arbiter.server.formats.diambra.env import DiambraEnv, arena_settings
from arbiter.server.formats.diambra.settings import DiambraSettings

SHAPES = {"native": None, "128x128 colour": [128, 128, 0], "128x128 gray": [128, 128, 1]}
SEED = 1234


def action_at(step: int, nvec: list[int]) -> list[int]:
    """A deterministic button sequence: every move and attack in turn, attacks a third of the time."""
    return [step % nvec[0], (step // 3) % nvec[1] if step % 3 == 0 else 0]


def make_raw(settings: DiambraSettings, mock_fps: float) -> Any:
    def engine(_address: str, _timeout_s: int) -> MockEngine:
        return MockEngine(settings.level, fps=mock_fps)

    return build_single_player_env(arena_settings(settings, None), engine)


def run(env: Any, steps: int) -> float:
    """Steps per second over ``steps`` steps of the deterministic agent."""
    nvec = [int(n) for n in env.action_space.nvec]
    env.reset(seed=SEED)
    start = time.perf_counter()
    for step in range(steps):
        _, _, terminated, truncated, _ = env.step(action_at(step, nvec))
        if terminated or truncated:
            env.reset(seed=SEED + step)
    return steps / (time.perf_counter() - start)


def observation_bytes(observation: dict[str, Any]) -> tuple[int, int, int]:
    """(frame bytes, all numpy bytes of the observation, bytes encoded by arbiter's codec)."""

    def numpy_bytes(value: Any) -> int:
        if isinstance(value, dict):
            return sum(numpy_bytes(v) for v in value.values())
        return value.nbytes if isinstance(value, np.ndarray) else 0

    return observation["frame"].nbytes, numpy_bytes(observation), len(codec.encode({"observation": observation}))


def worker(args: argparse.Namespace) -> int:
    """One path on one frame shape, in this process alone; prints its figures as one JSON line."""
    logging.disable(logging.INFO)  # diambra-arena logs its whole settings at every env creation
    settings = DiambraSettings(game=args.game, difficulty="medium", frame_shape=SHAPES[args.shape])
    env = make_raw(settings, args.mock_fps) if args.worker == "raw" else DiambraEnv(settings, fps=args.mock_fps)
    run(env, args.warmup)  # first steps pay for allocations and caches
    rate = run(env, args.steps)
    observation, _ = env.reset(seed=SEED)
    if args.worker == "arbiter":
        frame_b, numpy_b, wire_b = observation_bytes(observation)
    else:
        frame_b = numpy_b = wire_b = None
    env.close()
    print(
        json.dumps({"rate": rate, "frame_shape": list(observation["frame"].shape), "bytes": [frame_b, numpy_b, wire_b]})
    )
    return 0


def measure(path: str, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    # Each path runs in a process of its own: a process that allocates two envs' 740 KB frames
    # in turn makes the allocator's behaviour, not the env, decide which path looks faster.
    command = [sys.executable, __file__, "--worker", path, "--shape", shape, "--game", args.game]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--mock-fps", str(args.mock_fps)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{path} on {shape} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--game", default="doapp")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=300, help="untimed steps of each path before it is timed")
    parser.add_argument("--mock-fps", type=float, default=1000.0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--worker", choices=["raw", "arbiter"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=list(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    results: dict[str, Any] = {
        "game": args.game,
        "steps": args.steps,
        "rounds": args.rounds,
        "mock_fps": args.mock_fps,
        "python": platform.python_version(),
        "shapes": {},
    }
    for shape in SHAPES:
        rates: dict[str, list[float]] = {"raw": [], "arbiter": []}
        seen: dict[str, Any] = {}
        for _ in range(args.rounds):
            for path in ("raw", "arbiter"):
                figures = measure(path, shape, args)
                rates[path].append(figures["rate"])
                if path == "arbiter":
                    seen = figures
        raw_rate, ours_rate = statistics.median(rates["raw"]), statistics.median(rates["arbiter"])
        frame_b, numpy_b, wire_b = seen["bytes"]
        results["shapes"][shape] = {
            "frame_shape": seen["frame_shape"],
            "raw_steps_per_s": raw_rate,
            "arbiter_steps_per_s": ours_rate,
            "raw_steps_per_s_all": rates["raw"],
            "arbiter_steps_per_s_all": rates["arbiter"],
            "arbiter_us_per_step_over_raw": 1e6 / ours_rate - 1e6 / raw_rate,
            "frame_bytes": frame_b,
            "observation_numpy_bytes": numpy_b,
            "observation_encoded_bytes": wire_b,
        }
        print(
            f"{shape:>15}  frame {'x'.join(map(str, seen['frame_shape'])):>11}  "
            f"raw {raw_rate:7.0f} steps/s  arbiter {ours_rate:7.0f} steps/s "
            f"({1e6 / ours_rate - 1e6 / raw_rate:+6.1f} µs/step)  observation {frame_b:>7} B frame, "
            f"{wire_b:>7} B encoded",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
