"""The evaluator never dies of anything a client sends (docs/design/reliability.md#f5, F6, F7, F14).

Every test runs a real evaluator (in a thread) against the session's redis-server and feeds it
hostile input: malformed and oversized messages, bad actions, absurd client timestamps, unknown
and out-of-order requests. Each asserts that the input was rejected (or neutralised) and
counted, that the evaluation still ends normally, and that its scores are those of a clean run.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import random
import re
import resource
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from harness import finish, play_episode, read_episodes, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException, wire
from arbiter.protocol import codec, keys, messages
from arbiter.protocol.errors import DecodeError, MessageTooLarge
from arbiter.protocol.messages import FLATLAND_RL, REQUEST_TYPES

EPISODES = 3
APPLYING_TYPES = frozenset({FLATLAND_RL.ENV_CREATE, FLATLAND_RL.ENV_STEP, FLATLAND_RL.ENV_SUBMIT})
# What an episode's record must agree on between two runs of the same deterministic agent.
OUTCOME_FIELDS = ("env", "steps", "reward", "normalized_return", "arrived", "timed_out", "timeout", "abandoned")


def outcomes(episodes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(e[field] for field in OUTCOME_FIELDS) for e in episodes]


def new_service_id() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def play_whole_evaluation(client: RemoteClient) -> dict:
    for episode in range(EPISODES):
        observation, _ = client.env_create()
        assert observation is not False, f"episode {episode} was not handed out"
        play_episode(client, episode)
    assert client.env_create() == (False, False)
    return client.submit()


@pytest.fixture(scope="module")
def reference(redis_server, tiny_tests, tmp_path_factory) -> dict[str, Any]:
    """The seeded agent's evaluation with nothing hostile around it: the scores to match."""
    service_id = new_service_id()
    results = str(tmp_path_factory.mktemp("reference"))
    with running_service(
        spec(), tests=tiny_tests, results=results, redis_url=redis_server.url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_server.url, service_id=service_id, reply_timeout_s=10)
        play_whole_evaluation(client)
        client.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    return {"service_id": service_id, "summary": summary, "episodes": read_episodes(results)}


class RawClient:
    """Requests pushed as raw bytes, as any program on the Redis server could push them.

    It sends no session: the evaluator binds it as a legacy (flatland-rl) client."""

    def __init__(self, conn: Any, service_id: str):
        self.conn = conn
        self.service_id = service_id

    def channel(self) -> str:
        return keys.response_key(self.service_id, uuid.uuid4().hex)

    def push(self, type_: Any, payload: Any, channel: str | None = None) -> str:
        channel = channel or self.channel()
        self.conn.lpush(keys.commands_key(self.service_id), codec.encode(messages.request(type_, payload, channel)))
        return channel

    def reply(self, channel: str) -> dict[str, Any]:
        found = self.conn.blpop([channel], timeout=10)
        assert found is not None, f"no reply on {channel}"
        return codec.decode(found[1], codec.REPLY_LIMITS)

    def call(self, type_: Any, payload: Any) -> dict[str, Any]:
        return self.reply(self.push(type_, payload))

    def step(self, action: Any) -> dict[str, Any]:
        return self.call(FLATLAND_RL.ENV_STEP, {"action": action, "inference_time": 0.01, "arbiter": {"reply": True}})


def error_code(reply: dict[str, Any]) -> str | None:
    return reply["payload"]["code"] if reply["type"] == FLATLAND_RL.ERROR else None


# --- F5: ten thousand malformed messages around a legitimate evaluation ------------------------


