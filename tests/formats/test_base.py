"""The helpers base.py gives every format (docs/adding-a-format.md): reset seeds, plain wire data,
a Gymnasium step's reply, JSON-safe figures, an item's default records and endings, and what a
plan names as evaluated on."""

from __future__ import annotations

import hashlib
import hmac
import math
from types import SimpleNamespace

import numpy as np
import pytest

from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.core.summary import ENDINGS, FINISHED
from arbiter.server.formats.base import Item, OpenItem, Plan, finite, plain, reset_seed, step_reply


def test_reset_seeds_are_a_hash_of_the_path_keyed_with_the_base():
    """HMAC-SHA256 under the base: the seeds an agent learns as its episodes end tell it nothing
    of the ones to come unless it searches every base."""
    expected = int.from_bytes(hmac.new(b"1001", b"2:2,3", hashlib.sha256).digest()[:4], "big")
    assert reset_seed(1001, 2, 3) == expected
    # Paths that differ only by trailing zeros, or a large base against a small one with a path,
    # are different places.
    assert len({reset_seed(1001), reset_seed(1001, 0), reset_seed(1001, 0, 0)}) == 3
    assert reset_seed(2**32 + 5) != reset_seed(5, 1)
    assert reset_seed(None, 2, 3) is None
    seeds = {reset_seed(1001, run, episode) for run in range(4) for episode in range(25)}
    assert len(seeds) == 100  # independent places give distinct seeds
    assert reset_seed(1001, 1, 0) != reset_seed(1002, 1, 0)
    assert all(0 <= seed < 2**32 for seed in seeds)


def test_plain_keeps_wire_data_and_turns_the_rest_into_repr():
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    info = {
        "count": np.int64(3),
        "ok": np.bool_(True),
        "frame": np.zeros((2, 2), dtype=np.uint8),
        "names": np.array(["a", "b"]),
        (1, 2): "tuple key",
        "nested": ({"thing": Opaque()},),
    }
    made = plain(info)
    assert made["count"] == 3 and type(made["count"]) is int
    assert made["ok"] is True
    assert isinstance(made["frame"], np.ndarray)  # numeric arrays travel as arrays
    assert made["names"] == ["a", "b"]
    assert made["(1, 2)"] == "tuple key"
    assert made["nested"] == [{"thing": "<opaque>"}]


def test_a_step_reply_carries_the_step_the_place_and_the_extension():
    observation = np.ones(3)
    reply = step_reply((observation, 1.5, True, False, {"lives": np.int32(2)}), done=True, step=7, invalid=1,
                       stage_over=True, seed=5)  # fmt: skip
    assert reply["observation"] is observation
    assert (reply["reward"], reply["terminated"], reply["truncated"]) == (1.5, True, False)
    assert reply["info"] == {"lives": 2}
    assert (reply["done"], reply["step"], reply["invalid_actions"]) == (True, 7, 1)
    assert reply[EXTENSION_KEY] == {"stage_over": True, "seed": 5}
    given = step_reply((observation, 0.0, False, False, {"x": 1}), done=False, step=1, invalid=0, info={"y": 2})
    assert given["info"] == {"y": 2}


def test_figures_json_cannot_hold_become_null():
    assert finite(-0.25) == -0.25
    assert finite(math.inf) is None and finite(-math.inf) is None and finite(math.nan) is None


class CountingItem(OpenItem):
    """The smallest item a format can write: it ends after two steps."""

    def create_payload(self):
        return {"observation": 0}

    def step(self, action):
        self.steps += 1
        self.over = self.steps >= 2
        return self.over


def test_an_items_default_records_carry_its_fields_and_say_how_it_ended():
    opened = CountingItem(Item(index=0, unit="u0", fields={"episode": 0}))
    assert opened.sanitize("anything") == ("anything", 0)
    assert opened.step(None) is False
    assert opened.step_reply(0) == {
        "done": False,
        "step": 1,
        "invalid_actions": 0,
        EXTENSION_KEY: {"stage_over": False},
    }
    assert opened.step(None) is True
    finished = opened.records(finished=True, timeout=None, abandoned=False)
    assert finished == [{"episode": 0, "ended": FINISHED}]
    cut = opened.records(finished=False, timeout="step", abandoned=False)
    assert cut[0]["ended"] in ENDINGS and cut[0]["ended"] != FINISHED
    with pytest.raises(TypeError, match="does not span resets"):
        opened.next_reset()


class FolderPlan(Plan):
    def make_items(self) -> list[Item]:
        return [Item(index=0, unit="episode/0")]

    def open(self, item: Item) -> OpenItem:
        raise NotImplementedError  # never played here


def test_a_plan_names_the_test_folder_it_reads_as_what_it_evaluates_on(tmp_path):
    """summary.json's `tests` and the start line say what a plan was evaluated on (Plan.source)."""
    spec = SimpleNamespace(options=None, seed=1)
    assert FolderPlan(spec, None, tests=str(tmp_path)).source == str(tmp_path)
    assert FolderPlan(spec, None).source is None

    class Named(FolderPlan):
        source = "CartPole-v1"

    assert Named(spec, None, tests=str(tmp_path)).source == "CartPole-v1"
