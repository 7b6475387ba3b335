"""Tests for arbiter.protocol.codec: round trips, legacy (msgpack_numpy) interop, and hostile input.

flatland-rl monkey-patches the msgpack module when ``flatland.envs.persistence`` (or its evaluator
client/service) is imported: ``msgpack_numpy.patch()`` swaps ``msgpack.packb/unpackb/Packer/Unpacker``
for msgpack_numpy's, whose decoder runs before any ``object_hook`` and unpickles object arrays.
Most tests here pin the codec's own behaviour on msgpack as shipped (the ``_unpatched_msgpack``
fixture restores it for this module); the tests under "msgpack as flatland leaves it" show what
happens in a process that has imported flatland, such as arbiter's evaluator.
"""

from __future__ import annotations

import math
import pickle
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import flatland.envs.persistence  # noqa: F401  (patches msgpack: imported at collection, not midway)
import msgpack
import msgpack_numpy
import numpy as np
import pytest
from flatland.evaluators.service import msgpack_custom_decode, msgpack_custom_encode  # patches msgpack too
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError, MessageTooLarge

try:
    from msgpack import _cmsgpack as _msgpack_impl
except ImportError:  # pure-Python msgpack
    from msgpack import fallback as _msgpack_impl  # type: ignore[no-redef]


def _pristine_packb(o, **kwargs):
    return _msgpack_impl.Packer(**kwargs).pack(o)


# What msgpack_numpy.patch() replaces, as msgpack ships it and as flatland leaves it.
_PATCHED_NAMES = ("Packer", "Unpacker", "packb", "unpackb", "dumps", "loads")
_PRISTINE = {
    "Packer": _msgpack_impl.Packer,
    "Unpacker": _msgpack_impl.Unpacker,
    "packb": _pristine_packb,
    "unpackb": _msgpack_impl.unpackb,
    "dumps": _pristine_packb,
    "loads": _msgpack_impl.unpackb,
}
_AS_FLATLAND_LEAVES_IT = {name: getattr(msgpack, name) for name in _PATCHED_NAMES}


@pytest.fixture(autouse=True, scope="module")
def _unpatched_msgpack() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _PRISTINE.items():
            mp.setattr(msgpack, name, value)
        yield


@pytest.fixture
def flatland_patched_msgpack(monkeypatch: pytest.MonkeyPatch) -> None:
    """msgpack as it is in any process that imported flatland.envs.persistence."""
    for name, value in _AS_FLATLAND_LEAVES_IT.items():
        monkeypatch.setattr(msgpack, name, value)
    assert msgpack.unpackb is msgpack_numpy.unpackb and msgpack.Packer is msgpack_numpy.Packer


CMD = codec.COMMAND_LIMITS
REPLY = codec.REPLY_LIMITS


def _roundtrip(value, limits=REPLY):
    return codec.decode(codec.encode(value), limits)


def _nd_map(dtype_str, shape, data, kind=b""):
    """A numpy array map exactly as msgpack_numpy lays it out."""
    return {b"nd": True, b"type": dtype_str, b"kind": kind, b"shape": shape, b"data": data}


def _raw(obj) -> bytes:
    """Plain msgpack bytes (no arbiter or numpy hooks): lets tests hand-craft hostile payloads."""
    return msgpack.packb(obj, use_bin_type=True)


def _nested_lists(levels: int) -> bytes:
    """``levels`` nested arrays, the innermost one empty: [[...[]...]]."""
    return b"\x91" * (levels - 1) + b"\x90"


def _nested_maps(levels: int) -> bytes:
    """``levels`` nested maps {0: {0: ... {}}}, the innermost one empty."""
    return b"\x81\x00" * (levels - 1) + b"\x80"


# --- round trips ------------------------------------------------------------------------------