class _TouchMarker:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def pickle_bomb(marker: str) -> dict[bytes, Any]:
    """msgpack_numpy's object-array map: its decoder hands b'data' to pickle.loads."""
    return {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": pickle.dumps(_TouchMarker(marker))}


class Raw(bytes):
    """Bytes spliced into a hand-built message as they are."""


def holds_raw(obj: Any) -> bool:
    if isinstance(obj, Raw):
        return True
    if isinstance(obj, dict):
        return any(holds_raw(k) or holds_raw(v) for k, v in obj.items())
    return isinstance(obj, list) and any(holds_raw(x) for x in obj)


def pack(obj: Any) -> bytes:
    """msgpack, with ``Raw`` parts inserted verbatim (for invalid UTF-8, ext types, odd headers)."""
    if isinstance(obj, Raw):
        return bytes(obj)
    if not holds_raw(obj):
        return codec.encode(obj)
    assert len(obj) < 16
    if isinstance(obj, dict):
        return bytes([0x80 | len(obj)]) + b"".join(pack(k) + pack(v) for k, v in obj.items())
    return bytes([0x90 | len(obj)]) + b"".join(pack(x) for x in obj)


def raw_str(data: bytes) -> Raw:
    assert len(data) < 32
    return Raw(bytes([0xA0 | len(data)]) + data)


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf", b"type\xfe"]


def padded(size: int) -> bytes:
    """A well-formed ENV_STEP request of exactly ``size`` bytes (the padding sits in its payload)."""
    pad = 0
    for _ in range(10):
        payload = {"action": {0: 2}, "pad": b"\0" * pad}
        data = codec.encode(
            {"type": FLATLAND_RL.ENV_STEP, "payload": payload, "response_channel": "x", "timestamp": 1.0}
        )
        if len(data) == size:
            return data
        pad += size - len(data)
    raise AssertionError(f"cannot pad a request to {size} bytes")


def huge_headers() -> list[bytes]:
    """Small messages whose container/str/bin headers claim billions of elements or bytes."""
    big = struct.pack(">I", 0xFFFFFFFF)
    return [
        b"\xdd" + big + b"\xc0" * 8,  # array 32
        b"\xdf" + big + b"\xc0" * 8,  # map 32
        b"\xdb" + big + b"abc",  # str 32
        b"\xc6" + big + b"abc",  # bin 32
        b"\xc9" + big + b"\x01abc",  # ext 32
        b"\xdc\xff\xff" + b"\xc0" * 100,  # array 16 with too few elements
        b"\xde\xff\xff" + b"\xc0" * 100,  # map 16 with too few elements
        b"\x81\xa4type\xdd" + big,  # a request whose type claims 4 G elements
        b"\x82\xa4type\xa4PING\xa7payload\xdf" + big + b"\xc0",
    ]


def oversized() -> list[bytes]:
    limit = codec.COMMAND_LIMITS.max_bytes
    return [
        padded(limit + 1),
        padded(1 << 20),
        b"\xdd" + struct.pack(">I", 16 << 20) + b"\xc0" * (16 << 20),  # 16 MiB: an array of 16 M nils
    ]


def fuzz_messages(rng: random.Random, service_id: str, other_service_id: str, marker: str) -> list[bytes]:
    """At least 10,000 malformed messages; none is a request the evaluator could apply."""

    def own_channel() -> str:
        return keys.response_key(service_id, f"{rng.getrandbits(128):032x}")

    hostile_channels = [
        keys.response_key(other_service_id, "ab" * 16),  # another service's reply list
        keys.commands_key(service_id),
        keys.errors_key(service_id),
        "*",
        keys.response_key(service_id, "AB" * 16),  # upper-case hex
        keys.response_key(service_id, "ab" * 16) + "\n",
        keys.response_key(service_id, "ab" * 15),
        keys.response_prefix(service_id) + "../" + "ab" * 16,
        12345,
        b"flatland-rl::x::response::" + b"ab" * 16,
        ["a", "b"],
        None,
    ]

    def channel() -> Any:
        return own_channel() if rng.random() < 0.25 else rng.choice(hostile_channels)

    def req(type_: Any, payload: Any, chan: Any = None, **extra: Any) -> dict[str, Any]:
        return {"type": type_, "payload": payload, "response_channel": chan or channel(), "timestamp": 1.5, **extra}

    unknown_types = [
        "FLATLAND_RL.ENV_RESET",
        "FLATLAND_RL.PONG",
        "FLATLAND_RL.ERROR",
        "FLATLAND_RL.ENV_STEP_RESPONSE",
        "flatland_rl.env_step",
        "FLATLAND_RL.ENV_STEP ",
        "",
        "x" * 4000,
        42,
        None,
        True,
        3.5,
        ["FLATLAND_RL.ENV_STEP"],
        {"FLATLAND_RL.ENV_STEP": 1},
        b"FLATLAND_RL.ENV_STEP",
    ]
    valid_templates = [
        messages.request(FLATLAND_RL.ENV_STEP, {"action": {0: 2, 1: 4}, "inference_time": 0.1}, own_channel()),
        messages.request(FLATLAND_RL.ENV_CREATE, {}, own_channel()),
        messages.request(FLATLAND_RL.ENV_SUBMIT, {}, own_channel()),
        messages.request(FLATLAND_RL.PING, {"version": "4.3.0"}, own_channel()),
    ]

    def random_bytes() -> bytes:
        return rng.randbytes(rng.choice([0, 1, 2, 3, rng.randrange(4, 64), rng.randrange(64, 2048)]))

    def truncated() -> bytes:
        data = codec.encode(rng.choice(valid_templates))
        return data[: rng.randrange(0, len(data))]

    def wrong_type() -> bytes:
        return codec.encode(
            rng.choice(
                [
                    rng.randrange(-(2**63), 2**64),
                    [rng.random(), "a", None],
                    "FLATLAND_RL.ENV_STEP",
                    None,
                    True,
                    float("nan"),
                    float("-inf"),
                    b"\x00" * rng.randrange(0, 100),
                    [messages.request(FLATLAND_RL.ENV_STEP, {"action": {0: 2}}, own_channel())],
                    [[[[]]]],
                ]
            )
        )

    def map_without_type() -> bytes:
        return codec.encode(
            rng.choice(
                [
                    {},
                    {"payload": {"action": {0: 2}}, "response_channel": channel()},
                    {"Type": FLATLAND_RL.ENV_STEP, "payload": {}, "response_channel": own_channel()},
                    {b"type": FLATLAND_RL.ENV_STEP, "payload": {}},
                    {1: 2, 3: 4},
                    {None: FLATLAND_RL.ENV_STEP},
                ]
            )
        )

    def unknown_type() -> bytes:
        return codec.encode(req(rng.choice(unknown_types), {"action": {0: 2}}))

    def non_map_payload() -> bytes:
        type_ = rng.choice([FLATLAND_RL.PING, "FLATLAND_RL.NOPE"])
        payload = rng.choice([None, 7, "payload", [1, 2], b"\x00\x01", 2.5, [{"arbiter": {"reply": True}}]])
        return codec.encode(req(type_, payload))

    def deep() -> bytes:
        depth = rng.choice([17, 18, 64, 1000, 30_000])
        kind = rng.randrange(3)
        if kind == 0:
            return b"\x91" * depth + b"\xc0"
        if kind == 1:
            return b"\x81\xa1k" * depth + b"\xc0"
        # a request whose action is nested too deep
        nested = b"\x91" * depth + b"\x02"
        return pack(req(FLATLAND_RL.ENV_STEP, {"action": Raw(nested)}, own_channel()))

    def ext() -> bytes:
        code = rng.randrange(-128, 128)
        return pack(
            rng.choice(
                [
                    msgpack.ExtType(code % 128, rng.randbytes(rng.randrange(0, 20))),
                    msgpack.Timestamp(rng.randrange(0, 2**32)),
                    req(FLATLAND_RL.ENV_STEP, {"action": {0: msgpack.ExtType(1, b"\x02")}}, own_channel()),
                    req(FLATLAND_RL.PING, {"version": msgpack.Timestamp(0)}, own_channel()),
                    req(FLATLAND_RL.ENV_STEP, {"action": {0: 2}}, own_channel(), timestamp=msgpack.Timestamp(1)),
                ]
            )
        )

    def invalid_utf8() -> bytes:
        bad = raw_str(rng.choice(INVALID_UTF8))
        return pack(
            rng.choice(
                [
                    bad,
                    {"type": bad, "payload": {}, "response_channel": own_channel()},
                    {bad: FLATLAND_RL.ENV_STEP, "payload": {"action": {0: 2}}},
                    {"type": FLATLAND_RL.ENV_STEP, "payload": {"action": {0: 2}}, "response_channel": bad},
                    {"type": FLATLAND_RL.ENV_STEP, "payload": {bad: {0: 2}}, "response_channel": own_channel()},
                    {"type": FLATLAND_RL.ENV_STEP, "payload": {"action": {0: bad}}, "response_channel": own_channel()},
                ]
            )
        )

    def bad_numpy() -> bytes:
        bomb = pickle_bomb(marker)
        bad_arrays = [
            bomb,
            {**bomb, b"kind": b""},  # object dtype without the kind flag
            {b"nd": True, b"type": "<i8", b"kind": b"", b"shape": [10**9], b"data": b"\x00" * 8},
            {b"nd": True, b"type": "<i8", b"kind": b"", b"shape": [-1], b"data": b"\x00" * 8},
            {b"nd": True, b"type": "<U4", b"kind": b"", b"shape": [1], b"data": b"\x00" * 16},
            {b"nd": True, b"type": "|V8", b"kind": b"", b"shape": [1], b"data": b"\x00" * 8},
            {b"nd": True, b"type": "<f1", b"kind": b"", b"shape": [1], b"data": b"\x00"},
            {b"nd": False, b"type": "<i8", b"data": b"\x00"},
            {b"nd": True, b"type": "<i8", b"kind": b"", b"shape": [1] * 40, b"data": b"\x00" * 8},
            {"__fraction__": True, "as_str": "(1, 0)"},
            {"__fraction__": True, "as_str": "(" + "9" * 5000 + ", 1)"},
        ]
        where = rng.randrange(4)
        array = rng.choice(bad_arrays)
        if where == 0:
            return codec.encode(req(FLATLAND_RL.ENV_STEP, {"action": {0: array}}, own_channel()))
        if where == 1:
            return codec.encode(req(FLATLAND_RL.ENV_STEP, {"action": array}, own_channel()))
        if where == 2:
            return codec.encode(req(FLATLAND_RL.ENV_STEP, array, own_channel()))
        return codec.encode(array)

    def over_limits() -> bytes:
        return rng.choice(
            [
                codec.encode(req("FLATLAND_RL.NOPE", {"s": "x" * 5000})),  # str longer than 4096
                codec.encode(req("FLATLAND_RL.NOPE", {"a": [None] * 10_001})),  # array longer than 10,000
                codec.encode(req(FLATLAND_RL.PING, {h: 0 for h in range(10_001)})),  # map longer than 10,000
                codec.encode(req("FLATLAND_RL.NOPE", {})) + b"\xc0",  # trailing bytes
                b"\xc1",  # the one never-used msgpack byte
            ]
        )

    def channel_attack() -> bytes:
        type_ = rng.choice(["FLATLAND_RL.NOPE", FLATLAND_RL.PING, FLATLAND_RL.PONG])
        return codec.encode(req(type_, {"version": "4.3.0"}, rng.choice(hostile_channels[:8])))

    def foreign_ping() -> bytes:
        session = rng.choice([uuid.uuid4().hex, "", "s" * 65, 7, None])
        payload = {"version": "4.3.0", "arbiter": {"session": session, "seq": rng.randrange(-5, 2**63)}}
        return codec.encode(req(FLATLAND_RL.PING, payload))

    kinds = [
        (random_bytes, 2000),
        (truncated, 1500),
        (wrong_type, 800),
        (map_without_type, 500),
        (unknown_type, 1000),
        (non_map_payload, 500),
        (deep, 400),
        (ext, 600),
        (invalid_utf8, 600),
        (bad_numpy, 800),
        (over_limits, 300),
        (channel_attack, 600),
        (foreign_ping, 300),
    ]
    found = [make() for make, count in kinds for _ in range(count)]
    found += huge_headers() * 20
    found += [padded(codec.COMMAND_LIMITS.max_bytes + 1)] * 3 + [padded(1 << 20)] * 2
    rng.shuffle(found)
    return found


def classify(data: bytes) -> str:
    """What the evaluator must make of ``data``: bad (undecodable or not a map), unknown, foreign."""
    try:
        message = codec.decode(data, codec.COMMAND_LIMITS)
    except DecodeError:
        return "bad"
    if not isinstance(message, dict):
        return "bad"
    type_ = message.get("type")
    if isinstance(type_, str) and type_ in REQUEST_TYPES:
        # Fuzz must never contain a request that could change the evaluation.
        assert type_ not in APPLYING_TYPES, message
        return "foreign"  # a PING from somebody other than the bound client
    return "unknown"


def test_the_pickle_bomb_is_live(tmp_path):
    """The payload the fuzz test sends does run code in a naive msgpack_numpy decoder."""
    import msgpack_numpy

    marker = tmp_path / "control-marker"
    data = codec.encode({"action": {0: pickle_bomb(str(marker))}})
    msgpack.unpackb(data, object_hook=msgpack_numpy.decode, strict_map_key=False)
    assert marker.exists()
    with pytest.raises(DecodeError, match="unsupported dtype"):
        codec.decode(data)


def test_f5_ten_thousand_malformed_messages_change_nothing(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, reference
):
    marker = tmp_path / "code-ran"
    keys_before = set(redis_conn.keys("*"))  # other tests' leftovers in the shared redis-server
    other_service_id = new_service_id()
    fuzz = fuzz_messages(random.Random(20240605), service_id, other_service_id, str(marker))
    kinds = [classify(data) for data in fuzz]
    expected = {kind: kinds.count(kind) for kind in ("bad", "unknown", "foreign")}
    assert len(fuzz) >= 10_000 and min(expected.values()) > 100
    channels = [
        codec.decode(data).get("response_channel") if kind != "bad" else None
        for data, kind in zip(fuzz, kinds, strict=True)
    ]
    answerable = [c for c in channels if keys.is_valid_response_channel(c, service_id)]
    misdirected = sum(1 for c in channels if c is not None and not keys.is_valid_response_channel(c, service_id))
    assert answerable and misdirected

    results = str(tmp_path / "r")
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=20)
        steps_done: list = []  # play_episode appends one entry per step: the fuzz paces itself on it
        client_done = threading.Event()
        pushed = [0]
        fuzz_error: list[BaseException] = []
        per_step, head_start, chunk = 25, 100, 50

        def fuzzer() -> None:
            try:
                while pushed[0] < len(fuzz):
                    allowed = len(fuzz) if client_done.is_set() else head_start + per_step * len(steps_done)
                    if pushed[0] >= allowed:
                        time.sleep(0.0005)  # wait for the client to make progress
                        continue
                    batch = fuzz[pushed[0] : min(allowed, pushed[0] + chunk)]
                    redis_conn.lpush(keys.commands_key(service_id), *batch)
                    pushed[0] += len(batch)
            except BaseException as exc:  # surfaced below
                fuzz_error.append(exc)

        thread = threading.Thread(target=fuzzer, name="fuzzer", daemon=True)
        thread.start()
        wait_for(lambda: pushed[0] >= head_start, what="the first fuzz messages")
        pushed_at_episode_end: list[int] = []
        for episode in range(EPISODES):
            observation, _ = client.env_create()
            assert observation is not False
            play_episode(client, episode, steps_done)
            pushed_at_episode_end.append(pushed[0])
        client_done.set()
        thread.join(timeout=60)
        assert not thread.is_alive() and not fuzz_error, fuzz_error
        # FIFO: by the time these are answered, every fuzz message has been handled.
        assert client.env_create() == (False, False)
        submitted = client.submit()
        summary = finish(outcome)
        counters = service.evaluation.counters
    rss_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) / 1024
    print(f"\nF5: {len(fuzz)} messages {expected}; counters {dict(counters)}; peak RSS +{rss_growth_mib:.0f} MiB")

    # The fuzz really was interleaved with the client's requests.
    assert 0 < pushed_at_episode_end[0] < len(fuzz)
    assert pushed[0] == len(fuzz)
    # The evaluation is untouched: same scores, same episodes as without the fuzz.
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert submitted["score"] == reference["summary"]["score"]["primary"]
    assert summary["score"] == reference["summary"]["score"]
    assert outcomes(read_episodes(results)) == outcomes(reference["episodes"])
    # No payload code ran.
    assert not marker.exists()
    # Every message was rejected and counted once, under the right heading.
    assert counters["bad_messages"] >= expected["bad"]
    assert counters["unknown_types"] >= expected["unknown"]
    assert counters["foreign_requests"] >= expected["foreign"]
    assert counters["bad_messages"] + counters["unknown_types"] + counters["foreign_requests"] == len(fuzz)
    assert counters["bad_reply_channels"] >= misdirected
    assert counters["invalid_actions"] == 0 and counters["late_steps"] == 0
    # Every request that named a valid reply list of this service got exactly one error reply there.
    for channel in answerable:
        replies = [codec.decode(r, codec.REPLY_LIMITS) for r in redis_conn.lrange(channel, 0, -1)]
        assert [error_code(r) for r in replies] in (["UNKNOWN_TYPE"], ["OTHER_CLIENT"]), (channel, replies)
    # The evaluator wrote nowhere else: not another service's keys, not "*", not its own lists.
    allowed = (f"flatland-rl::{service_id}::", f"flatland-rl::{reference['service_id']}::")
    new_keys = set(redis_conn.keys("*")) - keys_before
    stray = [k for k in new_keys if not k.decode(errors="replace").startswith(allowed)]
    assert stray == []
    assert redis_conn.exists(keys.response_key(other_service_id, "ab" * 16), "*") == 0
    assert redis_conn.llen(keys.errors_key(service_id)) == 0
    assert redis_conn.llen(keys.commands_key(service_id)) == 0
    # Memory stayed bounded (process-wide peak, which includes generating the fuzz itself).
    assert rss_growth_mib < 300, f"peak RSS grew by {rss_growth_mib:.0f} MiB"


