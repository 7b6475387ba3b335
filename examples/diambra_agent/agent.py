#!/usr/bin/env python3
"""A DIAMBRA Arena agent script, written as DIAMBRA's documentation writes one.

The loop runs until ``info["env_done"]``: the evaluation decides how many episodes it plays, so
the same script serves an evaluation of 1, 3 or 10 episodes. The agent here presses random
buttons; put a trained policy in ``choose_action``.

Against an arbiter evaluator (``arbiter run`` sets ``ARBITER_REDIS_URL`` for the agent it starts):

    arbiter run --competition diambra --set game=doapp --set difficulty=hard -- \\
        python examples/diambra_agent/agent.py

the env is ``arbiter.client.RemoteEnv``: the evaluator owns the game, its settings and seeds, and
sends DIAMBRA's own observation (frame and RAM states) with every step. Without an evaluator:

    python examples/diambra_agent/agent.py --game doapp --difficulty hard --episodes 2

plays the evaluation in this process on diambra-arena's engine mock (or on the DIAMBRA engine
named by ``DIAMBRA_ENVS``, as ``diambra run`` sets it) and prints the score arbiter computes: with
the same ``--seed`` as the competition (the preset's 1001 by default) and ``--action-seed``, the
score ``arbiter run`` gives.
The in-process mode needs ``pip install -e ".[diambra]"``; the remote mode needs only arbiter.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def make_remote_env() -> Any:
    """The evaluator's env (the connection comes from ``ARBITER_REDIS_URL`` and
    ``AICROWD_SUBMISSION_ID``, which ``arbiter run`` sets)."""
    from arbiter.client.remote_env import RemoteEnv

    return RemoteEnv()


def make_evaluation_env(game: str, difficulty: str, episodes: int, seed: int | None) -> Any:
    """The env of one evaluation, played in process."""
    from arbiter.server.formats.diambra.engine import engine_address_from_environ
    from arbiter.server.formats.diambra.local import LocalEvaluation
    from arbiter.server.formats.diambra.settings import DiambraSettings

    settings = DiambraSettings(game=game, difficulty=difficulty, episodes=episodes, frame_shape=[128, 128, 1])
    return LocalEvaluation(settings, seed=seed, engine_address=engine_address_from_environ(os.environ))


def choose_action(env: Any, observation: Any) -> Any:
    return env.action_space.sample()


def play(env: Any) -> None:
    """DIAMBRA's agent loop: reset on terminated or truncated, leave on env_done."""
    observation, info = env.reset()
    while True:
        action = choose_action(env, observation)
        observation, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            observation, info = env.reset()
            if info["env_done"]:
                break


def score_line(summary: dict[str, Any]) -> str:
    """The figures in one line (the results folder, or ``main``'s return value, has them all)."""
    if summary["score"] is None:
        return "no score"
    engine = f" (engine: {summary['engine']})" if summary.get("engine") else ""
    return f"score {summary['score']:.6g}, mean reward {summary['mean_reward']:.6g}{engine}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--game", default="doapp")
    parser.add_argument("--difficulty", default="easy", choices=["easy", "medium", "hard"])
    parser.add_argument("--episodes", type=int, default=1)
    # Two seeds: the evaluation's (the game's resets; the evaluator's own when it plays remotely,
    # the diambra preset's by default) and the random buttons'.
    parser.add_argument("--seed", type=int, default=1001, help="the evaluation's seed, in this process")
    parser.add_argument("--action-seed", type=int, default=42, help="the random buttons' seed")
    args = parser.parse_args(argv)

    if os.environ.get("ARBITER_REDIS_URL"):
        env = make_remote_env()
        env.action_space.seed(args.action_seed)
        play(env)
        scores = env.submit()  # the evaluator's figures (the evaluation also ends when the agent exits)
        env.close()
        summary = {"score": scores.get("score"), "mean_reward": scores.get("score_secondary"),
                   "engine": env.server_info.get("engine")}  # fmt: skip
        print(f"submitted: {score_line(summary)}")
        return summary

    env = make_evaluation_env(args.game, args.difficulty, args.episodes, args.seed)
    env.action_space.seed(args.action_seed)
    play(env)
    result = env.result()
    env.close()
    summary = {
        "score": result["primary"],
        "mean_reward": result["secondary"],
        "engine": env.records[0]["engine"] if env.records else None,
        "episodes": [
            {k: r[k] for k in ("episode", "reward", "k", "score", "bounds", "bounds_source", "seed", "engine")}
            for r in env.records
        ],
    }
    print(f"{score_line(summary)} over {len(env.records)} {'episode' if len(env.records) == 1 else 'episodes'}")
    return summary


if __name__ == "__main__":
    main()
