"""The measured processes of scripts/bench_remote_env.py, one per ``--worker MODE``.

All three paths play the same seeded episodes of one Gymnasium env with the same deterministic
agent and stop after the same number of env steps, cutting the running episode there as the
evaluator ends a training run. Each imports and builds its env first, then measures from its
first reset to its last step (resets included) and times every ``step`` and ``reset`` call on its
own. Results are printed as one line (harness.emit).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from harness import emit

StepFn = Callable[[int], tuple[Any, float, bool, bool]]
ResetFn = Callable[[int], tuple[Any, int | None]]


def agent_action(observation: Any) -> int:
    """Push the cart the way the pole is turning: with the benchmark's seeds its returns stay far
    below the preset's goal, so a training run never converges and always lasts exactly its step
    limit (the benchmark checks that it does)."""
    return int(observation[3] > 0)


def play(reset: ResetFn, step: StepFn, total_steps: int) -> dict[str, Any]:
    """Episode k starts with ``reset(k)``; stops after ``total_steps`` env steps in all."""
    clock = time.perf_counter
    step_s: list[float] = []
    reset_s: list[float] = []
    episodes = []
    done = 0
    started = clock()
    while done < total_steps:
        before = clock()
        observation, seed = reset(len(episodes))
        reset_s.append(clock() - before)
        steps, total = 0, 0.0
        while True:
            action = agent_action(observation)
            before = clock()
            observation, reward, terminated, truncated = step(action)
            step_s.append(clock() - before)
            steps += 1
            total += reward
            done += 1
            if terminated or truncated or done == total_steps:
                break
        episodes.append({"seed": seed, "steps": steps, "return": total})
    wall = clock() - started
    return {"wall_s": wall, "steps": done, "step_s": step_s, "reset_s": reset_s, "episodes": episodes}


def _emit(path: str, setup_s: float, played: dict[str, Any], **extra: Any) -> int:
    emit({"path": path, "setup_s": setup_s, **played, **extra})
    return 0


def _seed(args: argparse.Namespace, episode: int) -> int | None:
    """The seed the evaluator resets training run 0's ``episode``-th episode with (two-phase plan)."""
    from arbiter.server.formats.base import reset_seed

    return reset_seed(args.seed, 2, 0, episode)


def worker_inprocess(args: argparse.Namespace) -> int:
    import gymnasium

    before = time.perf_counter()
    env = gymnasium.make(args.env_id)
    setup = time.perf_counter() - before

    def reset(episode: int) -> tuple[Any, int | None]:
        seed = _seed(args, episode)
        return env.reset(seed=seed)[0], seed

    def step(action: int) -> tuple[Any, float, bool, bool]:
        observation, reward, terminated, truncated, _ = env.step(action)
        return observation, float(reward), terminated, truncated

    try:
        return _emit("inprocess", setup, play(reset, step, args.steps))
    finally:
        env.close()


def worker_async1(args: argparse.Namespace) -> int:
    """Gymnasium's own AsyncVectorEnv with one env: a subprocess over pipes and shared memory.
    Autoreset is off (the agent resets with the plan's seeds, as the evaluator does); stepping
    costs the same as with the default autoreset."""
    import gymnasium
    import numpy as np
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    env_id = args.env_id
    before = time.perf_counter()
    envs = AsyncVectorEnv([lambda: gymnasium.make(env_id)], autoreset_mode=AutoresetMode.DISABLED)
    setup = time.perf_counter() - before
    actions = np.zeros(1, dtype=np.int64)

    def reset(episode: int) -> tuple[Any, int | None]:
        seed = _seed(args, episode)
        return envs.reset(seed=[seed])[0][0], seed

    def step(action: int) -> tuple[Any, float, bool, bool]:
        actions[0] = action
        observation, reward, terminated, truncated, _ = envs.step(actions)
        return observation[0], float(reward[0]), bool(terminated[0]), bool(truncated[0])

    try:
        return _emit("async1", setup, play(reset, step, args.steps))
    finally:
        envs.close()


def worker_remote(args: argparse.Namespace) -> int:
    """arbiter's RemoteEnv against ``arbiter serve`` (phase 2, one run): the measured part is the
    training run, which the evaluator ends after ``args.steps`` env steps; then the run's
    evaluation episodes are played (not measured) and the evaluation is submitted."""
    from arbiter.client.remote_env import RemoteEnv
    from arbiter.protocol.messages import EXTENSION_KEY

    before = time.perf_counter()
    env = RemoteEnv(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    setup = time.perf_counter() - before
    stages = [s for s in env.stages if s["phase"] == 2]
    env.begin_stage(stages[0])
    stage_over_at: list[int] = []  # the steps after which the evaluator said the run was over

    def reset(episode: int) -> tuple[Any, int | None]:
        observation, _ = env.reset()
        return observation, _seed(args, episode)  # the evaluator names a seed only once its episode is over

    def step(action: int) -> tuple[Any, float, bool, bool]:
        observation, reward, terminated, truncated, info = env.step(action)
        if info[EXTENSION_KEY].get("stage_over"):
            stage_over_at.append(info[EXTENSION_KEY]["total_steps"])
        return observation, reward, terminated, truncated

    try:
        played = play(reset, step, args.steps)
        try:
            env.reset()
            ended = False
        except StopIteration:
            ended = True  # the run is over: what a training loop is told
        eval_returns = []
        for stage in stages[1:2]:
            env.begin_stage(stage)
            for _ in range(stage["items"][1] - stage["items"][0]):
                observation, _ = env.reset()
                total, over = 0.0, False
                while not over:
                    observation, reward, terminated, truncated, _ = env.step(agent_action(observation))
                    total += reward
                    over = terminated or truncated
                eval_returns.append(total)
        scores = env.submit()
    finally:
        env.close()
    return _emit(
        "remote",
        setup,
        played,
        stage_over_at=stage_over_at,
        stop_iteration_after_run=ended,
        eval_returns=eval_returns,
        score=scores.get("score"),
    )


WORKERS = {"inprocess": worker_inprocess, "async1": worker_async1, "remote": worker_remote}