# --- F6: oversized messages and huge headers ---------------------------------------------------


def test_f6_oversized_messages_and_huge_headers_are_rejected_fast():
    samples = oversized() + huge_headers()
    assert len(samples[0]) == codec.COMMAND_LIMITS.max_bytes + 1
    assert len(samples[1]) == 1 << 20 and len(samples[2]) > 16 << 20
    durations_ms = []
    for data in samples * math.ceil(200 / len(samples)):
        started = time.perf_counter()
        with pytest.raises(DecodeError) as caught:
            codec.decode(data, codec.COMMAND_LIMITS)
        durations_ms.append((time.perf_counter() - started) * 1000)
        if len(data) > codec.COMMAND_LIMITS.max_bytes:
            assert isinstance(caught.value, MessageTooLarge)
    durations_ms.sort()
    p99 = durations_ms[math.ceil(0.99 * len(durations_ms)) - 1]
    print(f"F6: {len(durations_ms)} rejections, p50 {durations_ms[len(durations_ms) // 2]:.4f} ms, p99 {p99:.4f} ms")
    assert len(durations_ms) >= 200
    assert p99 < 5.0


def test_f6_a_step_right_after_oversized_messages_is_applied(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)
        client.env_create()
        client.env_step(seeded_actions(0, 0, 2))
        assert service.evaluation.current.steps == 1
        junk = oversized() + huge_headers()
        for data in junk:
            redis_conn.lpush(keys.commands_key(service_id), data)
        started = time.monotonic()
        client.env_step(seeded_actions(0, 1, 2))  # confirmed by the evaluator's reply
        step_s = time.monotonic() - started
        assert service.evaluation.current.steps == 2
        assert service.evaluation.counters["bad_messages"] == len(junk)
        assert step_s < 2.0
        step = 2
        while True:  # the episode plays on to its end
            _, _, done, _ = client.env_step(seeded_actions(0, step, 2))
            step += 1
            if done["__all__"]:
                break
        client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert read_episodes(results)[0]["steps"] == step


