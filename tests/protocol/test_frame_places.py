"""protocol/large_arrays.py and the evaluator's writer for an observation space
(protocol/shared_frames.py): each large array the space declares has a place of its own in every
slot, reached by its path (Dict keys, Tuple indices); an observation that does not hold it as
declared is searched instead, and the env's own observation is never changed. Over real sealed
memory files, read back through the codec with the client's reader."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from harness import sealed_memory_files

from arbiter.protocol import codec
from arbiter.protocol.large_arrays import LargeArray, large_arrays
from arbiter.protocol.shared_frames import PLACEHOLDER_KEY, SharedFramesReader, SharedFramesWriter

pytestmark = pytest.mark.skipif(not sealed_memory_files(), reason="no sealed memory files (memfd) here")

FRAME = spaces.Box(0, 255, (96, 128, 3), np.uint8)
DEPTH = spaces.Box(0.0, 1.0, (64, 64), np.float32)
NESTED = spaces.Dict(
    {
        "views": spaces.Tuple((FRAME, spaces.Box(0, 255, (48, 64, 1), np.uint8), DEPTH)),  # the middle one: small
        "player": spaces.Dict({"health": spaces.Box(0, 100, (1,), np.int16), "side": spaces.Discrete(2)}),
        "map": spaces.Box(-1, 1, (32, 32, 4), np.int32),
    }
)


def seeded(space: gymnasium.Space, seed: int) -> Any:
    space.seed(seed)
    return space.sample()


def on_the_wire(reply: dict[str, Any]) -> dict[str, Any]:
    return codec.decode(codec.encode(reply), codec.REPLY_LIMITS)


def assert_same(got: Any, expected: Any) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b)
    else:
        assert got == expected


def placeholders(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], list[int]]:
    """Where a shared reply's placeholders are, and the bytes each names."""
    if isinstance(value, dict) and PLACEHOLDER_KEY in value:
        return {path: list(value[PLACEHOLDER_KEY])}
    members = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    found: dict[tuple[Any, ...], list[int]] = {}
    for key, member in members:
        found.update(placeholders(member, (*path, key)))
    return found


@pytest.fixture
def nested():
    writer = SharedFramesWriter.for_space(NESTED)
    reader = SharedFramesReader(writer.offer())
    yield writer, reader
    reader.close()
    writer.close()


def test_the_large_arrays_of_a_space_are_found_by_their_paths():
    assert large_arrays(NESTED) == [  # in the space's order (gymnasium sorts a Dict's keys)
        LargeArray(("map",), np.dtype(np.int32), (32, 32, 4)),
        LargeArray(("views", 0), np.dtype(np.uint8), (96, 128, 3)),
        LargeArray(("views", 2), np.dtype(np.float32), (64, 64)),
    ]
    assert large_arrays(FRAME) == [LargeArray((), np.dtype(np.uint8), (96, 128, 3))]
    assert SharedFramesWriter.for_space(spaces.Dict({"v": spaces.Box(0, 1, (8,))})) is None  # nothing large


def test_declared_arrays_go_to_their_own_places_in_the_named_slot(nested):
    writer, reader = nested
    got = []
    for k in range(writer.slots - 1):  # every leased slot, each observation held
        slot = reader.ask()
        observation = seeded(NESTED, k)
        sent = writer.share({"observation": observation, "reward": 0.5}, slot)
        places = placeholders(sent["observation"])
        assert sorted(places) == [("map",), ("views", 0), ("views", 2)]
        start = writer.size - (writer.slots - slot) * writer.slot_bytes
        spans = sorted(places.values())
        assert spans[0][0] == start and spans[-1][0] + spans[-1][1] <= start + writer.slot_bytes
        assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # no overlaps
        got.append((reader.restore(on_the_wire(sent)["observation"]), observation))
    for restored, observation in got:  # every slot still holds what was written into it
        assert_same(restored, observation)
        assert not restored["views"][0].flags.owndata  # a view of the segment


def test_the_envs_observation_is_left_as_it_was(nested):
    writer, _ = nested
    observation = seeded(NESTED, 7)
    before = copy.deepcopy(observation)
    members = {key: observation[key] for key in observation}
    views = observation["views"]
    writer.share({"observation": observation}, 2)
    assert observation.keys() == members.keys()
    assert all(observation[key] is member for key, member in members.items())  # the same objects
    assert observation["views"] is views and isinstance(views, tuple)
    assert_same(observation, before)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda o: (o["views"][0][:48],) + o["views"][1:], id="another shape"),
        pytest.param(lambda o: (o["views"][0].astype(np.int16),) + o["views"][1:], id="another dtype"),
        pytest.param(lambda o: list(o["views"][:1]), id="a member missing"),
        pytest.param(lambda o: (o["views"][0].tolist(),) + o["views"][1:], id="not an array"),
    ],
)
def test_an_observation_not_as_declared_is_searched_and_comes_back_equal(nested, change):
    writer, reader = nested
    observation = seeded(NESTED, 11)
    observation["views"] = change(observation)
    sent = writer.share({"observation": observation}, reader.ask())
    assert ("map",) in placeholders(sent["observation"])  # still shared: the search found it
    assert_same(reader.restore(on_the_wire(sent)["observation"]), observation)


def test_an_observation_that_is_one_array_is_replaced_by_its_placeholder():
    writer = SharedFramesWriter.for_space(FRAME)
    reader = SharedFramesReader(writer.offer())
    try:
        frame = seeded(FRAME, 3)
        sent = writer.share({"observation": frame}, reader.ask())
        assert PLACEHOLDER_KEY in sent["observation"]
        assert_same(reader.restore(on_the_wire(sent)["observation"]), frame)
    finally:
        reader.close()
        writer.close()
