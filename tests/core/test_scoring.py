"""server/core/scoring.py: the spread of a figure (standard deviation, bootstrap interval) and the
lookup of a format's scoring rules. Each format's own rules are tested with the format."""

from __future__ import annotations

import statistics

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.scoring import scoring_rule, spread
from arbiter.server.formats import format_names, get_format


def test_no_values_have_no_spread():
    assert spread([]) == {"n": 0, "std": None, "ci95": None}


def test_fewer_than_ten_values_have_a_deviation_but_no_interval():
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
    found = spread(values)
    assert found["n"] == 9 and found["ci95"] is None
    assert found["std"] == pytest.approx(statistics.pstdev(values))


def test_ten_values_get_a_bootstrap_interval_around_their_mean():
    values = [float(v) for v in range(10)]
    low, high = spread(values)["ci95"]
    assert min(values) <= low < statistics.fmean(values) < high <= max(values)


def test_the_interval_is_reproducible_and_depends_on_its_seed():
    values = [((7 * v) % 13) / 3 for v in range(30)]
    assert spread(values)["ci95"] == spread(list(values))["ci95"]
    assert spread(values, seed=1)["ci95"] != spread(values, seed=2)["ci95"]


def test_equal_values_have_no_spread_at_all():
    found = spread([0.5] * 12)
    assert found["std"] == 0.0 and found["ci95"] == [0.5, 0.5]


@pytest.mark.parametrize("format_name", format_names())
def test_every_format_has_a_default_rule_that_is_looked_up_without_a_name(format_name):
    rule = scoring_rule(format_name)
    assert rule.name == get_format(format_name).default_rule
    assert isinstance(rule.higher_is_better, bool)


@pytest.mark.parametrize("format_name", format_names())
def test_every_rule_a_format_lists_is_found_by_its_name(format_name):
    for name in get_format(format_name).rules:
        assert scoring_rule(format_name, name).name == name


def test_an_unknown_rule_names_the_format_and_its_rules():
    with pytest.raises(ConfigError, match=r"unknown scoring rule 'fastest' for format 'two-phase'; known: two-phase"):
        scoring_rule("two-phase", "fastest")