# --- F7: bad actions ---------------------------------------------------------------------------

# (action sent, invalid entries it holds, what the evaluator must apply instead: DO_NOTHING = 0
# for every agent without a valid entry). Both envs of the tiny set have 2 agents.
DO_NOTHING = {0: 0, 1: 0}
HUGE_ACTION = {h: 2 for h in range(5000)}
BAD_ACTIONS: list[tuple[Any, int, dict[int, int]]] = [
    ({-1: 2}, 1, DO_NOTHING),
    ({2: 2}, 1, DO_NOTHING),
    ({10**12: 2}, 1, DO_NOTHING),
    ({0: None}, 1, DO_NOTHING),
    ({0: "x"}, 1, DO_NOTHING),
    ({0: 2.5}, 1, DO_NOTHING),
    ({0: [1]}, 1, DO_NOTHING),
    ({0: {}}, 1, DO_NOTHING),
    ({0: -1}, 1, DO_NOTHING),
    ({0: 5}, 1, DO_NOTHING),
    ({0: 99}, 1, DO_NOTHING),
    ({0: 2**64 - 1}, 1, DO_NOTHING),
    ({0: -(2**63)}, 1, DO_NOTHING),
    ({0: float("nan")}, 1, DO_NOTHING),
    ({0: float("inf")}, 1, DO_NOTHING),
    ({True: 2}, 0, {1: 2}),  # True == 1: flatland's env.get(1) finds it, so it is agent 1's action
    ({None: 2}, 1, DO_NOTHING),
    ({0: 2, 1: "x"}, 1, {0: 2, 1: 0}),
    ({0: 99, 1: 3}, 1, {0: 0, 1: 3}),
    (HUGE_ACTION, 4998, {0: 2, 1: 2}),
    ([0, 1], 1, DO_NOTHING),
    ("go", 1, DO_NOTHING),
    (3, 1, DO_NOTHING),
    (np.array([2, 2], dtype=np.int64), 1, DO_NOTHING),
]


