"""One fold of a MetaLC agent, in a process of its own (the agent's side of ``arbiter.client.metalc``).

The runner starts a process running this module per fold (forked from itself on Linux,
``become_fold``; a fresh interpreter elsewhere), with a fresh copy of the submission
folder as working directory, and talks to it over two pipes. Nothing of an earlier fold exists in
this process: the agent's module is imported here for the first time, so whatever the agent keeps
(module globals, class attributes, files in its folder, its home or temporary folder) starts
empty, as it must: a fold's meta-training data holds the test curves of other folds' datasets.

What travels: frames of a length prefix (``FRAME_HEADER``) and a msgpack body
(``arbiter.protocol.codec``: the meta-training curves as raw numpy bytes), in order:

    runner → fold   ["start", {module, seeding, seed_before_import, algorithms, algorithms_meta_features}]
    fold → runner   ["imported"]
    runner → fold   ["play", {session, body}]   (the runner's session; a dataset's ENV_CREATE payload)
    fold → runner   ["played", {seq, datasets, timeouts, round_trips}]
                    or ["restarted", {seq, message, resume_item}] or ["refused", {seq, kind, message}]
    ...             (another "play" for the fold's next dataset, when the last one did not bring it)
    fold → runner   ["error", message]               (instead of any answer; then the fold exits)

A ``play`` is the fold's datasets played on the runner's session, each step sent from here
(``arbiter.client.metalc_play``): the fold's first ``play`` meta-trains the agent on its body's
``meta_train`` first.
The runner closing its end ends the fold. The observation handed to ``suggest`` holds the very A
object the agent returned, which never leaves this process.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
import signal
import struct
import sys
import tempfile
import traceback
from typing import Any, NoReturn

import numpy as np

from arbiter.client.metalc_play import FoldPlayer
from arbiter.protocol import codec
from arbiter.protocol.errors import ArbiterError

FRAME_HEADER = struct.Struct("<I")
# What the runner accepts from the agent's process: how a play went (its round trips' samples
# the largest part) or an error message. The agent's side is the agent's code, so its frames are
# read with the bounds of an untrusted request, a larger size allowed for those samples.
FROM_FOLD_LIMITS = dataclasses.replace(codec.COMMAND_LIMITS, max_bytes=1 << 20)
TO_FOLD_LIMITS = codec.REPLY_LIMITS  # from the runner: trusted, and large (the meta-training curves)
ERROR_TEXT_CHARS = 3000  # an error's text as sent to the runner (the full traceback goes to stderr)


class FoldPipeClosed(Exception):
    """The other end of a fold's pipe closed."""


# -- frames ---------------------------------------------------------------------------------------


