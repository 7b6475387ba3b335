"""Play an unmodified ReinforceLab agent against arbiter's two-phase evaluator.

    python -m arbiter.client.reinforcelab SUBMISSION_DIR

``Agent`` is imported from ``SUBMISSION_DIR/agent.py`` the way ReinforceLab's Codabench
ingestion imports it (working directory and import path set to the submission), and the
evaluator's stages are followed in order:

- phase 1: ``Agent(env)``, ``load()``, then ``act(obs)`` for every step of every episode;
- each phase-2 run: a fresh ``Agent(env)`` and ``train()`` (the env raises ``StopIteration``
  when the evaluator ends the run, as ReinforceLab's monitor does), then ``act(obs)`` for that
  run's evaluation episodes.

``env`` is a ``RemoteEnv``. A restarted runner picks up where the evaluation stands (the
handshake says which item is next: the evaluator sends it back to the start of a run whose
training the crashed runner had begun). A runner that lives through an evaluator restart
(``--resume``) while inside an item is told where the evaluation goes on, and goes on there with
an agent built the way it would have been (loaded, or trained afresh for the run). Exit status 0
once the evaluation is submitted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import ArbiterError, EvaluatorRestarted, TimeoutException

log = logging.getLogger("arbiter.reinforcelab")


def import_agent_class(submission_dir: str) -> type:
    """``from agent import Agent`` inside the submission, as the ingestion program does."""
    submission_dir = os.path.abspath(submission_dir)
    if not os.path.isfile(os.path.join(submission_dir, "agent.py")):
        raise SystemExit(f"no agent.py in {submission_dir}")
    os.chdir(submission_dir)
    sys.path.insert(0, submission_dir)
    module = importlib.import_module("agent")
    agent_class = getattr(module, "Agent", None)
    if agent_class is None:
        raise SystemExit(f"{submission_dir}/agent.py defines no class Agent")
    return agent_class


def play_episodes(env: RemoteEnv, agent: Any, stage: dict[str, Any]) -> list[float]:
    """The stage's evaluation episodes with ``agent.act``; a timed-out episode is the
    evaluator's to score, and the next one goes on."""
    env.begin_stage(stage)
    returns = []
    for _ in range(max(0, stage["items"][1] - env.next_item)):
        observation, info = env.reset()
        if info.get("env_done"):
            break
        total, done = 0.0, False
        try:
            while not done:
                observation, reward, terminated, truncated, _ = env.step(agent.act(observation))
                total += reward
                done = terminated or truncated
        except TimeoutException as exc:
            log.warning("episode timed out: %s", exc)
            continue
        returns.append(total)
    return returns


def train(env: RemoteEnv, agent_class: type, stage: dict[str, Any]) -> Any:
    env.begin_stage(stage)
    agent = agent_class(env)
    try:
        agent.train()
    except StopIteration:
        pass  # the evaluator ended the run: converged, or out of steps
    except TimeoutException as exc:
        log.warning("training run %s ended by a timeout: %s", stage["run"], exc)
    except ArbiterError:
        raise
    except Exception as exc:  # ReinforceLab's ingestion goes on after a training error; so do we
        log.warning("training run %s raised %s: %s", stage["run"], type(exc).__name__, exc)
    return agent


def run(submission_dir: str, env: RemoteEnv | None = None) -> dict[str, Any]:
    agent_class = import_agent_class(submission_dir)
    env = env or RemoteEnv(formats=["two-phase"], client_name="python -m arbiter.client.reinforcelab")
    while True:
        try:
            play_stages(env, agent_class, start=env.next_item)
            break
        except EvaluatorRestarted as exc:  # RemoteEnv has moved next_item to where it goes on
            log.warning("%s", exc)
    scores = env.submit()
    env.close()
    return scores


def play_stages(env: RemoteEnv, agent_class: type, start: int) -> None:
    """Every stage from the one holding item ``start`` on, each with the agent it needs."""
    agent = None
    for stage in env.stages:
        if stage["items"][1] <= start:
            continue  # played before a restart
        if stage["stage"] == "train":
            agent = train(env, agent_class, stage)
            continue
        if stage["phase"] == 1 and agent is None:
            agent = agent_class(env)
            agent.load()
        elif agent is None:
            # The evaluator never hands a run's evaluation episodes to an agent that did not
            # train in that run: a restart goes back to the run's training.
            raise ArbiterError(f"run {stage['run']}'s evaluation episodes came before its training")
        returns = play_episodes(env, agent, stage)
        log.info("phase %s%s: %d episodes, returns %s", stage["phase"],
                 f" run {stage['run']}" if stage["run"] is not None else "", len(returns), returns)  # fmt: skip
        if stage["phase"] == 1:
            agent = None  # phase 2 starts every run from scratch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arbiter.client.reinforcelab", description=__doc__.split("\n\n")[0])
    parser.add_argument("submission_dir", help="folder holding agent.py (and the agent's files)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        scores = run(args.submission_dir)
    except ArbiterError as exc:  # a refusal or an unreachable evaluator: its message says it all
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    log.info("submitted: score %s, secondary %s", scores.get("score"), scores.get("score_secondary"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