def test_nested_plain_values_roundtrip():
    value = {
        "type": "FLATLAND_RL.ENV_STEP",
        "payload": {"action": {0: 2, 1: 4, 17: 0}, "inference_time": 0.125, "arbiter": {"reply": True}},
        "nested": [[1, [2, [3, None]]], {"t": True, "f": False}, b"\x00\xffbytes", -(2**63), 2**64 - 1],
        "floats": [0.0, -1.5, 1e300, float("inf"), float("-inf")],
        3: "int key at top level",
        -1: {2: {3: []}},
    }
    out = _roundtrip(value)
    assert out == value
    assert isinstance(out["nested"][2], bytes)
    assert out["payload"]["action"] == {0: 2, 1: 4, 17: 0}
    assert all(isinstance(k, int) for k in out["payload"]["action"])


def test_bytes_and_str_stay_distinct():
    out = _roundtrip({"s": "abc", "b": b"abc"})
    assert type(out["s"]) is str and type(out["b"]) is bytes


def test_nan_roundtrips_as_nan():
    out = _roundtrip([float("nan")])
    assert math.isnan(out[0])


DTYPES = [
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
    np.complex64,
    np.complex128,
    np.dtype(">i4"),
    np.dtype(">f8"),
]
SHAPES = [(), (1,), (7,), (2, 3, 4), (0,), (3, 0, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numpy_array_roundtrip(dtype, shape):
    rng = np.random.default_rng(0)
    size = math.prod(shape)
    raw = rng.integers(0, 100, size=size)
    arr = (raw % 2 == 0) if np.dtype(dtype).kind == "b" else raw.astype(dtype)
    if np.dtype(dtype).kind == "c":
        arr = arr + 1j * arr[::-1]
    arr = np.asarray(arr, dtype=dtype).reshape(shape)
    out = _roundtrip({"a": arr}, CMD)["a"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable  # a copy, not a view of the message buffer


def test_numpy_non_contiguous_arrays_roundtrip():
    base = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    for arr in (base.T, base[:, ::2, 1:], np.asfortranarray(base)):
        out = _roundtrip(arr)
        assert out.shape == arr.shape and out.dtype == arr.dtype
        np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "scalar",
    [
        np.int8(-5),
        np.int16(300),
        np.int32(-70000),
        np.int64(-(2**62)),
        np.uint8(255),
        np.uint64(2**64 - 1),
        np.float16(0.5),
        np.float32(1.25),
        np.bool_(True),
        np.bool_(False),
        np.complex64(1 - 2j),
        np.complex128(3 + 4j),
    ],
    ids=repr,
)
def test_numpy_scalar_roundtrip(scalar):
    out = _roundtrip({"x": scalar}, CMD)["x"]
    assert type(out) is type(scalar)
    assert out == scalar


def test_numpy_float64_scalar_arrives_as_equal_python_float():
    # np.float64 subclasses float, so msgpack packs it natively (msgpack_numpy behaves the same).
    out = _roundtrip(np.float64(2.75))
    assert out == 2.75 and isinstance(out, float)


@pytest.mark.parametrize("frac", [Fraction(1, 4), Fraction(-3, 7), Fraction(0), Fraction(5), Fraction(10**20, 3)])
def test_fraction_roundtrip(frac):
    out = _roundtrip({"speed": frac}, CMD)["speed"]
    assert type(out) is Fraction and out == frac


def test_sets_and_enums_encode_as_plain_values():
    import enum

    class Color(enum.IntEnum):
        RED = 3

    assert _roundtrip({"c": Color.RED, "s": {1, 2}}) == {"c": 3, "s": [1, 2]}


# --- interop with legacy flatland peers (msgpack patched with msgpack_numpy) ------------------------


LEGACY_VALUES = {
    "grid": np.arange(24, dtype=np.uint16).reshape(4, 6),
    "obs": {0: np.linspace(0, 1, 5, dtype=np.float32), 1: np.zeros((2, 0, 3), dtype=np.int64)},
    "flags": np.array([True, False, True]),
    "c": np.array([1 + 2j, 3j], dtype=np.complex64),
    "scalar": np.int32(7),
    "zero_d": np.array(3.5),
}


def _assert_same(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    else:
        assert a == b and type(a) is type(b)


def test_decodes_msgpack_numpy_encoded_messages():
    legacy = msgpack.packb(LEGACY_VALUES, default=msgpack_numpy.encode, use_bin_type=True)
    _assert_same(LEGACY_VALUES, codec.decode(legacy, REPLY))


def test_msgpack_numpy_decodes_our_messages():
    ours = codec.encode(LEGACY_VALUES)
    back = msgpack.unpackb(ours, object_hook=msgpack_numpy.decode, strict_map_key=False)
    _assert_same(LEGACY_VALUES, back)


def test_interop_with_flatland_service_hooks():
    """flatland-rl's own service hooks (msgpack_numpy + fractions), both directions."""
    value = {"info": {"speed": {0: Fraction(1, 4), 1: Fraction(1, 3)}}, "obs": np.eye(3, dtype=np.int8)}
    legacy = msgpack.packb(value, default=msgpack_custom_encode, use_bin_type=True)
    _assert_same(value, codec.decode(legacy, REPLY))
    back = msgpack.unpackb(codec.encode(value), object_hook=msgpack_custom_decode, strict_map_key=False)
    _assert_same(value, back)


def test_legacy_fraction_form_decodes():
    assert codec.decode(_raw({"__fraction__": True, "as_str": "(1, 4)"})) == Fraction(1, 4)
    assert codec.decode(_raw({"s": {"__fraction__": True, "as_str": "(-2, 6)"}})) == {"s": Fraction(-1, 3)}


def test_maps_without_fraction_marker_untouched():
    assert codec.decode(_raw({"__fraction__": False, "as_str": "x"})) == {"__fraction__": False, "as_str": "x"}


# --- rejections -------------------------------------------------------------------------------


def _rejects(data, limits=CMD) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        codec.decode(data, limits)
    assert isinstance(info.value, DecodeError)
    return info.value


class _TouchOnUnpickle:
    """Unpickling this runs ``Path.touch(marker)``: a stand-in for arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _object_array_payload(marker: Path) -> bytes:
    return _raw({"action": _nd_map("|O", [1], pickle.dumps(_TouchOnUnpickle(marker)), kind=b"O")})


def test_object_array_pickle_payload_is_live_for_msgpack_numpy(tmp_path):
    """Control: the payload used below really does run code in a legacy (msgpack_numpy) decoder."""
    marker = tmp_path / "legacy-ran-code"
    msgpack.unpackb(_object_array_payload(marker), object_hook=msgpack_numpy.decode, strict_map_key=False)
    assert marker.exists()


@pytest.mark.parametrize("limits", [CMD, REPLY], ids=["command", "reply"])
def test_object_array_pickle_payload_rejected_without_running_code(tmp_path, limits):
    marker = tmp_path / "code-ran"
    _rejects(_object_array_payload(marker), limits)
    assert not marker.exists()


def test_object_dtype_with_empty_kind_rejected(tmp_path):
    marker = tmp_path / "code-ran"
    _rejects(_raw(_nd_map("|O", [1], pickle.dumps(_TouchOnUnpickle(marker)))))
    assert not marker.exists()


def test_plain_dtype_with_object_kind_rejected():
    _rejects(_raw(_nd_map("<i8", [1], b"\x00" * 8, kind=b"O")))


def test_structured_dtype_rejected():
    arr = np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8")])
    legacy = msgpack.packb({"a": arr}, default=msgpack_numpy.encode, use_bin_type=True)
    _rejects(legacy)
    _rejects(_raw(_nd_map("|V12", [2], b"\x00" * 24, kind=b"V")))
    _rejects(_raw(_nd_map("|V12", [2], b"\x00" * 24)))


@pytest.mark.parametrize(
    "dtype_str,data",
    [
        ("O", b"\x00" * 8),
        ("|O", b"\x00" * 8),
        ("<U3", b"\x00" * 12),
        ("S5", b"\x00" * 5),
        ("M8[s]", b"\x00" * 8),
        ("<m8[s]", b"\x00" * 8),
        ("|V8", b"\x00" * 8),
        ("<i3", b"\x00" * 3),
        ("<i0", b""),
        ("<i8 ", b"\x00" * 8),
        ("", b""),
        (b"\xff\xfe", b"\x00"),
    ],
)
def test_non_plain_dtype_strings_rejected(dtype_str, data):
    _rejects(_raw(_nd_map(dtype_str, [1], data)))
    _rejects(_raw({b"nd": False, b"type": dtype_str, b"data": data}))


def test_non_string_dtype_rejected():
    _rejects(_raw(_nd_map(7, [1], b"\x00")))
    _rejects(_raw(_nd_map([["x", "<i4"]], [1], b"\x00" * 4)))
    _rejects(_raw({b"nd": True, b"shape": [1], b"data": b"\x00"}))


@pytest.mark.parametrize("shape,data", [([3], b"\x00" * 8), ([2, 2], b"\x00" * 12), ([], b""), ([0], b"\x00" * 4)])
def test_data_length_must_match_shape(shape, data):
    _rejects(_raw(_nd_map("<i4", shape, data)))


@pytest.mark.parametrize(
    "shape",
    [[-1], [2, -2], [2**40], [2**63], [2**64 - 1], [2**32, 2**32], [1.5], ["2"], None, 3, [1] * 33, [None]],
    ids=repr,
)
def test_bad_shapes_rejected(shape):
    _rejects(_raw(_nd_map("<i4", shape, b"\x00" * 4)))


def test_numpy_payload_data_must_be_bytes():
    _rejects(_raw(_nd_map("<i4", [1], "abcd")))
    _rejects(_raw(_nd_map("<i4", [1], None)))
    _rejects(_raw({b"nd": False, b"type": "<i4", b"data": [1, 2, 3, 4]}))


@pytest.mark.parametrize("data", [b"", b"\x00" * 3, b"\x00" * 5])
def test_numpy_scalar_of_wrong_size_rejected(data):
    _rejects(_raw({b"nd": False, b"type": "<i4", b"data": data}))


def test_message_at_limit_accepted_one_byte_over_rejected():
    def message_of(size: int) -> bytes:
        # bin16 header (3 bytes) for payloads < 64 KiB; the limit is 64 KiB
        data = _raw(b"x" * (size - 3))
        assert len(data) == size
        return data

    assert codec.decode(message_of(CMD.max_bytes)) == b"x" * (CMD.max_bytes - 3)
    err = _rejects(message_of(CMD.max_bytes + 1))
    assert isinstance(err, MessageTooLarge)


def test_16_mib_adversarial_message_rejected_fast():
    header = b"\xdd\xff\xff\xff\xff"  # array32 claiming 2**32-1 elements
    data = header * (16 * 2**20 // len(header)) + b"\x00"
    assert len(data) > 16 * 2**20 - 10
    start = time.perf_counter()
    with pytest.raises(MessageTooLarge):
        codec.decode(data)
    assert time.perf_counter() - start < 0.05
    start = time.perf_counter()
    with pytest.raises(MessageTooLarge):
        codec.decode(bytearray(data))
    assert time.perf_counter() - start < 0.05


@pytest.mark.parametrize("limits", [CMD, REPLY], ids=["command", "reply"])
@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff",
        b"\xdf\xff\xff\xff\xff",
        b"\x91\xdd\xff\xff\xff\xff",
        b"\x81\x00\xdf\xff\xff\xff\xff",
        b"\xdd\xff\xff\xff\xff" + b"\x00" * 64,
    ],
    ids=["array32", "map32", "nested-array32", "nested-map32", "array32-with-some-data"],
)
def test_huge_container_headers_rejected(data, limits):
    start = time.perf_counter()
    _rejects(data, limits)
    assert time.perf_counter() - start < 0.05


def test_container_over_max_len_rejected():
    _rejects(_raw(list(range(CMD.max_container_len + 1))))
    _rejects(_raw({i: 0 for i in range(CMD.max_container_len + 1)}))
    assert len(codec.decode(_raw(list(range(CMD.max_container_len))))) == CMD.max_container_len


def test_string_over_max_len_rejected():
    _rejects(_raw("x" * (CMD.max_str_len + 1)))
    assert codec.decode(_raw("x" * CMD.max_str_len)) == "x" * CMD.max_str_len


@pytest.mark.parametrize("build", [_nested_lists, _nested_maps], ids=["lists", "maps"])
def test_depth_limit_boundary(build):
    assert codec.decode(build(CMD.max_depth)) is not None
    _rejects(build(CMD.max_depth + 1))
    _rejects(build(CMD.max_depth + 1), CMD)
    assert codec.decode(build(CMD.max_depth + 1), REPLY) is not None


@pytest.mark.parametrize("levels", [2000, 60_000], ids=["2000", "60000"])
def test_nesting_beyond_msgpack_stack_rejected(levels):
    _rejects(_nested_lists(levels))
    _rejects(_nested_maps(levels // 2))
    _rejects(_nested_lists(levels), REPLY)


@pytest.mark.parametrize(
    "data",
    [
        _raw(msgpack.ExtType(5, b"abc")),
        _raw(msgpack.ExtType(1, b"")),
        b"\xd6\xff\x00\x00\x00\x01",
        _raw(msgpack.Timestamp(1, 0)),
        _raw({"payload": [msgpack.ExtType(42, b"x" * 100)]}),
    ],
    ids=["ext5", "empty-ext", "raw-timestamp", "timestamp", "nested-ext"],
)
def test_ext_types_rejected(data):
    _rejects(data)
    _rejects(data, REPLY)


@pytest.mark.parametrize(
    "data",
    [b"\xa2\xff\xfe", b"\xa3a\xc3\x28", b"\xd9\x02\xed\xa0", b"\x81\xa2\xc0\x80\x01", b"\x91\xa1\x80"],
    ids=["ff-fe", "bad-continuation", "surrogate", "bad-key", "nested"],
)
def test_invalid_utf8_rejected(data):
    _rejects(data)


def test_truncated_messages_rejected():
    message = codec.encode(
        {"type": "FLATLAND_RL.ENV_STEP", "payload": {"action": {0: 1, 1: 2}, "obs": np.arange(10)}, "t": 1.5}
    )
    for cut in range(len(message)):
        _rejects(message[:cut])


def test_trailing_garbage_rejected():
    _rejects(_raw({"a": 1}) + b"\x00")
    _rejects(_raw(1) + _raw(2))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\xc1\x00"], ids=["empty", "reserved", "reserved-plus"])
def test_empty_and_reserved_bytes_rejected(data):
    _rejects(data)
    with pytest.raises(DecodeError) as refused:
        codec.decode_request(data, codec.COMMAND_LIMITS)
    assert not str(refused.value).endswith(": ")  # the error says something, even where msgpack does not


@pytest.mark.parametrize("data", ["\x80", "", 0, 5, None, 1.5, [0x80], {"a": 1}], ids=repr)
def test_non_bytes_input_rejected(data):
    _rejects(data)


def test_bytes_like_inputs_accepted():
    data = _raw({"a": [1, 2]})
    assert codec.decode(bytearray(data)) == {"a": [1, 2]}
    assert codec.decode(memoryview(data)) == {"a": [1, 2]}


@pytest.mark.parametrize(
    "as_str",
    [
        "(1, 0)",
        "(0, 0)",
        "import os",
        "(1,2,3)",
        "(1, 4",
        "1/4",
        "",
        "(1.5, 2)",
        "(__import__('os'), 1)",
        "(" + "9" * 5000 + ", 1)",
        "(1, 4)x",
        14,
        None,
        ["1", "4"],
    ],
    ids=lambda v: repr(v)[:20],
)
def test_bad_fraction_strings_rejected(as_str):
    _rejects(_raw({"__fraction__": True, "as_str": as_str}))
    _rejects(_raw({"__fraction__": True, "as_str": as_str}), REPLY)


def test_fraction_without_as_str_rejected():
    _rejects(_raw({"__fraction__": True}))


@pytest.mark.parametrize(
    "value",
    [
        object(),
        np.array([object()], dtype=object),
        np.array(["a"]),
        np.array([b"ab"]),
        np.array([1], dtype="M8[s]"),
        np.datetime64("2020-01-01"),
        np.zeros(1, dtype=[("x", "<i4")]),
        2**64,
        -(2**63) - 1,
        1 + 2j,
        {"k": [object()]},
    ],
    ids=lambda v: type(v).__name__ + (f"[{v.dtype}]" if isinstance(v, np.ndarray) else ""),
)
def test_encode_unsupported_raises_decode_error(value):
    with pytest.raises(DecodeError):
        codec.encode(value)


# --- msgpack as flatland leaves it (any process that imported flatland.envs.persistence) ---------

# Regression: flatland.envs.persistence runs msgpack_numpy.patch() on import, which swaps
# msgpack.unpackb/packb for pickle-capable versions; the codec must not go through them.


def test_evaluator_process_rejects_object_array_payload_without_running_code(tmp_path):
    """The evaluator's own import graph, in a fresh interpreter: the 131-byte RCE of docs/design/wire.md."""
    marker = tmp_path / "code-ran"
    message = tmp_path / "message.bin"
    message.write_bytes(_object_array_payload(marker))
    script = (
        "import sys\n"
        "import arbiter.server.service.loop\n"
        "from arbiter.protocol import codec\n"
        "from arbiter.protocol.errors import DecodeError\n"
        "try:\n"
        "    codec.decode(open(sys.argv[1], 'rb').read())\n"
        "except DecodeError:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(message)], capture_output=True, timeout=60)
    assert proc.returncode in (0, 3), proc.stderr.decode(errors="replace")
    assert not marker.exists(), "the pickle inside the message ran in the evaluator process"
    assert proc.returncode == 0, "the message was accepted"


def _outcome(data: bytes) -> object:
    try:
        return codec.decode(data)
    except DecodeError:
        return "rejected"


def test_object_array_payload_rejected_with_flatland_patched_msgpack(tmp_path, flatland_patched_msgpack):
    marker = tmp_path / "code-ran"
    outcome = _outcome(_object_array_payload(marker))
    assert not marker.exists(), "the pickle inside the message ran"
    assert outcome == "rejected"


@pytest.mark.parametrize(
    "payload",
    [
        _nd_map([["x", "<i4"], ["y", "<f8"]], [2], b"\x00" * 24, kind=b"V"),
        _nd_map("<M8[s]", [1], b"\x00" * 8),
        _nd_map("<U3", [1], b"\x00" * 12),
        _nd_map("<i4", [1], b"\x00" * 8),
    ],
    ids=["structured", "datetime", "unicode", "data-longer-than-shape"],
)
def test_non_plain_arrays_rejected_with_flatland_patched_msgpack(payload, flatland_patched_msgpack):
    assert _outcome(_raw({"a": payload})) == "rejected"


def test_encode_refuses_object_arrays_with_flatland_patched_msgpack(flatland_patched_msgpack):
    with pytest.raises(DecodeError):
        codec.encode({"a": np.array([object()], dtype=object)})


# --- known weakness: nesting is checked only after the whole message is built ----------------------


def test_nested_container_claims_rejected_with_bounded_memory():
    data = b"\xdc\x27\x10" * 1000  # array16 of 10,000 elements, nested 1000 deep, no elements given
    assert len(data) == 3000
    tracemalloc.start()
    try:
        _rejects(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"decoding a {len(data)}-byte command peaked at {peak / 2**20:.0f} MiB"


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_decode_error(data):
    for limits in (CMD, REPLY):
        try:
            codec.decode(data, limits)
        except DecodeError:
            pass


_garbage_chunks = st.lists(
    st.sampled_from(
        [
            b"\x91",
            b"\x81",
            b"\xdd\xff\xff\xff\xff",
            b"\xdc\x27\x10",
            b"\xc4\x03",
            b"\xa3",
            b"\xc1",
            b"\xd4\x01",
            b"\x00",
            b"\xc3",
            b"\xcb",
            struct.pack(">d", 1.0),
            b"\xc4\x02nd",
            b"\xa4type",
            b"\xa3|O",
            b"\x82\xac__fraction__\xc3\xa6as_str",
            b"\x85",
            b"\xc4\x05shape",
            b"\xc4\x04data",
            b"\xc4\x04kind",
        ]
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_garbage_chunks)
def test_structured_garbage_decodes_or_raises_decode_error(chunks):
    data = b"".join(chunks)
    try:
        codec.decode(data, CMD)
    except DecodeError:
        pass


def _decided(data: bytes) -> object:
    try:
        return ("decoded", codec.decode(data, CMD))
    except DecodeError:
        return "refused"


@settings(max_examples=500, deadline=None)
@given(_garbage_chunks)
def test_a_message_too_shallow_for_the_walk_is_decided_as_the_walk_decides(chunks):
    """decode skips the structure walk for a message with no more possible container headers than
    the nesting limit: msgpack, bounded by the message's size, must then decide as the walk would."""
    data = b"".join(chunks)
    skipped = _decided(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "_may_nest_deeper_than", lambda data, max_depth: True)
        walked = _decided(data)
    assert repr(skipped) == repr(walked)  # repr: NaN payloads compare equal too


def test_header_like_bytes_in_data_take_the_walk_and_still_decode():
    message = {"payload": {"blob": bytes(range(0x80, 0xA0)) * 4, "n": [0xDC, 0xDD]}}
    data = codec.encode(message)
    assert codec._may_nest_deeper_than(data, CMD.max_depth)
    assert codec.decode(data, CMD) == message
    shallow = codec.encode({"type": "FLATLAND_RL.ENV_STEP", "payload": {"action": 1}})
    assert not codec._may_nest_deeper_than(shallow, CMD.max_depth)


_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# "__fraction__": True is the legacy Fraction marker, so such a map is not plain data by design.
_keys = st.one_of(st.text(max_size=20).filter(lambda s: s != "__fraction__"), _int64)
_json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), _int64, st.floats(allow_nan=False), st.text(), st.binary()),
    lambda children: st.one_of(st.lists(children, max_size=6), st.dictionaries(_keys, children, max_size=6)),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_json_like)
def test_json_like_values_roundtrip(value):
    out = codec.decode(codec.encode(value), REPLY)
    assert out == value
    assert _types(out) == _types(value)


def _types(value):
    """The value's shape with types (so True vs 1 and b'' vs '' differences are caught)."""
    if isinstance(value, list):
        return [_types(v) for v in value]
    if isinstance(value, dict):
        return {(type(k), k): _types(v) for k, v in value.items()}
    return type(value)


def test_a_large_array_encodes_to_the_same_bytes_as_a_small_ones_layout():
    """Arrays from 4 KiB on travel as a view of their memory: the message is byte for byte the
    msgpack_numpy layout that ``tobytes`` gives, non-contiguous arrays included."""
    import msgpack
    import numpy as np

    frame = np.arange(480 * 512 * 3, dtype=np.uint32).reshape(480, 512, 3)[:, ::2, :]  # not contiguous
    for array in (frame, frame.astype(np.uint8), np.zeros((0, 3), dtype=np.float32), np.ones(2000, dtype=np.int16)):
        layout = {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape),
                  b"data": np.ascontiguousarray(array).tobytes()}  # fmt: skip
        assert codec.encode({"a": array}) == msgpack.packb({"a": layout}, use_bin_type=True)
        back = codec.decode(codec.encode({"a": array}), codec.REPLY_LIMITS)["a"]
        assert back.dtype == array.dtype and np.array_equal(back, array)