def play_raw_episode_0(raw: RawClient, service: Any, actions: list[Any]) -> list[dict[str, Any]]:
    """ENV_CREATE, then the given steps (each confirmed), then seeded actions to the episode's end."""
    evaluation = service.evaluation
    assert raw.call(FLATLAND_RL.ENV_CREATE, {})["payload"]["observation"]
    replies = []
    for step, action in enumerate(actions):
        before = evaluation.current.steps
        reply = raw.step(action)
        assert reply["type"] == FLATLAND_RL.ENV_STEP_RESPONSE, reply
        assert reply["payload"]["step"] == step + 1
        assert evaluation.current.steps == before + 1  # applied: exactly one step
        replies.append(reply)
    step = len(actions)
    while True:
        reply = raw.step(seeded_actions(0, step, evaluation.current.num_agents))
        assert reply["type"] == FLATLAND_RL.ENV_STEP_RESPONSE, reply
        step += 1
        if reply["payload"]["done"]:
            return replies


def test_f7_bad_actions_are_dropped_counted_and_never_corrupt_the_env(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    """The documented policy: an invalid entry is dropped and counted, its agent does DO_NOTHING,
    the step still applies. Sent raw, as a legacy client: arbiter's own client binds the
    evaluation to its session, so it cannot send these."""
    huge = codec.encode(messages.request(FLATLAND_RL.ENV_STEP, {"action": HUGE_ACTION}, "x" * 60))
    assert len(huge) < codec.COMMAND_LIMITS.max_bytes  # the huge dict is huge, but a legal message

    runs = {}
    for name, actions in (("bad", [a for a, _, _ in BAD_ACTIONS]), ("clean", [c for _, _, c in BAD_ACTIONS])):
        sid = service_id if name == "bad" else new_service_id()
        results = str(tmp_path / name)
        with running_service(
            spec(step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=sid
        ) as (service, outcome):
            replies = play_raw_episode_0(RawClient(redis_conn, sid), service, actions)
            assert RawClient(redis_conn, sid).call(FLATLAND_RL.ENV_SUBMIT, {})["type"] == (
                FLATLAND_RL.ENV_SUBMIT_RESPONSE
            )
            summary = finish(outcome)
        runs[name] = (summary, read_episodes(results)[0], dict(service.evaluation.counters), replies)

    summary, episode, counters, replies = runs["bad"]
    expected_invalid = sum(n for _, n, _ in BAD_ACTIONS)
    assert summary["state"] == "SUCCESS"
    assert counters["invalid_actions"] == expected_invalid
    assert episode["invalid_actions"] == expected_invalid
    assert [r["payload"]["invalid_actions"] for r in replies] == [n for _, n, _ in BAD_ACTIONS]
    # Dropped entries did exactly what DO_NOTHING does: the episode is the clean run's, step for step.
    clean_summary, clean_episode, clean_counters, _ = runs["clean"]
    assert clean_counters.get("invalid_actions", 0) == 0
    assert outcomes([episode]) == outcomes([clean_episode])
    assert summary["score"] == clean_summary["score"]


def test_f7_a_bool_action_is_read_as_flatlands_env_reads_it_numpys_like_pythons(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    """True equals 1, so flatland's RailEnvActions.from_value reads it as MOVE_LEFT, and a client
    stepping its own copy of the env moves left: so does the evaluator's copy (nothing invalid)."""
    with running_service(
        spec(step_s=5), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ):
        raw = RawClient(redis_conn, service_id)
        raw.call(FLATLAND_RL.ENV_CREATE, {})
        python_bool = raw.step({0: True})["payload"]["invalid_actions"]
        numpy_bool = raw.step({0: np.bool_(True)})["payload"]["invalid_actions"]
    assert python_bool == 0
    assert numpy_bool == 0


# --- F14: absurd or missing client timestamps, a jumping wall clock ------------------------------

ABSURD_TIMESTAMPS = ["missing", 0, -1e18, 1e18, "now", float("nan"), None, float("inf")]


class AbsurdTimestampCodec:
    """The client's codec, rewriting every request's timestamp to the next absurd value."""

    def __init__(self) -> None:
        self.values = itertools.cycle(ABSURD_TIMESTAMPS)
        self.used: list[Any] = []

    def encode(self, message: Any) -> bytes:
        if isinstance(message, dict) and "timestamp" in message:
            value = next(self.values)
            self.used.append(value)
            message = dict(message)
            if value == "missing":
                del message["timestamp"]
            else:
                message["timestamp"] = value
        return codec.encode(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(codec, name)


def sleep_until(instant: float) -> None:
    """The agent's deliberate slowness, on the evaluator's clock (time.monotonic is system-wide)."""
    while (left := instant - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def timeout_scenario(redis_url: str, service_id: str, tests: str, results: str) -> tuple[list[bool], dict]:
    """An agent that is sometimes on time and sometimes not; returns whether each probe timed out."""
    # The planning window opens when the ENV_CREATE reply is ready, before the client has built
    # its env; 1 s keeps that setup from ever using up the window on a loaded machine.
    step_s, planning_s = 0.3, 1.0
    decisions: list[bool] = []
    with running_service(
        spec(step_s=step_s, planning_s=planning_s, max_successive_timeouts=10),
        tests=tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        evaluation = service.evaluation
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10, step_replies=True)

        def probe(episode: int, step: int, factor: float, budget: float) -> None:
            sleep_until(evaluation.wait_started + factor * budget)
            try:
                client.env_step(seeded_actions(episode, step, 2))
                decisions.append(False)
            except TimeoutException:
                decisions.append(True)

        client.env_create()  # episode 0: slow but on time, then a step timeout
        probe(0, 0, 0.5, planning_s)
        for step in range(1, 4):
            client.env_step(seeded_actions(0, step, 2))
        probe(0, 4, 0.5, step_s)
        probe(0, 5, 2.0, step_s)
        client.env_create()  # episode 1: a planning timeout
        probe(1, 0, 2.0, planning_s)
        client.env_create()  # episode 2: played to the end at full speed
        play_episode(client, 2)
        assert client.env_create() == (False, False)
        client.submit()
        summary = finish(outcome)
    return decisions, summary


@pytest.mark.alone  # probes sent at chosen instants, within a 0.3 s budget or past it
def test_f14_absurd_timestamps_and_a_jumping_wall_clock_change_no_decision(
    redis_url, service_id, tiny_tests, tmp_path, monkeypatch
):
    normal_decisions, normal = timeout_scenario(redis_url, new_service_id(), tiny_tests, str(tmp_path / "normal"))
    assert normal_decisions == [False, False, True, True]

    absurd_codec = AbsurdTimestampCodec()
    real_time = time.time
    jumps = itertools.cycle([0.0, 3.2e7, -3.2e7, 3600.0, -86400.0, 1e9])
    with monkeypatch.context() as patch:
        patch.setattr(wire, "codec", absurd_codec)  # where every request of the SDK is encoded
        patch.setattr(time, "time", lambda: real_time() + next(jumps))  # the wall clock jumps, for everyone
        absurd_decisions, absurd = timeout_scenario(redis_url, service_id, tiny_tests, str(tmp_path / "absurd"))

    assert len(absurd_codec.used) >= 2 * len(ABSURD_TIMESTAMPS)  # every absurd value was sent, more than once
    assert absurd_decisions == normal_decisions
    assert absurd["state"] == normal["state"] == "SUCCESS"
    assert absurd["score"] == normal["score"]
    assert absurd["episodes"] == normal["episodes"]
    for counter in ("planning_timeouts", "step_timeouts", "late_steps", "bad_messages"):
        assert absurd["counters"].get(counter, 0) == normal["counters"].get(counter, 0), counter
    assert outcomes(read_episodes(str(tmp_path / "absurd"))) == outcomes(read_episodes(str(tmp_path / "normal")))


def test_f14_budget_decisions_never_read_the_wall_clock():
    """Source check: the modules that decide budgets use time.monotonic only."""
    import arbiter.server.core.budgets
    import arbiter.server.core.endings
    import arbiter.server.core.evaluation
    import arbiter.server.core.gate
    import arbiter.server.service.loop
    import arbiter.server.service.transport

    wall_clock = re.compile(r"\btime\.time\s*\(|from\s+time\s+import\s+[^\n]*\btime\b|\btime\.time_ns\b")
    for module in (
        arbiter.server.core.budgets,
        arbiter.server.core.gate,
        arbiter.server.core.evaluation,
        arbiter.server.core.endings,
        arbiter.server.service.loop,
        arbiter.server.service.transport,
    ):
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert not wall_clock.search(source), f"{module.__name__} reads the wall clock"
        assert not re.search(r"[\"']timestamp[\"']", source), f"{module.__name__} reads the client's timestamp"


# --- unknown and out-of-order requests ----------------------------------------------------------


def test_unknown_and_out_of_order_requests_get_error_replies_and_the_evaluation_completes(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path, reference
):
    results = str(tmp_path / "r")
    unknown = ["FLATLAND_RL.ENV_RESET", FLATLAND_RL.PONG, FLATLAND_RL.ERROR, "", 7, None]
    with running_service(
        spec(step_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        evaluation = service.evaluation
        raw = RawClient(redis_conn, service_id)
        codes: list[str | None] = []

        def ask_unknown() -> None:
            for type_ in unknown:
                codes.append(error_code(raw.call(type_, {"action": {0: 2}})))

        def step_out_of_order() -> None:
            codes.append(error_code(raw.step({0: 2, 1: 2})))

        ask_unknown()
        step_out_of_order()  # before any ENV_CREATE
        for episode in range(EPISODES):
            assert raw.call(FLATLAND_RL.ENV_CREATE, {})["payload"]["observation"]
            step = 0
            while True:
                if step == 3:
                    before = evaluation.current.steps
                    ask_unknown()  # mid-episode: answered, and nothing is applied
                    assert evaluation.current.steps == before
                reply = raw.step(seeded_actions(episode, step, evaluation.current.num_agents))
                assert reply["type"] == FLATLAND_RL.ENV_STEP_RESPONSE
                step += 1
                if reply["payload"]["done"]:
                    break
            step_out_of_order()  # between episodes
        assert raw.call(FLATLAND_RL.ENV_CREATE, {})["payload"]["observation"] is False
        step_out_of_order()  # after the last episode
        submitted = raw.call(FLATLAND_RL.ENV_SUBMIT, {})
        summary = finish(outcome)

    n_unknown = len(unknown) * (1 + EPISODES)
    assert codes.count("UNKNOWN_TYPE") == n_unknown
    assert codes.count("OUT_OF_ORDER") == 2 + EPISODES
    assert len(codes) == n_unknown + 2 + EPISODES
    assert summary["state"] == "SUCCESS"
    assert summary["counters"]["errors_unknown_type"] == n_unknown
    assert summary["counters"]["errors_out_of_order"] == 2 + EPISODES
    assert submitted["type"] == FLATLAND_RL.ENV_SUBMIT_RESPONSE
    # The same seeded agent, so the same scores as the clean reference run.
    assert summary["score"] == reference["summary"]["score"]
    assert outcomes(read_episodes(results)) == outcomes(reference["episodes"])
    assert os.path.exists(os.path.join(results, "summary.json"))
