"""server/core/words.py: how arbiter counts things in the lines people read (progress lines,
termination causes): items in each format's words, and plurals."""

from __future__ import annotations

import pytest

from arbiter.server.core.competition import load_competition
from arbiter.server.core.words import count_items, item_noun, plural
from arbiter.server.formats import format_names, get_format


def test_items_are_named_in_their_formats_words():
    assert count_items(1, "flatland") == "1 episode" and count_items(3, "flatland") == "3 episodes"
    assert count_items(1, "metalc") == "1 dataset" and count_items(6, "metalc") == "6 datasets"
    assert count_items(1, "two-phase") == "1 episode or training run"
    assert count_items(2, "two-phase") == "2 episodes and training runs"
    # a plan that holds one kind of item names it (Plan.item_nouns): two-phase's phase 1 alone
    assert count_items(2, "two-phase", ("episode", "episodes")) == "2 episodes"
    assert count_items(1, "two-phase", ["episode", "episodes"]) == "1 episode"


def test_a_two_phase_plan_names_its_items_by_what_it_holds():
    both, phase1 = load_competition("two-phase-cartpole"), load_competition("two-phase-cartpole", phase=1)
    plans = [get_format("two-phase").make_plan(spec, None) for spec in (both, phase1)]
    try:
        assert [plan.item_nouns for plan in plans] == [
            ("episode or training run", "episodes and training runs"), ("episode", "episodes")
        ]  # fmt: skip
        phase2 = get_format("two-phase").make_plan(load_competition("two-phase-cartpole", phase=2), None)
        assert phase2.item_nouns == plans[0].item_nouns  # training runs and their evaluation episodes
        phase2.close()
    finally:
        for plan in plans:
            plan.close()


@pytest.mark.parametrize("format_name", [None, "", "a format arbiter does not know"])
def test_a_format_not_named_plays_episodes(format_name):
    assert item_noun(1, format_name) == "episode" and item_noun(0, format_name) == "episodes"


@pytest.mark.parametrize("format_name", format_names())
def test_every_format_has_a_singular_and_a_plural(format_name):
    assert item_noun(1, format_name) != item_noun(2, format_name)


def test_plural_takes_an_irregular_plural():
    assert plural(1, "step") == "1 step" and plural(0, "step") == "0 steps"
    assert plural(2, "fold", "folds of the meta-dataset") == "2 folds of the meta-dataset"
