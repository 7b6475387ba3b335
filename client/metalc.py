"""Play an unmodified MetaLC (WCCI 2022, round 1) agent against arbiter's MetaLC evaluator.

    python -m arbiter.client.metalc SUBMISSION_DIR [--agent-module agent]

As the challenge's ingestion program did:

- ``Agent`` comes from ``SUBMISSION_DIR/agent.py`` (``--agent-module`` names another module of
  the folder), with the folder as working directory and first on the import path;
- the process is seeded as the challenge seeded its own: development, Python's ``random`` with
  208 before the agent's module is imported; final, at the start of run r, ``random``, numpy and
  (if installed) torch with r + 1. The evaluator's handshake says which;
- per fold, a fresh ``Agent(number_of_algorithms=n)`` and ``meta_train(dataset_meta_features,
  algorithms_meta_features, validation_learning_curves, test_learning_curves)``, the curves as
  objects with ``.timestamps`` and ``.scores`` (float64 numpy arrays; plain ``[0.0]`` lists for a
  curve whose file is missing) and the challenge's ``get_last_point_within_delta_t``;
- per dataset, ``reset(dataset_meta_features, algorithms_meta_features)`` then
  ``suggest(observation)`` (None first) until the dataset's time budget is spent. The observation
  is ``(A, C_A, score)`` with A the very object the agent passed.

Actions travel as ``[str(A_star) or None, str(A), float(delta_t)]``: the challenge looked
algorithms up by ``str``, so this is its reading of any A the agent returns. An action the
evaluator refuses (an unknown algorithm, a ``delta_t`` that is not a number) stops the runner with
an error, as it stopped the challenge's ingestion. A dataset that runs out of time scores 0 and
the next one goes on. The runner talks to the evaluator through ``arbiter.client.wire.Wire``
(MetaLC's actions hold names and None, which no Gymnasium space describes exactly). Exit status
0 once the evaluation is submitted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import random
import sys
from typing import Any

import numpy as np

from arbiter.protocol.errors import ArbiterError, InvalidAction, TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, PROTOCOL_VERSION, extension

from .wire import Wire

log = logging.getLogger("arbiter.metalc")


class LearningCurve:
    """One algorithm's curve on one meta-training dataset, shaped as the challenge's agents get it."""

    __slots__ = ("timestamps", "scores")

    def __init__(self, timestamps: Any, scores: Any):
        self.timestamps = timestamps
        self.scores = scores

    def get_last_point_within_delta_t(self, delta_t: float, C: float) -> tuple[Any, Any]:  # noqa: N803 - its name
        """``(score, timestamp)`` of the last point reached with ``delta_t`` more than ``C``: the
        point before the first one past ``C + delta_t``; (0.0, 0.0) if even the first is past it;
        the last point if none is."""
        reach = C + delta_t
        for i in range(len(self.timestamps)):
            if reach < self.timestamps[i]:
                if i == 0:
                    return 0.0, 0.0
                return self.scores[i - 1], self.timestamps[i - 1]
        return self.scores[-1], self.timestamps[-1]

    def __repr__(self) -> str:
        return f"LearningCurve({len(self.timestamps)} points)"


def curves_from_wire(
    table: dict[str, Any], datasets: list[str], algorithms: list[str]
) -> dict[str, dict[str, LearningCurve]]:
    """One split's curves from the evaluator's flat arrays (plan.meta_train_wire): dataset by
    dataset, algorithm by algorithm, each curve its own slice of one writable float64 array."""
    ends = np.cumsum(table["lengths"]).tolist()
    times = np.array(table["timestamps"], dtype=np.float64)  # a copy: writable, unlike the wire's buffer
    scores = np.array(table["scores"], dtype=np.float64)
    missing = table["missing"].tolist()
    curves: dict[str, dict[str, LearningCurve]] = {}
    k = start = 0
    for dataset in datasets:
        row = curves[dataset] = {}
        for algorithm in algorithms:
            end = ends[k]
            # a missing scores.txt: the challenge's stand-in, as lists
            row[algorithm] = (
                LearningCurve([0.0], [0.0]) if missing[k] else LearningCurve(times[start:end], scores[start:end])
            )
            k, start = k + 1, end
    return curves


def seed_process(run: dict[str, Any]) -> None:
    """Seed this process for one run, as the challenge's ingestion program seeded itself."""
    seed = run["seed"]
    if run.get("torch"):
        try:
            import torch
        except ImportError:
            pass
        else:
            torch.manual_seed(seed)
            torch.cuda.manual_seed_all(seed)
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
    if run.get("numpy"):
        np.random.seed(seed)
    if run.get("random"):
        random.seed(seed)


def import_agent_class(submission_dir: str, module_name: str = "agent") -> type:
    """``from agent import Agent`` inside the submission folder."""
    submission_dir = os.path.abspath(submission_dir)
    if not os.path.isfile(os.path.join(submission_dir, f"{module_name}.py")):
        raise SystemExit(f"no {module_name}.py in {submission_dir}")
    os.chdir(submission_dir)
    sys.path.insert(0, submission_dir)
    module = importlib.import_module(module_name)
    agent_class = getattr(module, "Agent", None)
    if agent_class is None:
        raise SystemExit(f"{submission_dir}/{module_name}.py defines no class Agent")
    return agent_class