def write_frame(fd: int, message: Any) -> None:
    body = codec.encode(message)
    data = memoryview(FRAME_HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise FoldPipeClosed
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_frame(fd: int, limits: codec.Limits) -> Any:
    """The next message; ``FoldPipeClosed`` at the end, ``DecodeError`` for a frame over ``limits``."""
    (size,) = FRAME_HEADER.unpack(_read_exactly(fd, FRAME_HEADER.size))
    if size > limits.max_bytes:
        raise codec.MessageTooLarge(f"a frame of {size} bytes exceeds the limit of {limits.max_bytes}")
    return codec.decode(_read_exactly(fd, size), limits)


# -- what the agent gets ----------------------------------------------------------------------------


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


def import_agent_class(module_name: str) -> type:
    """``from agent import Agent``, the working folder (the submission's copy) first on the path."""
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    agent_class = getattr(module, "Agent", None)
    if agent_class is None:
        raise ArbiterError(f"{module_name}.py defines no class Agent")
    return agent_class


def wire_action(action: Any) -> tuple[list[Any], Any]:
    """The action as sent, and the A the agent gave (handed back in the observation). Algorithms
    travel as ``str``: the challenge looked them up by ``str``, so this is its reading of any A."""
    try:
        a_star, algorithm, delta_t = action
    except (TypeError, ValueError):
        raise ArbiterError(f"the agent's suggest() returned {action!r}; an action is (A_star, A, delta_t)") from None
    if not isinstance(delta_t, (str, bytes)):
        try:
            delta_t = float(delta_t)
        except (TypeError, ValueError):
            delta_t = repr(delta_t)  # the evaluator refuses it, saying what it was
    return ["action", None if a_star is None else str(a_star), str(algorithm), delta_t], algorithm


def observation_for(algorithm: Any, reached: float, score: float) -> tuple[Any, Any, Any]:
    """What ``suggest`` gets: the challenge's env answered with numpy floats read off the curve,
    or with plain 0.0s when nothing was reached (or the curve was missing)."""
    if reached == 0.0 and score == 0.0:
        return (algorithm, 0.0, 0.0)
    return (algorithm, np.float64(reached), np.float64(score))


# -- the fold's process ------------------------------------------------------------------------------


class Fold:
    """The agent of one fold, answering the runner's messages in order."""

    def __init__(self, start: dict[str, Any]):
        self.algorithms: list[str] = start["algorithms"]
        # One object, handed to meta_train and every reset, as the challenge's env handed its own.
        self.algorithms_meta_features = start["algorithms_meta_features"]
        if start["seed_before_import"]:
            seed_process(start["seeding"])
        self.agent_class = import_agent_class(start["module"])
        if not start["seed_before_import"]:
            seed_process(start["seeding"])
        self.agent: Any = None
        self.algorithm: Any = None  # the A of the agent's last action, as it gave it

    def meta_train(self, data: dict[str, Any]) -> None:
        self.agent = self.agent_class(number_of_algorithms=len(self.algorithms))
        datasets = data["datasets"]
        self.agent.meta_train(
            data["datasets_meta_features"],
            self.algorithms_meta_features,
            curves_from_wire(data["validation_learning_curves"], datasets, self.algorithms),
            curves_from_wire(data["test_learning_curves"], datasets, self.algorithms),
        )

    def reset(self, dataset_meta_features: dict[str, str]) -> list[Any]:
        self.agent.reset(dataset_meta_features, self.algorithms_meta_features)
        return self._suggest(None)

    def observe(self, reached: float, score: float) -> list[Any]:
        return self._suggest(observation_for(self.algorithm, reached, score))

    def _suggest(self, observation: Any) -> list[Any]:
        action, self.algorithm = wire_action(self.agent.suggest(observation))
        return action


# Where an error of the agent's code happened, by what it was asked last.
DOING = {
    "start": "while importing the agent",
    "meta_train": "in Agent() or meta_train()",
    "reset": "in reset() or the first suggest()",
    "observe": "in suggest()",
}


def serve(read_fd: int, write_fd: int) -> int:
    """Answer the runner until it closes its end; exit status 0, or 1 after reporting an error."""
    player: FoldPlayer | None = None
    try:
        _, start = read_frame(read_fd, TO_FOLD_LIMITS)
        player = FoldPlayer(Fold(start))
        write_frame(write_fd, ["imported"])
        while True:
            message = read_frame(read_fd, TO_FOLD_LIMITS)
            if not (isinstance(message, list) and len(message) == 2 and message[0] == "play"):
                raise ArbiterError(f"unknown message {str(message)[:80]} from the runner")
            write_frame(write_fd, player.play(message[1]))
    except FoldPipeClosed:
        return 0
    except BaseException as exc:  # the agent's error (or its sys.exit): reported, then this fold ends
        traceback.print_exc()
        doing = DOING["start"] if player is None else DOING[player.doing]
        text = f"{type(exc).__name__} {doing}: {exc}"
        try:
            write_frame(write_fd, ["error", text[:ERROR_TEXT_CHARS]])
        except OSError:
            pass
        return 1


def end_with_the_runner(runner_pid: int) -> None:
    """Have the kernel kill this process when the runner's ends (Linux; elsewhere the runner's
    pipe closing ends it at its next read), so that no fold outlives a killed runner."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != runner_pid:  # the runner ended before the request took hold
        os._exit(1)


def become_fold(workdir: str, env: dict[str, str], read_fd: int, write_fd: int, runner_pid: int) -> NoReturn:
    """A process just forked from the runner, made what a fresh interpreter started for the fold
    would be, then serving it. The runner never imports the agent, so the agent's module is
    imported here for the first time; what the runner set up for itself is undone: its session
    and process group, its stop signals, its standard input and streams, its working folder and
    environment (and ``tempfile``'s folder, read from them), and the generators' states, which an
    unseeded fresh interpreter draws from the system."""
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # The standard streams as an interpreter opens them, on the process's own descriptors: the
    # runner's may hold buffered input or have been replaced by whatever embeds it.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stream, never closed
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    random.seed()
    np.random.seed()
    main([str(read_fd), str(write_fd), str(runner_pid)])
    os._exit(1)  # main exits; never reached


def main(argv: list[str]) -> None:
    read_fd, write_fd, runner_pid = int(argv[0]), int(argv[1]), int(argv[2])
    end_with_the_runner(runner_pid)
    status = serve(read_fd, write_fd)
    # The fold is over and the runner waits for this process to go before the next fold starts:
    # what the agent printed is flushed, and the interpreter's own teardown is skipped.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
