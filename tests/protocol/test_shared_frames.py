"""protocol/shared_frames.py and its use by the evaluator and RemoteEnv: large observation arrays
through shared memory for a client on the evaluator's machine, through Redis for any other, the
same observations either way, each as it came for as long as the agent holds it; the segment's
path is gone once the client mapped it, and no other process can shrink or grow it (which would
crash the evaluator). The agent's slots are in test_frame_leases.py."""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import redis
from harness import finish, running_service, sealed_memory_files, wait_for

pytest.importorskip("diambra.arena", reason="the DIAMBRA extra is not installed")

from arbiter.client import remote_env  # noqa: E402
from arbiter.client.remote_env import RemoteEnv  # noqa: E402
from arbiter.protocol import codec  # noqa: E402
from arbiter.protocol.errors import ArbiterError, TimeoutException  # noqa: E402
from arbiter.protocol.shared_frames import (  # noqa: E402
    LARGE_ARRAY_BYTES,
    PLACEHOLDER_KEY,
    SharedFramesReader,
    SharedFramesWriter,
)
from arbiter.server.core.competition import load_competition, spec_from_dict  # noqa: E402

pytestmark = pytest.mark.skipif(not sealed_memory_files(), reason="no sealed memory files (memfd) here")

STEPS = 12
NATIVE = ["game=doapp", "difficulty=easy", "episodes=1", "frame_shape=[0, 0, 0]", "seed=9"]


def observation(k: int) -> dict[str, Any]:
    return {
        "frame": np.full((480, 512, 3), k, dtype=np.uint8),
        "depth": np.arange(128 * 128, dtype=np.float32).reshape(128, 128) * k,
        "P1": {"health": np.array([k], dtype=np.int16), "side": 1},
        "stack": [np.zeros(3), "text"],
    }


def is_segment(path: str) -> bool:
    """``path`` (``/proc/<pid>/fd/<n>``) still opens an arbiter segment (the descriptor number may
    since name another file of the evaluator's process)."""
    try:
        return "memfd:arbiter-frames" in os.readlink(path)
    except OSError:
        return False


