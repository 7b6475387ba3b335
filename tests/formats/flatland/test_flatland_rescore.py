"""``arbiter rescore`` for Flatland (docs/formats/flatland.md): each episode's normalized return and
arrived fraction derived again from its raw fields, under either rule."""

from __future__ import annotations

import pytest

from arbiter.server.formats.flatland.rescore import rederived_records
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020


def raw(**fields):
    """A record's raw fields (the worked episode: 2 agents, 22 steps, reward −31, one arrived),
    with derived figures that are wrong on purpose: rescoring must not read them."""
    record = {"test": "Test_0", "reward": -31.0, "max_episode_steps": 22, "num_agents": 2, "arrived": 1,
              "timed_out": False, "abandoned": False, "skipped": False,
              "normalized_return": 123.0, "arrived_fraction": 9.0}  # fmt: skip
    return {**record, **fields}


def figures(rule, record):
    [rederived] = rederived_records(rule, [record])
    return rederived["normalized_return"], rederived["arrived_fraction"]


def test_a_finished_episode_is_derived_again_under_each_rule():
    assert figures(NeurIPS2020(), raw()) == (-31 / 44, 0.5)
    normalized, arrived = figures(Flatland3(), raw())
    assert normalized == pytest.approx(1 - 31 / 44) and arrived == 0.5


@pytest.mark.parametrize("ending", ["timed_out", "abandoned", "skipped"])
def test_an_episode_that_did_not_finish_scores_the_rules_worst(ending):
    assert figures(NeurIPS2020(), raw(**{ending: True})) == (-1.0, 0.5)
    assert figures(Flatland3(), raw(**{ending: True})) == (0.0, 0.0)


def test_an_unplayed_episode_without_agents_or_steps_still_rescores():
    unplayed = raw(skipped=True, num_agents=None, max_episode_steps=None, reward=0.0, arrived=0)
    assert figures(NeurIPS2020(), unplayed) == (-1.0, 0.0)


def test_the_records_are_copies_with_every_other_field_kept():
    record = raw()
    [rederived] = rederived_records(NeurIPS2020(), [record])
    assert record["normalized_return"] == 123.0  # the input is left alone
    assert {k: v for k, v in rederived.items() if k not in ("normalized_return", "arrived_fraction")} == {
        k: v for k, v in record.items() if k not in ("normalized_return", "arrived_fraction")
    }
