"""protocol/shared_frames.py, the agent's slots: an observation's large arrays are views of the
slot its request named, held for as long as anything references them; the slot is named again
only once they are gone, or once a later reply shows the evaluator is done with it. Driven with
the evaluator's writer and the agent's reader over a real sealed memory file, the way RemoteEnv
and the evaluator call them (ask, share into the named slot, restore)."""

from __future__ import annotations

import gc
import random
from typing import Any

import gymnasium
import numpy as np
import pytest
from harness import sealed_memory_files

from arbiter.protocol import codec
from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.shared_frames import (
    COPY_SLOT,
    MOST_SEGMENT_BYTES,
    MOST_SLOTS,
    SHARED,
    SharedFramesReader,
    SharedFramesWriter,
    slots_for,
)

FRAME_BYTES = 96 * 128 * 3
SPACE = gymnasium.spaces.Dict(
    {
        "frame": gymnasium.spaces.Box(0, 255, (96, 128, 3), np.uint8),
        "depth": gymnasium.spaces.Box(0.0, 1e9, (64, 64), np.float32),
        "health": gymnasium.spaces.Box(-(2**15), 2**15 - 1, (1,), np.int16),
    }
)


pytestmark = pytest.mark.skipif(not sealed_memory_files(), reason="no sealed memory files (memfd) here")


def observation(k: int) -> dict[str, Any]:
    """A frame and a second large array, each filled from ``k``, and a small array (inline)."""
    return {
        "frame": np.full((96, 128, 3), k % 251, dtype=np.uint8),
        "depth": np.full((64, 64), k, dtype=np.float32),
        "health": np.array([k], dtype=np.int16),
    }


@pytest.fixture(params=["searched", "declared"])
def segment(request):
    """A writer that searches each observation for large arrays, or one that knows from the
    observation space where they are."""
    if request.param == "declared":
        writer = SharedFramesWriter.for_space(SPACE)
    else:
        writer = SharedFramesWriter(FRAME_BYTES + 64 * 64 * 4)
    reader = SharedFramesReader(writer.offer())
    yield writer, reader
    reader.close()
    writer.close()


def step(writer: SharedFramesWriter, reader: SharedFramesReader, k: int) -> dict[str, Any]:
    """One request and its reply: the agent names a slot, the evaluator writes into it."""
    slot = reader.ask()
    payload = {"observation": observation(k)}
    sent = writer.share(payload, slot) if slot is not None else payload
    return reader.restore(codec.decode(codec.encode(sent), codec.REPLY_LIMITS)["observation"])


def test_the_segment_has_as_many_slots_as_fit():
    assert slots_for(FRAME_BYTES) == MOST_SLOTS
    assert slots_for(MOST_SEGMENT_BYTES // 3) == 3
    assert slots_for(MOST_SEGMENT_BYTES) == 2  # never fewer than an older agent's alternation


def test_observations_are_writable_views_that_stay_as_they_came_while_held(segment):
    writer, reader = segment
    assert reader.leasing and reader.slots == writer.slots == MOST_SLOTS
    chance = random.Random(5)
    held: dict[int, dict[str, Any]] = {}
    for k in range(60):
        got = step(writer, reader, k)
        assert not got["frame"].flags.owndata and got["frame"].flags.writeable  # a view, not a copy
        assert got["health"].flags.owndata  # small arrays come inline
        if chance.random() < 0.3 or k < 3:
            held[k] = got
        if len(held) > 4:
            del held[chance.choice(sorted(held))]
    for k, got in held.items():
        for key, array in observation(k).items():
            assert np.array_equal(got[key], array), (k, key)
    first, second = (held[k] for k in sorted(held)[:2])
    first["frame"][:] = 0  # the agent's own: its other observations do not change
    assert second["frame"].any()


def test_a_slot_is_named_again_once_the_last_view_of_it_is_gone(segment):
    writer, reader = segment
    got = step(writer, reader, 1)
    corner = got["frame"][:8, :8]  # a view of the view keeps the slot
    taken = set(range(1, reader.slots)) - set(reader._free)
    assert len(taken) == 1
    del got
    gc.collect()
    assert set(range(1, reader.slots)) - set(reader._free) == taken
    del corner
    gc.collect()
    assert sorted(reader._free) == list(range(1, reader.slots))
    assert reader.ask() == taken.pop()  # the most recently freed first


def test_more_observations_than_slots_come_as_copies_then_inline(segment):
    writer, reader = segment
    held = [step(writer, reader, k) for k in range(reader.slots - 1)]  # every leased slot
    assert all(not o["frame"].flags.owndata for o in held)
    copied = step(writer, reader, 100)  # the copy slot
    assert copied["frame"].flags.owndata and np.array_equal(copied["frame"], observation(100)["frame"])
    assert reader.ask() == COPY_SLOT
    writer.share({"observation": observation(101)}, COPY_SLOT)  # its reply is lost ...
    assert reader.ask() is None  # ... so no slot is free: ask for the arrays inline
    inline = reader.restore(observation(102))
    assert np.array_equal(inline["frame"], observation(102)["frame"])
    assert np.array_equal(copied["frame"], observation(100)["frame"])  # untouched by the later write
    for k, o in enumerate(held):
        assert np.array_equal(o["depth"], observation(k)["depth"])
    assert reader.ask() == COPY_SLOT  # a reply came: the copy slot is settled


def test_a_slot_whose_request_got_no_reply_waits_for_a_later_reply(segment):
    writer, reader = segment
    lost = reader.ask()  # its request fails (a timeout, a lost connection): no reply, no restore
    answered = reader.ask()
    assert answered != lost and lost not in reader._free  # the evaluator may still write it
    reader.restore(writer.share({"observation": observation(3)}, answered)["observation"])
    assert lost in reader._free  # a later reply: the evaluator is done with the earlier request


def test_an_older_evaluators_segment_is_copied_out_of_alternating_slots(segment):
    writer, _ = segment
    offer = {k: v for k, v in writer.offer().items() if k not in ("slots", "slot_bytes")}
    reader = SharedFramesReader(offer)
    try:
        assert not reader.leasing and reader.ask() == SHARED
        first = reader.restore(writer.share({"observation": observation(1)})["observation"])
        second = reader.restore(writer.share({"observation": observation(2)})["observation"])
        third = reader.restore(writer.share({"observation": observation(3)})["observation"])  # first's slot
        assert first["frame"].flags.owndata and np.array_equal(first["frame"], observation(1)["frame"])
        assert np.array_equal(second["depth"], observation(2)["depth"])
        assert np.array_equal(third["depth"], observation(3)["depth"])
    finally:
        reader.close()


@pytest.mark.parametrize("layout", [{"slots": 1}, {"slot_bytes": 100}, {"slots": 10_000}, {"slot_bytes": 0}])
def test_a_slot_layout_that_does_not_fit_the_segment_is_refused(segment, layout):
    writer, _ = segment
    offer = {**writer.offer(), **layout}
    with pytest.raises(ArbiterError, match="malformed shared frames offer"):
        SharedFramesReader(offer)


def test_held_observations_outlive_the_readers_close(segment):
    writer, reader = segment
    got = step(writer, reader, 9)
    reader.close()  # the mapping goes with the last view
    assert np.array_equal(got["frame"], observation(9)["frame"])
    got["frame"][0, 0, 0] = 1
