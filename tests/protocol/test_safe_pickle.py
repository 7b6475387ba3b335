"""The restricted unpickler alone (protocol/safe_pickle.py, through codec.decode_request).

What flatland's legacy client pickles decodes to the same plain data msgpack would carry; every
hostile pickle is refused with a DecodeError and runs no code; the control tests show that the
hostile payloads are live under an unrestricted unpickler, so their refusal means something.
"""

from __future__ import annotations

import io
import math
import pickle
import subprocess
import sys
import time
import tracemalloc
from fractions import Fraction
from pathlib import Path
from typing import Any

import hostile_pickles as hp
import numpy as np
import paths
import pytest
from flatland.core.grid.grid4 import Grid4TransitionsEnum
from flatland.envs.rail_env_action import RailEnvActions
from flatland.envs.step_utils.states import TrainState
from harness import wait_for

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError, MessageTooLarge
from arbiter.protocol.legacy import safe_pickle
from arbiter.protocol.messages import FLATLAND_RL

HERE = str(paths.SUPPORT)
PROTOCOLS = (2, 3, 4, 5)
PLAIN_DTYPES = ["?", "i1", "u1", "<i2", ">i2", "<u4", "<i8", ">i8", "<u8", "<f2", "<f4", ">f8", "<c8", "<c16"]
LIMITS = codec.COMMAND_LIMITS


def decode(data: bytes) -> Any:
    message, wire = codec.decode_request(data)
    assert wire == codec.PICKLE
    return message