def on_the_wire(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` as the client reads it: encoded by the evaluator, decoded by the client."""
    return codec.decode(codec.encode(reply), codec.REPLY_LIMITS)


def assert_same(restored: Any, original: Any) -> None:
    if isinstance(original, np.ndarray):
        assert isinstance(restored, np.ndarray) and restored.dtype == original.dtype
        assert np.array_equal(restored, original) and restored.flags.writeable
    elif isinstance(original, dict):
        assert restored.keys() == original.keys()
        for key in original:
            assert_same(restored[key], original[key])
    elif isinstance(original, list):
        assert len(restored) == len(original)
        for a, b in zip(restored, original, strict=True):
            assert_same(a, b)
    else:
        assert restored == original


def test_large_arrays_go_through_the_segment_and_come_back_equal():
    writer = SharedFramesWriter(480 * 512 * 3 + 128 * 128 * 4)
    path = writer.offer()["path"]
    reader = SharedFramesReader(writer.offer())
    try:
        first = writer.share({"observation": observation(1), "reward": 1.0})
        assert set(first["observation"]["frame"]) == {PLACEHOLDER_KEY, "dtype", "shape"}
        assert PLACEHOLDER_KEY in first["observation"]["depth"]
        assert isinstance(first["observation"]["P1"]["health"], np.ndarray)  # small: inline
        second = writer.share({"observation": observation(2)})  # the other slot
        assert second["observation"]["frame"][PLACEHOLDER_KEY] != first["observation"]["frame"][PLACEHOLDER_KEY]
        assert_same(reader.restore(on_the_wire(first)["observation"]), observation(1))  # still intact
        assert_same(reader.restore(on_the_wire(second)["observation"]), observation(2))
        third = writer.share({"observation": observation(3)})  # first's slot again
        assert third["observation"]["frame"][PLACEHOLDER_KEY] == first["observation"]["frame"][PLACEHOLDER_KEY]
        assert_same(reader.restore(on_the_wire(third)["observation"]), observation(3))
        small = {"observation": {"x": np.zeros(LARGE_ARRAY_BYTES // 8 - 1)}}
        assert writer.share(small) is small
    finally:
        reader.close()
        writer.close()
    assert not is_segment(path)  # closing closes the descriptor its path names


HOSTILE = """
import json, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)  # the same user may open it for writing ...
attempts = {"shrink": lambda: os.ftruncate(fd, 0), "grow": lambda: os.ftruncate(fd, 1 << 30)}
refused = {}
for name, attempt in attempts.items():  # ... but not resize it
    try:
        attempt()
        refused[name] = None
    except OSError as exc:
        refused[name] = exc.errno
scribble = mmap.mmap(fd, os.fstat(fd).st_size)  # what it writes reaches only what agents read
scribble[64:] = b"x" * (len(scribble) - 64)
print(json.dumps(refused))
"""


def test_another_process_can_write_but_not_resize_the_segment_and_the_evaluator_writes_on():
    # A file of the evaluator's user that an agent could shrink would make the evaluator's next
    # write into its mapping a SIGBUS: the segment is sealed against it. Writes are the agent's
    # own business: the evaluator never reads the segment.
    writer = SharedFramesWriter(480 * 512 * 3)
    try:
        offer = writer.offer()
        done = subprocess.run([sys.executable, "-c", HOSTILE, offer["path"]], capture_output=True, text=True,
                              timeout=30, check=True)  # fmt: skip
        refused = json.loads(done.stdout)
        assert refused == {"shrink": 1, "grow": 1}, refused  # EPERM
        reader = SharedFramesReader(offer)
        try:
            for k in (7, 8, 9):  # the evaluator writes on unharmed, into each slot in turn
                slot = reader.ask()
                shared = writer.share({"observation": observation(k)}, slot)
                assert_same(reader.restore(shared["observation"]), observation(k))
            assert os.stat(offer["path"]).st_size == offer["size"]  # neither shrunk nor grown
        finally:
            reader.close()
    finally:
        writer.close()


def test_the_reader_refuses_a_file_that_is_not_the_segment_offered(tmp_path):
    writer = SharedFramesWriter(LARGE_ARRAY_BYTES)
    try:
        offer = writer.offer()
        with pytest.raises(ArbiterError, match="token differs"):
            SharedFramesReader({**offer, "token": "00" * 16})
        with pytest.raises(ArbiterError, match="size differs"):
            SharedFramesReader({**offer, "size": offer["size"] + 1})
        with pytest.raises(FileNotFoundError):
            SharedFramesReader({**offer, "path": str(tmp_path / "missing")})
        with pytest.raises(ArbiterError, match="malformed"):
            SharedFramesReader({"path": 5})
        reader = SharedFramesReader(offer)
        with pytest.raises(ArbiterError, match="outside its segment"):
            reader.restore({PLACEHOLDER_KEY: [offer["size"] - 8, 64], "dtype": "|u1", "shape": [64]})
        reader.close()
        reading, writing = os.pipe()  # a descriptor number reused by a pipe: refused, not waited on
        os.close(writing)
        try:
            with pytest.raises(ArbiterError, match="not a regular file"):
                SharedFramesReader({**offer, "path": f"/proc/{os.getpid()}/fd/{reading}"})
        finally:
            os.close(reading)
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)  # a FIFO with no writer: a blocking open would wait forever
        with pytest.raises(ArbiterError, match="not a regular file"):
            SharedFramesReader({**offer, "path": str(fifo)})
        other = tmp_path / "other"
        other.write_bytes(b"\0" * offer["size"])  # right size, no token: another file
        with pytest.raises(ArbiterError, match="token differs"):
            SharedFramesReader({**offer, "path": str(other)})
        writer.claimed()
        assert not is_segment(offer["path"])
    finally:
        writer.close()


def redis_bytes_out(redis_conn: redis.Redis) -> int:
    return int(redis_conn.info("stats")["total_net_output_bytes"])


def play_native(redis_url, redis_conn, service_id, tmp_path, **env_kwargs) -> tuple[RemoteEnv, int, str | None]:
    """Five steps of a native-frame DIAMBRA episode, each observation checked against the
    evaluator's own; returns the env (closed), Redis's output bytes per step and the offer's path."""
    competition = load_competition("diambra", NATIVE)
    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, **env_kwargs)
        offer = env.server_info.get("frames")
        observation, _ = env.reset()
        env.closed_after_reset = offer is not None and not is_segment(offer["path"])
        before = redis_bytes_out(redis_conn)
        held = []  # more observations than the segment has slots: the last ones are copies
        for _ in range(STEPS):
            assert env.observation_space.contains(observation)
            assert observation["frame"].shape == (480, 512, 3) and observation["frame"].flags.writeable
            observation, *_ = env.step(env.action_space.sample())
            evaluators = service.evaluation.current.last_step[0]  # it waits for the next step
            assert_same(observation, evaluators)
            held.append((observation, copy.deepcopy(evaluators)))
        per_step = (redis_bytes_out(redis_conn) - before) // STEPS
        for observation, evaluators in held:  # each as it came, for as long as it was held
            assert_same(observation, evaluators)
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    return env, per_step, offer["path"] if offer else None


def test_a_local_client_gets_native_frames_through_shared_memory(redis_url, redis_conn, service_id, tmp_path):
    env, per_step, path = play_native(redis_url, redis_conn, service_id, tmp_path)
    assert path is not None and path.startswith("/proc/")
    assert per_step < 20_000  # the 737,280-byte frame did not go through Redis
    assert env.closed_after_reset  # closed once the client had it mapped, mid-evaluation


def test_a_client_that_cannot_map_the_segment_gets_frames_through_redis(
    redis_url, redis_conn, service_id, tmp_path, monkeypatch
):
    def out_of_reach(offer: Any) -> None:
        raise FileNotFoundError(offer["path"])  # what an agent in another container meets

    monkeypatch.setattr(remote_env, "SharedFramesReader", out_of_reach)
    env, per_step, path = play_native(redis_url, redis_conn, service_id, tmp_path)
    assert env.frames is None and path is not None
    assert per_step > 480 * 512 * 3  # every reply carried its frame
    assert not is_segment(path)  # the evaluator closed the unclaimed segment at the end


def test_an_evaluator_that_cannot_make_a_segment_sends_frames_through_redis(
    redis_url, redis_conn, service_id, tmp_path, monkeypatch
):
    def refused(*_args: Any) -> int:
        raise OSError(38, "Function not implemented")  # a seccomp profile that denies memfd_create

    monkeypatch.setattr(os, "memfd_create", refused)
    env, per_step, path = play_native(redis_url, redis_conn, service_id, tmp_path)
    assert path is None and env.frames is None  # no offer: the client asked, the evaluator declined
    assert per_step > 480 * 512 * 3


def test_shared_frames_off_asks_for_no_segment(redis_url, redis_conn, service_id, tmp_path, monkeypatch):
    monkeypatch.setenv("ARBITER_SHARED_FRAMES", "0")
    env, per_step, path = play_native(redis_url, redis_conn, service_id, tmp_path)
    assert path is None and env.frames is None and per_step > 480 * 512 * 3


def test_no_segment_for_small_observations(redis_url, service_id, tmp_path):
    spec = spec_from_dict(
        "small",
        {"format": "two-phase", "seed": 3, "env_id": "CartPole-v1", "num_episodes": 1, "phase": 1,
         "budgets": {"step_s": 5.0, "planning_s": 5.0, "idle_s": 10.0, "overall_s": 300.0}},
    )  # fmt: skip
    with running_service(spec, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        assert "frames" not in env.server_info and env.frames is None and service.frames.writer is None
        env.close()
        service.request_stop("test over")
        finish(outcome)


def test_a_timed_out_steps_slot_is_named_again_once_a_later_reply_comes(redis_url, service_id, tmp_path):
    # The step sent after a step timeout is refused: its reply is an error, so its slot is named
    # again only once a later request has had its reply, and every observation after it is right.
    competition = load_competition("diambra", [*NATIVE[:2], "episodes=2", *NATIVE[3:], "budgets.step_s=0.3"])
    with running_service(competition, tests=None, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id) as (service, outcome):  # fmt: skip
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        frames = env.frames
        assert frames is not None and frames.leasing
        env.reset()
        env.step(env.action_space.sample())  # then the agent stalls past its step budget
        wait_for(lambda: service.evaluation.counters["step_timeouts"] == 1, timeout_s=5, what="the step timeout")
        with pytest.raises(TimeoutException):
            env.step(env.action_space.sample())
        refused = frames._asked
        assert refused is not None and refused not in frames._free
        observation, _ = env.reset()  # the next episode: a reply, so the refused step's slot is free again
        assert refused in frames._free
        assert_same(observation, service.evaluation.current.observation)
        held = [observation]
        for _ in range(3):
            observation, *_ = env.step(env.action_space.sample())
            assert_same(observation, service.evaluation.current.last_step[0])
            held.append(observation)
        assert len(frames._free) == frames.slots - 1 - len(held)  # one slot each, none lost
        del held, observation
        gc.collect()
        assert len(frames._free) == frames.slots - 2  # but the copy slot and the env's last observation
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
