"""client/metalc_fold.py: one fold of a MetaLC agent in a process of its own.

The frames are checked over real pipes, the curves and actions as the agent gets and gives them,
and a real fold process (started as the runner starts it, in a submission folder of its own) is
driven through its messages in order. The runner around it is in
tests/formats/metalc/test_metalc_runner.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from arbiter.client.metalc_fold import (
    FROM_FOLD_LIMITS,
    TO_FOLD_LIMITS,
    FoldPipeClosed,
    LearningCurve,
    curves_from_wire,
    observation_for,
    read_frame,
    wire_action,
    write_frame,
)
from arbiter.protocol.errors import ArbiterError, MessageTooLarge


@pytest.fixture
def pipe():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_frame_arrives_as_it_was_written(pipe):
    read_fd, write_fd = pipe
    message = ["meta_train", {"curve": np.arange(5, dtype=np.float64), "name": "d1"}]
    write_frame(write_fd, message)
    kind, body = read_frame(read_fd, TO_FOLD_LIMITS)
    assert kind == "meta_train" and body["name"] == "d1" and np.array_equal(body["curve"], np.arange(5.0))


def test_a_frame_larger_than_the_pipe_holds_arrives_whole(pipe):
    read_fd, write_fd = pipe
    big = np.random.default_rng(0).random(200_000)  # 1.6 MB: many times a pipe's buffer
    writer = threading.Thread(target=write_frame, args=(write_fd, ["data", big]))
    writer.start()
    _, received = read_frame(read_fd, TO_FOLD_LIMITS)
    writer.join()
    assert np.array_equal(received, big)


def test_a_frame_over_the_limit_is_refused_before_its_body_is_read(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, (FROM_FOLD_LIMITS.max_bytes + 1).to_bytes(4, "little"))  # the header alone
    with pytest.raises(MessageTooLarge, match="exceeds the limit"):
        read_frame(read_fd, FROM_FOLD_LIMITS)


def test_a_closed_pipe_ends_the_frames_even_in_the_middle_of_one(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, (100).to_bytes(4, "little") + b"only part of it")
    os.close(write_fd)
    with pytest.raises(FoldPipeClosed):
        read_frame(read_fd, TO_FOLD_LIMITS)
    with pytest.raises(FoldPipeClosed):
        read_frame(read_fd, TO_FOLD_LIMITS)


def test_the_last_point_within_delta_t_is_read_off_the_curve():
    curve = LearningCurve([1.0, 2.0, 4.0], [0.1, 0.5, 0.7])
    assert curve.get_last_point_within_delta_t(0.5, 0.0) == (0.0, 0.0)  # not even the first point
    assert curve.get_last_point_within_delta_t(1.0, 1.0) == (0.5, 2.0)
    assert curve.get_last_point_within_delta_t(1.5, 2.0) == (0.5, 2.0)
    assert curve.get_last_point_within_delta_t(100.0, 0.0) == (0.7, 4.0)  # past the end: the last


def test_curves_come_off_the_wire_per_dataset_and_algorithm_with_missing_ones_as_zero():
    table = {
        "lengths": np.array([2, 1, 0, 3]),
        "timestamps": np.array([1.0, 2.0, 5.0, 1.0, 2.0, 3.0]),
        "scores": np.array([0.1, 0.2, 0.9, 0.3, 0.4, 0.5]),
        "missing": np.array([False, False, True, False]),
    }
    curves = curves_from_wire(table, ["d1", "d2"], ["a", "b"])
    assert list(curves) == ["d1", "d2"] and list(curves["d1"]) == ["a", "b"]
    assert list(curves["d1"]["a"].timestamps) == [1.0, 2.0] and list(curves["d1"]["b"].scores) == [0.9]
    assert (curves["d2"]["a"].timestamps, curves["d2"]["a"].scores) == ([0.0], [0.0])
    assert list(curves["d2"]["b"].scores) == [0.3, 0.4, 0.5]
    curves["d2"]["b"].scores[0] = 1.0  # the agent may write into its curves
    assert table["scores"][3] == 0.3


def test_an_action_goes_out_with_its_algorithm_as_text_and_the_agents_object_stays():
    class Algorithm:
        def __str__(self) -> str:
            return "2"

    chosen = Algorithm()
    sent, kept = wire_action((None, chosen, np.float32(0.5)))
    assert sent == ["action", None, "2", 0.5] and kept is chosen
    assert wire_action((1, 3, "soon"))[0] == ["action", "1", "3", "soon"]  # the evaluator refuses it, by name
    assert wire_action((1, 3, object))[0][3].startswith("<class")


@pytest.mark.parametrize("action", [None, 3, (1, 2), (1, 2, 3, 4)])
def test_an_action_that_is_not_three_things_is_refused_naming_it(action):
    with pytest.raises(ArbiterError, match=r"an action is \(A_star, A, delta_t\)"):
        wire_action(action)


def test_the_observation_holds_the_agents_algorithm_and_numpy_floats_once_something_was_reached():
    chosen = object()
    assert observation_for(chosen, 0.0, 0.0) == (chosen, 0.0, 0.0)
    algorithm, reached, score = observation_for(chosen, 2.0, 0.25)
    assert algorithm is chosen and type(reached) is np.float64 and (reached, score) == (2.0, 0.25)


# -- a real fold process ----------------------------------------------------------------------------

AGENT = textwrap.dedent(
    """
    class Agent:
        def __init__(self, number_of_algorithms):
            self.count = number_of_algorithms
            self.steps = 0

        def meta_train(self, datasets_meta_features, algorithms_meta_features, validation, test):
            self.best = max(validation, key=lambda d: validation[d]["0"].scores[-1])

        def reset(self, dataset_meta_features, algorithms_meta_features):
            self.steps = 0

        def suggest(self, observation):
            if observation is not None and observation[2] < 0:
                raise RuntimeError("a negative score")
            self.steps += 1
            return (None, self.steps % self.count, 0.5 * self.steps)
    """
)


def start_fold(submission):
    """The fold's process as the runner starts it: in the submission's folder, two pipes its own."""
    to_fold_read, to_fold_write = os.pipe()
    from_fold_read, from_fold_write = os.pipe()
    code = "import sys; from arbiter.client.metalc_fold import main; main(sys.argv[1:])"
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(to_fold_read), str(from_fold_write), str(os.getpid())],
        cwd=submission, pass_fds=(to_fold_read, from_fold_write), stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(to_fold_read)
    os.close(from_fold_write)
    return process, to_fold_write, from_fold_read


START = {
    "module": "agent",
    "seeding": {"seed": 1, "numpy": True, "random": True},
    "seed_before_import": False,
    "algorithms": ["0", "1"],
    "algorithms_meta_features": {"0": {}, "1": {}},
}
META_TRAIN = {
    "datasets": ["d1"],
    "datasets_meta_features": {"d1": {}},
    "validation_learning_curves": {
        "lengths": np.array([1, 1]), "timestamps": np.array([1.0, 1.0]), "scores": np.array([0.5, 0.6]),
        "missing": np.array([False, False]),
    },
    "test_learning_curves": {
        "lengths": np.array([1, 1]), "timestamps": np.array([1.0, 1.0]), "scores": np.array([0.5, 0.6]),
        "missing": np.array([False, False]),
    },
}  # fmt: skip


def test_a_fold_answers_its_messages_in_order_and_ends_when_the_runner_closes(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    process, to_fold, from_fold = start_fold(tmp_path)
    try:
        write_frame(to_fold, ["start", START])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == ["imported"]
        write_frame(to_fold, ["meta_train", META_TRAIN])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == ["ready"]
        write_frame(to_fold, ["reset", {"name": "d9"}])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == ["action", None, "1", 0.5]
        write_frame(to_fold, ["observe", 0.5, 0.25])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == ["action", None, "0", 1.0]
        os.close(to_fold)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
        os.close(from_fold)


def test_an_error_of_the_agent_is_reported_with_where_it_happened_and_the_fold_ends(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    process, to_fold, from_fold = start_fold(tmp_path)
    try:
        write_frame(to_fold, ["start", START])
        read_frame(from_fold, FROM_FOLD_LIMITS)
        write_frame(to_fold, ["meta_train", META_TRAIN])
        read_frame(from_fold, FROM_FOLD_LIMITS)
        write_frame(to_fold, ["reset", {}])
        read_frame(from_fold, FROM_FOLD_LIMITS)
        write_frame(to_fold, ["observe", 1.0, -1.0])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == ["error", "RuntimeError in suggest(): a negative score"]
        assert process.wait(timeout=30) == 1
        assert b"Traceback" in process.stderr.read()  # the whole traceback, on the fold's stderr
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
        os.close(to_fold)
        os.close(from_fold)


def test_a_submission_without_an_agent_class_is_reported_at_import(tmp_path):
    (tmp_path / "agent.py").write_text("class Policy:\n    pass\n")
    process, to_fold, from_fold = start_fold(tmp_path)
    try:
        write_frame(to_fold, ["start", START])
        assert read_frame(from_fold, FROM_FOLD_LIMITS) == [
            "error",
            "ArbiterError while importing the agent: agent.py defines no class Agent",
        ]
        assert process.wait(timeout=30) == 1
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
        os.close(to_fold)
        os.close(from_fold)