def wire_action(action: Any) -> tuple[list[Any], Any]:
    """The action as sent, and the A the agent gave (handed back in the observation)."""
    try:
        a_star, algorithm, delta_t = action
    except (TypeError, ValueError):
        raise ArbiterError(f"the agent's suggest() returned {action!r}; an action is (A_star, A, delta_t)") from None
    if not isinstance(delta_t, (str, bytes)):
        try:
            delta_t = float(delta_t)
        except (TypeError, ValueError):
            delta_t = repr(delta_t)  # the evaluator refuses it, saying what it was
    return [None if a_star is None else str(a_star), str(algorithm), delta_t], algorithm


class Runner:
    """One evaluation: the handshake, then datasets until the evaluator has none left."""

    def __init__(self, wire: Any):
        self.wire = wire
        self.server_info = wire.handshake(f"arbiter-{PROTOCOL_VERSION}")
        if self.server_info.get("format") != "metalc":
            raise ArbiterError("this evaluator is not running a MetaLC evaluation")
        self.runs = {run["run"]: run for run in self.server_info["runs"]}
        self.number_of_algorithms = len(self.server_info["algorithms"])
        # One object, handed to every meta_train and reset, as the challenge's env handed its own.
        self.algorithms_meta_features = self.server_info["algorithms_meta_features"]
        self.seeded: set[int] = set()
        self.agent: Any = None
        self.agent_fold: tuple[int, int] | None = None
        self.datasets = 0
        self.timeouts = 0

    def seed_before_import(self) -> None:
        if self.server_info.get("seed_before_import"):
            first = min(self.runs)
            seed_process(self.runs[first])
            self.seeded.add(first)

    def play(self, agent_class: type) -> dict[str, Any]:
        while True:
            try:
                body = self.wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
            except TimeoutException as exc:  # told late of a timeout: the next request goes on
                log.warning("%s", exc)
                continue
            ext = extension(body)
            if ext.get("finished"):
                break
            self._begin(agent_class, ext)
            self._play_dataset(body["info"]["dataset_meta_features"], ext)
        return self.wire.request(FLATLAND_RL.ENV_SUBMIT, {})["payload"]

    def _begin(self, agent_class: type, ext: dict[str, Any]) -> None:
        run, fold = ext["run"], ext["fold"]
        if run not in self.seeded:
            seed_process(self.runs[run])
            self.seeded.add(run)
        if self.agent_fold == (run, fold):
            return
        data = ext.get("meta_train")
        if data is None:
            raise ArbiterError(f"run {run}, fold {fold}: the evaluator sent no meta-training data for this fold")
        self.agent = agent_class(number_of_algorithms=self.number_of_algorithms)
        datasets, algorithms = data["datasets"], self.server_info["algorithms"]
        self.agent.meta_train(
            data["datasets_meta_features"],
            self.algorithms_meta_features,
            curves_from_wire(data["validation_learning_curves"], datasets, algorithms),
            curves_from_wire(data["test_learning_curves"], datasets, algorithms),
        )
        self.agent_fold = (run, fold)
        log.info("run %s, fold %s: agent meta-trained on %d datasets", run, fold, len(data["datasets_meta_features"]))

    def _play_dataset(self, dataset_meta_features: dict[str, str], ext: dict[str, Any]) -> None:
        agent = self.agent
        agent.reset(dataset_meta_features, self.algorithms_meta_features)
        observation = None
        request = self.wire.request
        while True:
            action, algorithm = wire_action(agent.suggest(observation))
            try:
                body = request(FLATLAND_RL.ENV_STEP, {"action": action, EXTENSION_KEY: {"reply": True}})["payload"]
            except TimeoutException as exc:
                self.timeouts += 1
                log.warning("run %s, dataset %s: %s (it scores 0)", ext["run"], ext["dataset"], exc)
                return
            except InvalidAction as exc:
                raise ArbiterError(f"run {ext['run']}, dataset {ext['dataset']}: {exc}") from None
            _, reached, score = body["observation"]
            # The challenge's env answered with numpy floats read off the curve, or with plain
            # 0.0s when nothing was reached (or the curve was missing).
            if reached == 0.0 and score == 0.0:
                observation = (algorithm, 0.0, 0.0)
            else:
                observation = (algorithm, np.float64(reached), np.float64(score))
            if body["done"]:
                self.datasets += 1
                return


def run(submission_dir: str, *, agent_module: str = "agent", wire: Any = None) -> dict[str, Any]:
    """Play the whole evaluation; returns the evaluator's ENV_SUBMIT reply."""
    own_wire = wire is None
    wire = wire or Wire()
    try:
        runner = Runner(wire)
        runner.seed_before_import()
        agent_class = import_agent_class(submission_dir, agent_module)
        scores = runner.play(agent_class)
        log.info("%d datasets played, %d timed out", runner.datasets, runner.timeouts)
        return scores
    finally:
        if own_wire:
            wire.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arbiter.client.metalc", description=__doc__.split("\n\n")[0])
    parser.add_argument("submission_dir", help="folder holding agent.py (and the agent's files)")
    parser.add_argument("--agent-module", default="agent", help="module of the folder defining Agent (default: agent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    scores = run(args.submission_dir, agent_module=args.agent_module)
    log.info("submitted: score %s, secondary %s", scores.get("score"), scores.get("score_secondary"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
