"""client/metalc_fold.py: one fold of a MetaLC agent in a process of its own.

The frames are checked over real pipes, the curves and actions as the agent gets and gives them,
and a real fold process (started as the runner starts it, in a submission folder of its own) is
driven through its messages in order, its requests taken from a real redis-server and answered
here as the evaluator would. The runner around it, against a real evaluator, is in
tests/formats/metalc/test_metalc_runner.py."""

from __future__ import annotations

import contextlib
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
from arbiter.client.wire import Wire
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import ArbiterError, MessageTooLarge
from arbiter.protocol.messages import EXTENSION_KEY


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


class RunningFold:
    """A fold's process as the runner starts it (in the submission's folder, two pipes its own):
    ``to_fold`` and ``from_fold`` are the runner's ends."""

    def __init__(self, submission):
        to_fold_read, self.to_fold = os.pipe()
        self.from_fold, from_fold_write = os.pipe()
        code = "import sys; from arbiter.client.metalc_fold import main; main(sys.argv[1:])"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(to_fold_read), str(from_fold_write), str(os.getpid())],
            cwd=submission, pass_fds=(to_fold_read, from_fold_write), stderr=subprocess.PIPE,
        )  # fmt: skip
        os.close(to_fold_read)
        os.close(from_fold_write)
        self._open = [self.to_fold, self.from_fold]

    def send(self, message) -> None:
        write_frame(self.to_fold, message)

    def answer(self):
        return read_frame(self.from_fold, FROM_FOLD_LIMITS)

    def close_input(self) -> None:
        """What the runner does at a fold's end: the fold reads the end of its pipe."""
        self._open.remove(self.to_fold)
        os.close(self.to_fold)

    def end(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stderr.close()
        for fd in self._open:
            os.close(fd)


@contextlib.contextmanager
def fold_of(folder, agent_source: str = "", *, imported: bool = True):
    """``agent_source`` as ``folder``'s agent.py (unless empty), its fold's process started and,
    with ``imported``, past its start message."""
    if agent_source:
        (folder / "agent.py").write_text(agent_source)
    fold = RunningFold(folder)
    try:
        if imported:
            fold.send(["start", START])
            assert fold.answer() == ["imported"]
        yield fold
    finally:
        fold.end()


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


def dataset_body(last_of_fold: bool, meta_train: bool = True) -> dict:
    """A dataset's ENV_CREATE payload as the evaluator sends it."""
    ext = {"run": 0, "fold": 2, "dataset": "d9", "last_of_fold": last_of_fold}
    if meta_train:
        ext["meta_train"] = META_TRAIN
    return {"observation": None, "info": {"dataset_meta_features": {"name": "d9"}}, EXTENSION_KEY: ext}


def session_of(redis_url: str, service_id: str, seq: int = 7) -> dict:
    """A runner's session as it hands it over, after ``seq`` requests of its own."""
    wire = Wire(redis_url, service_id, reply_timeout_s=0.3, resend_after_s=0.1)
    wire.resend_all, wire._seq = True, seq
    handed = wire.hand_over()
    wire.close()
    return handed


def take_request(redis_conn, service_id: str) -> dict:
    """The next request the evaluator would take (the fold's process sends them on its own)."""
    _, raw = redis_conn.brpop([keys.commands_key(service_id)], timeout=10)
    return codec.decode(raw, codec.COMMAND_LIMITS)


def answer(redis_conn, request: dict, payload: dict) -> None:
    reply = {"type": f"{request['type']}_RESPONSE", "payload": payload}
    redis_conn.rpush(request["response_channel"], codec.encode(reply))


def test_a_fold_plays_on_the_runners_session_and_hands_it_back_with_how_far_it_went(
    tmp_path, redis_url, redis_conn, service_id
):
    session = session_of(redis_url, service_id)
    with fold_of(tmp_path, AGENT) as fold:
        fold.send(["play", {"session": session, "body": dataset_body(last_of_fold=False)}])
        # meta-trained, reset, and the first suggest sent as a step from the fold's own connection,
        # numbered on from the runner's requests and asking for the next dataset (not the fold's last)
        first = take_request(redis_conn, service_id)
        payload = first["payload"]
        assert payload["action"] == [None, "1", 0.5]
        assert payload[EXTENSION_KEY] == {"reply": True, "next": True, "session": session["session"], "seq": 8}
        answer(redis_conn, first, {"done": False, "observation": ["1", 0.5, 0.25]})
        second = take_request(redis_conn, service_id)
        assert second["payload"]["action"] == [None, "0", 1.0] and second["payload"][EXTENSION_KEY]["seq"] == 9
        # the ending step brings the fold's last dataset, whose steps do not ask for the next
        brought = dataset_body(last_of_fold=True, meta_train=False)
        answer(redis_conn, second, {"done": True, "observation": ["0", 1.0, 0.5], EXTENSION_KEY: {"next": brought}})
        third = take_request(redis_conn, service_id)
        assert third["payload"]["action"] == [None, "1", 0.5]
        assert third["payload"][EXTENSION_KEY]["next"] is False and third["payload"][EXTENSION_KEY]["seq"] == 10
        answer(redis_conn, third, {"done": True, "observation": ["1", 0.5, 0.25]})
        kind, told = fold.answer()
        assert kind == "played" and told["seq"] == 10 and told["datasets"] == 2 and told["timeouts"] == []
        counts = {name: row["count"] for name, row in told["round_trips"].items()}
        assert counts == {"step": 1, "first": 0, "closing": 1, "last": 1, "suggest": 1}
        assert all(len(row["samples"]) == row["count"] and row["total_s"] > 0 or row["count"] == 0
                   for row in told["round_trips"].values())  # fmt: skip
        fold.close_input()
        assert fold.process.wait(timeout=30) == 0


def test_without_the_evaluators_word_on_the_folds_last_dataset_no_step_asks_for_the_next(
    tmp_path, redis_url, redis_conn, service_id
):
    body = dataset_body(last_of_fold=False)
    del body[EXTENSION_KEY]["last_of_fold"]  # an evaluator from before it said so
    with fold_of(tmp_path, AGENT) as fold:
        fold.send(["play", {"session": session_of(redis_url, service_id), "body": body}])
        request = take_request(redis_conn, service_id)
        assert request["payload"][EXTENSION_KEY]["next"] is False
        answer(redis_conn, request, {"done": True, "observation": ["1", 0.5, 0.25]})
        kind, told = fold.answer()
        assert kind == "played" and told["datasets"] == 1 and told["round_trips"]["last"]["count"] == 1


def test_an_evaluator_that_does_not_answer_is_told_to_the_runner_with_the_session_as_far_as_it_went(
    tmp_path, redis_url, redis_conn, service_id
):
    with fold_of(tmp_path, AGENT) as fold:
        fold.send(["play", {"session": session_of(redis_url, service_id), "body": dataset_body(True)}])
        kind, told = fold.answer()
        assert kind == "refused" and told["kind"] == "ServerUnavailable" and told["seq"] == 8
        assert "no reply to FLATLAND_RL.ENV_STEP" in told["message"]
        # sent, and sent again under the same number while no reply came
        sent = [
            codec.decode(raw, codec.COMMAND_LIMITS) for raw in redis_conn.lrange(keys.commands_key(service_id), 0, -1)
        ]
        assert sent and {request["payload"][EXTENSION_KEY]["seq"] for request in sent} == {8}


def test_an_error_of_the_agent_is_reported_with_where_it_happened_and_the_fold_ends(
    tmp_path, redis_url, redis_conn, service_id
):
    with fold_of(tmp_path, AGENT) as fold:
        fold.send(["play", {"session": session_of(redis_url, service_id), "body": dataset_body(False)}])
        answer(redis_conn, take_request(redis_conn, service_id), {"done": False, "observation": ["1", 1.0, -1.0]})
        assert fold.answer() == ["error", "RuntimeError in suggest(): a negative score"]
        assert fold.process.wait(timeout=30) == 1
        assert b"Traceback" in fold.process.stderr.read()  # the whole traceback, on the fold's stderr


def test_a_submission_without_an_agent_class_is_reported_at_import(tmp_path):
    with fold_of(tmp_path, "class Policy:\n    pass\n", imported=False) as fold:
        fold.send(["start", START])
        assert fold.answer() == ["error", "ArbiterError while importing the agent: agent.py defines no class Agent"]
        assert fold.process.wait(timeout=30) == 1