def assert_plain(value: Any, depth: int = 0) -> None:
    """Only the types a request may hold: what the unpickler builds is never anything else."""
    assert depth <= LIMITS.max_depth
    if isinstance(value, dict):
        for k, v in value.items():
            assert_plain(k, depth + 1)
            assert_plain(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for x in value:
            assert_plain(x, depth + 1)
    elif isinstance(value, (np.ndarray, np.generic)):
        assert value.dtype.kind in "biufc"
    else:
        assert type(value) in (str, bytes, int, float, bool, type(None), Fraction), type(value)


# --- what legitimate clients send ----------------------------------------------------------------


def legacy_step(action: dict) -> dict[str, Any]:
    """An ENV_STEP as FlatlandRemoteClient builds it before pickle.dumps."""
    return {
        "type": FLATLAND_RL.ENV_STEP,
        "payload": {"action": action, "inference_time": 0.0123},
        "response_channel": "flatland-rl::T12345::response::" + "ab" * 16,
        "timestamp": 1718000000.25,
    }


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_legacy_clients_requests_decode_to_plain_data(protocol):
    members = {h: RailEnvActions(h) for h in range(5)}
    message = decode(pickle.dumps(legacy_step(members), protocol=protocol))
    assert message == legacy_step({0: 0, 1: 1, 2: 2, 3: 3, 4: 4})
    assert all(type(v) is int for v in message["payload"]["action"].values())
    ping = {"type": FLATLAND_RL.PING, "payload": {"version": "4.3.0"}, "response_channel": "c", "timestamp": 1.0}
    assert decode(pickle.dumps(ping, protocol=protocol)) == ping


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_numpy_arrays_and_scalars_of_every_plain_dtype_round_trip(protocol):
    rng = np.random.default_rng(7)
    values = {}
    for dtype in PLAIN_DTYPES:
        values[f"a{dtype}"] = (rng.random((3, 4)) * 100).astype(dtype)
        values[f"s{dtype}"] = np.array(5, dtype=dtype)[()]
    values["fortran"] = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    values["strided"] = np.arange(20, dtype=np.int16)[::3]
    values["zero-d"] = np.array(3.5)
    values["empty"] = np.zeros((0, 5), dtype=np.uint8)
    values["keys"] = {np.int64(1): np.float32(2.5), np.uint8(3): np.bool_(False)}
    decoded = decode(pickle.dumps(values, protocol=protocol))
    assert decoded.keys() == values.keys()
    for key, value in values.items():
        if key == "keys":
            assert decoded[key] == value
            continue
        assert type(decoded[key]) is type(value), key
        assert decoded[key].dtype == value.dtype and decoded[key].shape == value.shape, key
        assert np.array_equal(decoded[key], value), key
    assert_plain(decoded)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_python_values_round_trip(protocol):
    value = {
        "none": None,
        "bools": [True, False],
        "ints": [0, -1, 255, 256, 2**31, -(2**63), 2**64 - 1],
        "floats": [0.5, -1e300, float("inf")],
        "text": "é ☃ \U0001f682",
        "bytes": [b"", b"\x00\xff", b"x" * 300],
        "tuple": (1, (2, "3")),
        "fractions": [Fraction(1, 4), Fraction(-7, 3)],
        "nested": {1: {2.5: [{"k": None}]}},
    }
    decoded = decode(pickle.dumps(value, protocol=protocol))
    assert decoded == value
    assert math.isinf(decoded["floats"][2])
    assert_plain(decoded)


def test_flatland_enums_decode_to_their_values_from_old_and_new_modules():
    assert decode(pickle.dumps([Grid4TransitionsEnum.WEST, TrainState.DONE, RailEnvActions.STOP_MOVING])) == [3, 6, 4]
    # flatland-rl before 4 defined RailEnvActions in flatland.envs.rail_env
    old = hp.framed(hp.glob("flatland.envs.rail_env", "RailEnvActions", "GLOBAL") + hp.tup(hp.integer(2)) + b"R", 2)
    assert decode(old) == 2
    with pytest.raises(DecodeError, match="RailEnvActions with unsupported arguments"):
        decode(hp.framed(hp.glob("flatland.envs.rail_env_action", "RailEnvActions") + hp.tup(hp.integer(5)) + b"R"))


def test_a_pickle_and_a_msgpack_message_are_told_apart_by_their_first_two_bytes():
    request = legacy_step({0: 2})
    assert codec.decode_request(codec.encode(request)) == (request, codec.MSGPACK)
    assert codec.decode_request(pickle.dumps(request)) == (request, codec.PICKLE)
    # msgpack's empty map is 0x80 alone; 0x80 followed by anything can only be a pickle
    assert codec.decode_request(b"\x80") == ({}, codec.MSGPACK)
    for data in (b"\x80\x04", b"\x80\x00.", b"\x80\x06N.", b"\x80\x80"):
        assert safe_pickle.is_pickle(data)
        with pytest.raises(DecodeError, match="pickle"):
            codec.decode_request(data)
    with pytest.raises(DecodeError, match="trailing data"):  # protocol 0 starts like a msgpack fixint
        codec.decode_request(pickle.dumps(request, protocol=0))


# --- limits: the same bounds as a msgpack request -------------------------------------------------


def nested_lists(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("fits", "too_big"),
    [
        (nested_lists(LIMITS.max_depth), nested_lists(LIMITS.max_depth + 1)),
        ([0] * LIMITS.max_container_len, [0] * (LIMITS.max_container_len + 1)),
        ("s" * LIMITS.max_str_len, "s" * (LIMITS.max_str_len + 1)),
        (2**64 - 1, 2**64),
        (-(2**63), -(2**63) - 1),
    ],
    ids=["depth", "container", "string", "int-high", "int-low"],
)
def test_bounds_match_the_msgpack_codecs(fits, too_big):
    assert decode(pickle.dumps(fits)) == fits
    assert codec.decode(codec.encode(fits)) == fits
    with pytest.raises(DecodeError):
        decode(pickle.dumps(too_big))
    with pytest.raises(DecodeError):
        codec.decode(codec.encode(too_big))


def test_a_value_referenced_many_times_counts_every_time():
    shared = "x" * 1000
    assert decode(pickle.dumps([shared] * 60)) == [shared] * 60  # 60 kB spelt out: a msgpack message could
    with pytest.raises(DecodeError, match="spelt out"):
        decode(pickle.dumps([shared] * 70))  # 70 kB: more than any request
    array = np.zeros(1000, dtype=np.int64)
    with pytest.raises(DecodeError, match="spelt out"):
        decode(pickle.dumps([array] * 9))
    with pytest.raises(DecodeError, match="values once spelt out"):
        decode(pickle.dumps([[0] * 9000] * 8))


def test_oversized_pickles_are_refused_before_any_opcode_is_read():
    data = pickle.dumps({"pad": b"\0" * LIMITS.max_bytes})
    with pytest.raises(MessageTooLarge):
        codec.decode_request(data)


@pytest.mark.parametrize(
    "opcode", ["BINUNICODE", "BINUNICODE8", "BINBYTES", "BINBYTES8", "BYTEARRAY8", "LONG4", "FRAME", "LONG_BINPUT"]
)
def test_huge_declared_lengths_and_memo_indices_are_refused_by_the_scan(opcode):
    code = bytes([safe_pickle._OP[opcode]])
    width = 8 if opcode.endswith("8") or opcode == "FRAME" else 4
    for claimed in (2**31 - 1, 2**32 - 1) + ((2**63,) if width == 8 else ()):
        data = b"\x80\x04N" + code + claimed.to_bytes(width, "little") + b"abc."
        with pytest.raises(DecodeError) as refused:
            safe_pickle.scan(data)
        assert "beyond" in str(refused.value) or "runs past" in str(refused.value) or "claims" in str(refused.value)


def test_the_memo_index_check_is_what_keeps_the_unpickler_from_allocating():
    """The unpickler sizes its memo by the largest index it is given: 2**22 costs it ~64 MiB."""
    data = b"\x80\x04Nr" + (2**22).to_bytes(4, "little") + b"."
    with pytest.raises(DecodeError, match="memo index"):
        codec.decode_request(data)
    tracemalloc.start()
    try:
        safe_pickle._Unpickler(io.BytesIO(data)).load()  # without the scan
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= 32 << 20, "without the scan, the memo index costs the unpickler its memory"


# --- hostile pickles --------------------------------------------------------------------------------


@pytest.fixture
def extensions():
    """Extension codes registered and cached, as a process that ever loaded them would have them."""
    hp.register_extensions()
    try:
        yield
    finally:
        hp.unregister_extensions()


def test_every_hand_written_hostile_pickle_is_refused_and_runs_nothing(tmp_path, extensions):
    markers = tmp_path / "markers"
    markers.mkdir()
    payloads = list(hp.hand_written("t-unit", markers))
    kinds = {kind.split(":")[0] for kind, _ in payloads}
    assert len(payloads) > 2000 and {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "EXT", "BUILD"} <= kinds
    accepted = []
    for kind, data in payloads:
        try:
            decoded = codec.decode_request(data)
        except DecodeError:
            continue
        accepted.append((kind, decoded))
    assert accepted == []
    assert list(markers.iterdir()) == [] and hp.CODE_RAN == []


def test_the_fuzz_corpus_is_refused_or_decodes_to_plain_data(tmp_path, extensions):
    """Thousands of pickles, with mutants; what the unpickler does accept is plain data. Prints
    the rejection figures on docs/design/performance.md#reliability-figures."""
    markers = tmp_path / "markers"
    markers.mkdir()
    corpus = hp.corpus("t-unit", markers)
    assert len(corpus) > 5000
    durations_us, accepted = [], 0
    for kind, data in corpus:
        started = time.perf_counter()
        try:
            message, _ = codec.decode_request(data)
        except DecodeError:
            durations_us.append((time.perf_counter() - started) * 1e6)
            continue
        accepted += 1
        assert kind in ("mutant", "truncated"), kind
        assert_plain(message)
    durations_us.sort()
    p50, p99 = durations_us[len(durations_us) // 2], durations_us[math.ceil(0.99 * len(durations_us)) - 1]
    print(
        f"\npickle fuzz: {len(corpus)} pickles, {len(durations_us)} refused, {accepted} decoded to plain data; "
        f"rejection p50 {p50:.1f} us, p99 {p99:.1f} us, max {durations_us[-1]:.0f} us"
    )
    assert len(durations_us) > 0.95 * len(corpus)
    assert list(markers.iterdir()) == [] and hp.CODE_RAN == []


CONTROL_SCRIPT = """
import pickle, sys, time
sys.path.insert(0, {here!r})
import hostile_pickles as hp
hp.register_extensions()
for path in sys.argv[1:]:
    try:
        pickle.loads(open(path, "rb").read())
    except Exception:
        pass
"""


def test_the_hostile_payloads_are_live_under_a_plain_unpickler(tmp_path):
    """The control: in a separate interpreter, pickle.loads runs every payload's code."""
    markers = tmp_path / "markers"
    markers.mkdir()
    live = hp.live_payloads(markers)
    assert len(live) >= 40
    paths = []
    for n, (_, data) in enumerate(live):
        path = tmp_path / f"payload{n}.pkl"
        path.write_bytes(data)
        paths.append(str(path))
    script = CONTROL_SCRIPT.format(here=HERE)
    subprocess.run([sys.executable, "-c", script, *paths], check=True, timeout=120, cwd=tmp_path)
    # Popen's child may still be touching its file: every payload leaves exactly one marker.
    wait_for(lambda: len(list(markers.iterdir())) == len(live), what="a marker from every live payload")


def test_an_extension_code_reaches_a_cached_global_without_find_class(tmp_path, extensions):
    """Why the scan refuses EXT opcodes: once an extension was loaded anywhere in the process,
    the unpickler hands it out from its cache and never asks find_class."""
    marker = tmp_path / "ext-ran"
    payload = hp.framed(hp.invoke("EXT", "hostile_pickles", "record_code_ran", [hp.text(str(marker))]))
    with pytest.raises(DecodeError, match="EXT2 is not accepted"):
        codec.decode_request(payload)
    assert not marker.exists()
    safe_pickle._Unpickler(io.BytesIO(payload)).load()  # find_class alone: the code runs
    assert marker.exists() and hp.CODE_RAN == [str(marker)]
    hp.CODE_RAN.clear()


def test_a_refused_build_leaves_the_accepted_constructors_intact():
    attack = hp.framed(
        hp.glob("numpy", "dtype") + hp.tup(b"N", hp.dct(hp.text("_build"), hp.glob("_codecs", "encode"))) + b"b"
    )
    with pytest.raises(DecodeError, match="BUILD on numpy dtype"):
        codec.decode_request(attack)
    assert np.array_equal(decode(pickle.dumps({"dtype": np.arange(3)}))["dtype"], np.arange(3))


# --- replies ----------------------------------------------------------------------------------------


def test_pickled_replies_hold_only_what_msgpack_replies_hold():
    reply = {
        "type": FLATLAND_RL.ENV_CREATE_RESPONSE,
        "payload": {
            "observation": {0: np.arange(4.0)},
            "info": {"action_required": {0: np.True_}},
            "random_seed": 1001,
            "arbiter": {"speed": Fraction(1, 3), "action": RailEnvActions.MOVE_LEFT, "tags": ("a", "b")},
        },
    }
    data = codec.encode(reply, wire=codec.PICKLE)
    assert safe_pickle.is_pickle(data)
    loaded = pickle.loads(data)
    assert loaded["payload"]["arbiter"]["action"] == 1 and type(loaded["payload"]["arbiter"]["action"]) is int
    assert np.array_equal(loaded["payload"]["observation"][0], np.arange(4.0))
    assert loaded["payload"]["arbiter"]["speed"] == Fraction(1, 3) and loaded["payload"]["random_seed"] == 1001
    for unsupported in (print, object(), np.array([None], dtype=object), np.save, Path("."), type):
        with pytest.raises(DecodeError, match="cannot encode"):
            codec.encode({"x": unsupported}, wire=codec.PICKLE)
