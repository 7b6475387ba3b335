"""protocol/legacy/pickle_scan.py: the opcode scan that every pickled request passes before any of
it is loaded. Plain data and numpy arrays of every accepted protocol pass; every opcode outside
that set, and every length or memo index that does not fit the pickle, is refused with a reason.
(What the restricted unpickler then does is in tests/protocol/test_safe_pickle.py.)
"""

from __future__ import annotations

import pickle
import struct
from collections import OrderedDict

import numpy as np
import pytest

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError
from arbiter.protocol.legacy.pickle_scan import PROTOCOLS, is_pickle, scan

REQUEST = {
    "type": "FLATLAND_RL.ENV_STEP",
    "payload": {"action": {0: 2, 1: 4}, "inference_time": 0.01, "flags": [True, False, None], "raw": b"\x00\x01"},
    "response_channel": "flatland-rl::T12345::response::" + "a" * 32,
    "timestamp": 1.5e9,
    "big": 2**80,
    "pair": (1, "two"),
}


class Point:
    def __init__(self, x: int):
        self.x = x


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_plain_data_passes_in_every_accepted_protocol(protocol):
    scan(pickle.dumps(REQUEST, protocol=protocol))


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_numpy_arrays_and_scalars_pass(protocol):
    scan(pickle.dumps({"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "n": np.int64(3)}, protocol=protocol))


def test_only_protocols_two_to_five_are_pickles_here():
    assert list(PROTOCOLS) == [2, 3, 4, 5]
    for protocol in (0, 1):
        data = pickle.dumps(REQUEST, protocol=protocol)
        assert not is_pickle(data)
        with pytest.raises(DecodeError, match="not a pickle of protocol 2 or later"):
            scan(data)
    with pytest.raises(DecodeError, match="pickle protocol 6 is not accepted"):
        scan(b"\x80\x06N.")


def test_no_msgpack_request_is_taken_for_a_pickle():
    assert not is_pickle(codec.encode({}))  # the one msgpack message that starts with 0x80
    assert not is_pickle(codec.encode({"type": "FLATLAND_RL.PING", "payload": {}}))
    assert is_pickle(pickle.dumps({}, protocol=2))


@pytest.mark.parametrize(
    ("value", "opcode"),
    [
        (Point(1), "NEWOBJ"),
        ({1, 2}, "EMPTY_SET"),
        (frozenset({1}), "FROZENSET"),
        (OrderedDict(a=1), None),  # a class reduced by a callable: REDUCE of a GLOBAL passes the scan
    ],
)
def test_opcodes_outside_plain_data_are_refused_by_name(value, opcode):
    data = pickle.dumps(value, protocol=4)
    if opcode is None:
        scan(data)  # the restricted unpickler decides which globals may load
        return
    with pytest.raises(DecodeError, match=f"pickle opcode {opcode} is not accepted"):
        scan(data)


def test_out_of_band_buffers_are_refused():
    data = pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=lambda buffer: False)
    with pytest.raises(DecodeError, match="NEXT_BUFFER"):
        scan(data)


def test_a_pickle_without_its_stop_is_truncated():
    with pytest.raises(DecodeError, match="truncated pickle: no STOP"):
        scan(pickle.dumps(REQUEST, protocol=2)[:-1])  # protocol 2 has no frame to tell first
    with pytest.raises(DecodeError, match=r"frame claims \d+ bytes with \d+ left"):
        scan(pickle.dumps(REQUEST, protocol=4)[:-1])


def test_bytes_after_the_stop_are_refused():
    with pytest.raises(DecodeError, match="3 bytes of trailing data"):
        scan(pickle.dumps(REQUEST, protocol=4) + b"xyz")


def test_a_length_that_runs_past_the_end_is_refused():
    # BINUNICODE claiming a gigabyte, then STOP.
    data = b"\x80\x04X" + struct.pack("<I", 2**30) + b"abc."
    with pytest.raises(DecodeError, match="runs past its end"):
        scan(data)


def test_a_frame_larger_than_the_pickle_is_refused():
    data = b"\x80\x04\x95" + struct.pack("<Q", 10**9) + b"N."
    with pytest.raises(DecodeError, match=r"frame claims 1000000000 bytes with 2 left"):
        scan(data)


def test_a_memo_index_beyond_the_pickles_size_is_refused():
    data = b"\x80\x04N" + b"r" + struct.pack("<I", 2**31) + b"."  # LONG_BINPUT at a huge index
    with pytest.raises(DecodeError, match="memo index"):
        scan(data)


def test_an_unterminated_global_name_is_refused():
    data = b"\x80\x02c" + b"m" * 300
    with pytest.raises(DecodeError, match="GLOBAL name"):
        scan(data)
