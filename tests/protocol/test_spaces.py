"""Spaces on the wire: every supported gymnasium space survives the codec exactly, bad space
descriptions are refused with DecodeError, and the evaluator's action check is exact."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError
from arbiter.protocol.spaces import action_for, as_element, data_bytes, holds_tuple, space_from_wire, space_to_wire

S = gymnasium.spaces

SPACES = [
    S.Box(0, 255, (480, 512, 3), np.uint8),
    S.Box(-np.inf, np.inf, (4,), np.float32),
    S.Box(np.array([-1.0, 0.0]), np.array([1.0, 5.0]), dtype=np.float64),
    S.Box(np.array([0, -3]), np.array([2, 3]), dtype=np.int64),
    S.Box(0.1, 0.7, (2, 2), np.float32),
    S.Discrete(7),
    S.Discrete(3, start=-1),
    S.MultiDiscrete([3, 4, 5]),
    S.MultiBinary(6),
    S.MultiBinary([2, 3]),
    S.Dict({"frame": S.Box(0, 255, (8, 8, 3), np.uint8), "stage": S.Discrete(9), "ram": S.MultiBinary(4)}),
    S.Tuple([S.Discrete(2), S.Box(-1.0, 1.0, (3,), np.float32)]),
]


def through_the_wire(space):
    return space_from_wire(codec.decode(codec.encode(space_to_wire(space)), codec.REPLY_LIMITS))


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_every_supported_space_comes_back_equal(space):
    assert through_the_wire(space) == space


def test_a_uniform_box_travels_as_two_numbers_not_two_arrays():
    frame = S.Box(0, 255, (480, 512, 3), np.uint8)
    assert len(codec.encode(space_to_wire(frame))) < 100  # its full low/high arrays: ~1.5 MB
    mixed = S.Box(np.zeros(1000), np.arange(1, 1001), dtype=np.float64)
    assert len(codec.encode(space_to_wire(mixed))) > 16_000  # bounds that differ travel whole


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"type": 3},
        {"type": "Graph"},
        {"type": "Discrete", "n": 0},
        {"type": "Discrete", "n": "3"},
        {"type": "Box", "low": [0], "high": [1], "dtype": "<f4"},
        {"type": "Box", "low": 0, "high": 1, "shape": "3", "dtype": "<f4"},
        {"type": "Box", "low": "a", "high": 1, "shape": [3], "dtype": "<f4"},
        {"type": "Box", "low": 0, "high": 1, "shape": [3], "dtype": "object"},
        {"type": "MultiBinary", "n": []},
        {"type": "Dict", "spaces": [1]},
        {"type": "Tuple", "spaces": {"a": 1}},
    ],
)
def test_a_bad_space_description_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        space_from_wire(data)


def test_nesting_is_bounded():
    data = {"type": "Discrete", "n": 2}
    for _ in range(64):
        data = {"type": "Tuple", "spaces": [data]}
    with pytest.raises(DecodeError, match="nested"):
        space_from_wire(data)


def test_actions_are_checked_exactly_against_the_space():
    discrete = S.Discrete(3)
    assert action_for(discrete, 2) == 2 and action_for(discrete, np.int32(1)) == 1
    assert action_for(discrete, np.array(2)) == 2
    for bad in (3, -1, True, 1.0, "1", None, [1]):
        assert action_for(discrete, bad) is None
    box = S.Box(-1.0, 1.0, (2,), np.float32)
    assert np.array_equal(action_for(box, [0.5, -0.5]), np.array([0.5, -0.5], dtype=np.float32))
    for bad in ([2.0, 0.0], [0.0], "ab", [[0.0, 0.0]], [float("nan"), 0.0]):
        assert action_for(box, bad) is None
    multi = S.MultiDiscrete([3, 2])
    assert action_for(multi, [2, 1]).tolist() == [2, 1]
    assert action_for(multi, [2.5, 1]) is None and action_for(multi, [3, 0]) is None
    combined = S.Dict({"move": S.Discrete(9), "attack": S.Discrete(4)})
    assert action_for(combined, {"move": 8, "attack": 0}) == {"move": 8, "attack": 0}
    assert action_for(combined, {"move": 8}) is None and action_for(combined, {"move": 9, "attack": 0}) is None


@settings(max_examples=400, deadline=None)
@given(
    counts=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    starts=st.lists(st.integers(-5, 250), min_size=4, max_size=4),
    dtype=st.sampled_from([np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint64]),
    action=st.lists(
        st.one_of(
            st.integers(-8, 260),
            st.sampled_from([2**8 + 1, 2**16 + 1, 2**32 + 1, 2**63 - 1, 2**64 - 1, -(2**63)]),
            st.booleans(),
            st.floats(-3, 300),
        ),
        max_size=5,
    ),
)
@example(counts=[3], starts=[0, 0, 0, 0], dtype=np.int8, action=[257])
@example(counts=[3], starts=[-2, 0, 0, 0], dtype=np.int64, action=[2**64 - 1])
@example(counts=[3], starts=[253, 0, 0, 0], dtype=np.uint8, action=[-1])
@example(counts=[3], starts=[0, 0, 0, 0], dtype=np.int64, action=[True])
def test_a_list_action_on_a_multi_discrete_space_is_decided_as_the_general_path_decides_it(
    counts, starts, dtype, action
):
    # A list of ints takes a shortcut past numpy; a tuple of the same values takes the general path.
    # Both refuse a value outside the space, including one that would wrap around in the dtype.
    info = np.iinfo(dtype)
    assume(all(info.min <= s and s + n - 1 <= info.max for s, n in zip(starts, counts, strict=False)))
    space = S.MultiDiscrete(counts, dtype=dtype, start=starts[: len(counts)])
    fast, general = action_for(space, list(action)), action_for(space, tuple(action))
    in_space = len(action) == len(counts) and all(
        float(v).is_integer() and s <= v < s + n  # True and 2.0 count as 1 and 2, as numpy reads them
        for v, s, n in zip(action, starts, counts, strict=False)
    )
    assert (general is not None) == in_space
    if general is None:
        assert fast is None
    else:
        assert fast is not None and fast.dtype == general.dtype and fast.tolist() == general.tolist()
        assert space.contains(fast) and fast.tolist() == [int(v) for v in action]


def test_an_integer_that_would_wrap_around_in_the_spaces_dtype_is_refused():
    assert action_for(S.Box(-5, 10, (1,), np.int64), [2**64 - 1]) is None  # not -1
    assert action_for(S.Box(0, 3, (1,), np.int8), (257,)) is None  # not 1
    assert action_for(S.Box(0, 3, (1,), np.int8), [2.0]).tolist() == [2]  # integral floats still count
    assert action_for(S.Box(-1.0, 1.0, (1,), np.float32), [0.1]) is not None  # a float space: no check


def test_data_bytes_counts_the_array_data_of_one_element():
    frame = gymnasium.spaces.Box(0, 255, (480, 512, 3), np.uint8)
    assert data_bytes(frame) == 480 * 512 * 3 == frame.sample().nbytes
    nested = gymnasium.spaces.Dict(
        {
            "frame": gymnasium.spaces.Box(0, 255, (128, 128, 1), np.uint8),
            "stage": gymnasium.spaces.Discrete(8),
            "moves": gymnasium.spaces.Tuple((gymnasium.spaces.MultiDiscrete([3, 4]), gymnasium.spaces.MultiBinary(5))),
        }
    )
    sample = nested.sample()
    assert data_bytes(nested) == (
        sample["frame"].nbytes
        + np.asarray(sample["stage"]).nbytes
        + sample["moves"][0].nbytes
        + sample["moves"][1].nbytes
    )


def test_a_tuple_decoded_as_a_list_is_a_tuple_again_wherever_it_sits():
    space = S.Dict(
        {"hand": S.Tuple([S.Discrete(32), S.Tuple([S.Discrete(2), S.Discrete(2)])]), "box": S.Box(0, 1, (2,))}
    )
    assert holds_tuple(space) and not holds_tuple(S.Dict({"box": S.Box(0, 1, (2,))}))
    value = {"hand": [16, [1, 0]], "box": [0.5, 0.5]}
    assert as_element(space, value) == {"hand": (16, (1, 0)), "box": [0.5, 0.5]}
    # Not an element (a wrong length, a stranger key): left as it came, for the agent to see.
    assert as_element(space, {"hand": [16], "other": [1]}) == {"hand": [16], "other": [1]}
